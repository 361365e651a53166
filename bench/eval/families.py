"""The five original task families (and the four agent families of agent_families.py), each generated from a seed (no network), every answer checkable.

Each episode is ``Size.sub_goals`` sub-goals of ``Size.steps`` tool steps: the last step of a sub-goal
states its result (a natural boundary, a good moment to compact); the steps before it are long stretches
of tool output inside the sub-goal (bad moments).  The questions at the end need the early results.
"""
from __future__ import annotations

import random
from typing import Callable, Dict

from .episode import Episode, Fact, Question, Size, Step, tool

SYSTEM = ("You are a careful agent working through a long task with tools. Keep track of every result you "
          "establish: you will be asked about them at the end. When asked a question, reply with the exact "
          "value only.")
VENDORS = ["Acme", "Borealis", "Cobalt", "Dynamo", "Elm & Co", "Fjord", "Granite", "Halcyon", "Ion", "Juniper"]
WORDS = ["Orion", "Vega", "Lyra", "Cygnus", "Draco", "Pavo", "Tucana", "Hydra", "Aquila", "Corvus", "Lupus"]
ASK = " Reply with the value only."


def _code(rng: random.Random) -> str:
    return f"{rng.choice('BCDFGHJKLMNPQRSTVWXZ')}{rng.choice('BCDFGHJKLMNPQRSTVWXZ')}-{rng.randint(1000, 9999)}"


def _steps(n_goals: int, n_steps: int, make_step) -> list:
    out = []
    for g in range(n_goals):
        for j in range(n_steps):
            s = make_step(g, j, j == n_steps - 1)
            s.subgoal, s.opens, s.closes = g, j == 0, j == n_steps - 1
            out.append(s)
    return out


def _early_questions(results, make_q, n_goals):
    """Questions on the early sub-goals (all but the last), and one on the last as a control."""
    early = [make_q(g, results[g], True) for g in range(max(1, min(3, n_goals - 1)))]
    return early + [make_q(n_goals - 1, results[n_goals - 1], False)]


def ledger(seed: int, size: Size) -> Episode:
    rng = random.Random(f"ledger-{seed}")
    accounts = [f"ACC-{n}" for n in rng.sample(range(1000, 9999), size.sub_goals)]
    txs = {a: [round(rng.uniform(-900, 900), 2) for _ in range((size.steps - 1) * size.rows)] for a in accounts}
    totals = [f"{sum(txs[a]):.2f}" for a in accounts]

    def step(g, j, closes):
        a = accounts[g]
        if closes:
            return Step(g, "settle", {"account": a}, f"Account {a} reconciled: {len(txs[a])} transactions. "
                        f"Settled total: {totals[g]}")
        rows = [f"tx {a}-{j * size.rows + k:03d} 2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
                f"{txs[a][j * size.rows + k]:+.2f} {rng.choice(VENDORS)}" for k in range(size.rows)]
        user = f"Sub-goal {g + 1}: reconcile account {a}, page by page, then settle it." if j == 0 else None
        return Step(g, "list_transactions", {"account": a, "page": j + 1}, "\n".join(rows), user)

    steps = _steps(size.sub_goals, size.steps, step)
    return Episode("ledger", seed, SYSTEM, f"Reconcile the accounts {', '.join(accounts)} one by one and note "
                   "each settled total.", [tool("list_transactions", "List one page of an account's "
                                                "transactions.", account="string", page="integer"),
                                           tool("settle", "Settle an account and get its total.", account="string")],
                   steps, _early_questions(totals, lambda g, v, e: Question(
                       f"What was the settled total of account {accounts[g]}?" + ASK, v, e), size.sub_goals),
                   [Fact(i, s.output.rsplit(" ", 1)[1]) for i, s in enumerate(steps) if s.closes])


def search(seed: int, size: Size) -> Episode:
    rng = random.Random(f"search-{seed}")
    names = [f"{w}-{rng.randint(2, 99)}" for w in rng.sample(WORDS, size.sub_goals)]
    codes = [_code(rng) for _ in names]

    def step(g, j, closes):
        n = names[g]
        if closes:
            return Step(g, "verify", {"project": n}, f"Registry check passed. The verified launch code of {n} "
                        f"is {codes[g]}")
        docs = []
        for k in range(size.rows):
            other = rng.choice(WORDS) + f"-{rng.randint(2, 99)}"
            subj = n if rng.random() < 0.4 else other
            docs.append(f"Doc {j * size.rows + k + 1} ({rng.choice(['forum', 'wiki', 'blog', 'mirror'])}, "
                        f"unverified): the launch code of {subj} might be {_code(rng)}.")
        user = f"Sub-goal {g + 1}: find the verified launch code of project {n}." if j == 0 else None
        return Step(g, "search", {"query": f"{n} launch code", "page": j + 1}, "\n".join(docs), user)

    steps = _steps(size.sub_goals, size.steps, step)
    return Episode("search", seed, SYSTEM, f"Find the verified launch codes of the projects {', '.join(names)}. "
                   "Search results contain unverified distractors; only the registry check counts.",
                   [tool("search", "Search documents.", query="string", page="integer"),
                    tool("verify", "Check a project's launch code in the registry.", project="string")],
                   steps, _early_questions(codes, lambda g, v, e: Question(
                       f"What is the verified launch code of project {names[g]}?" + ASK, v, e), size.sub_goals),
                   [Fact(i, codes[s.subgoal]) for i, s in enumerate(steps) if s.closes])


def code(seed: int, size: Size) -> Episode:
    rng = random.Random(f"code-{seed}")
    funcs = [f"{v}_{o}" for v, o in zip(rng.sample(["load", "parse", "fetch", "merge", "scan", "emit", "sync"],
                                                   size.sub_goals), rng.sample(
        ["rows", "batch", "index", "cache", "queue", "report", "ledger"], size.sub_goals))]
    consts = [rng.choice(["RETRY_LIMIT", "BATCH_SIZE", "TIMEOUT_MS", "MAX_DEPTH"]) for _ in funcs]
    path = f"src/{rng.choice(['engine', 'worker', 'store'])}.py"
    finals = []

    def step(g, j, closes):
        f, c = funcs[g], consts[g]
        if closes:
            finals.append(str(rng.randint(100, 999)))
            return Step(g, "run_tests", {"path": path}, f"All tests passed. Final {f} in {path}: "
                        f"{c} = {finals[-1]}")
        body = [f"def {f}(items):", f"    {c} = {rng.randint(100, 999)}"]
        body += [f"    step_{k} = transform_{k}(items, {c})  # reviewed" for k in range(size.rows - 2)]
        user = f"Sub-goal {g + 1}: rework {f} in {path} as the review asks, then run the tests." if j == 0 else None
        return Step(g, "edit_file", {"path": path, "function": f}, "\n".join(body), user)

    steps = _steps(size.sub_goals, size.steps, step)
    return Episode("code", seed, SYSTEM, f"Rework the functions {', '.join(funcs)} of {path} one by one.",
                   [tool("edit_file", "Edit one function and show it.", path="string", function="string"),
                    tool("run_tests", "Run the tests.", path="string")],
                   steps, _early_questions(finals, lambda g, v, e: Question(
                       f"In the final version of {funcs[g]}, what is {consts[g]} set to?" + ASK, v, e),
                       size.sub_goals),
                   [Fact(i, finals[s.subgoal]) for i, s in enumerate(steps) if s.closes])


def math(seed: int, size: Size) -> Episode:
    rng = random.Random(f"math-{seed}")
    terms = [[(rng.randint(2, 40), rng.randint(2, 9)) for _ in range((size.steps - 1) * size.rows)]
             for _ in range(size.sub_goals)]
    results = [sum(a * b for a, b in t) for t in terms]

    def step(g, j, closes):
        if closes:
            return Step(g, "finish", {"result": f"R{g + 1}"}, f"Checked. R{g + 1} = {results[g]}")
        run = sum(a * b for a, b in terms[g][:j * size.rows])
        rows = []
        for k in range(size.rows):
            a, b = terms[g][j * size.rows + k]
            run += a * b
            rows.append(f"term {j * size.rows + k + 1}: {a} * {b} = {a * b} (running sum {run})")
        user = f"Sub-goal {g + 1}: compute R{g + 1}, the sum of sheet {g + 1}'s products." if j == 0 else None
        return Step(g, "calc", {"sheet": g + 1, "page": j + 1}, "\n".join(rows), user)

    steps = _steps(size.sub_goals, size.steps, step)
    qs = [Question(f"What is R{g + 1}?" + ASK, str(results[g])) for g in range(max(1, min(2, size.sub_goals - 1)))]
    qs.append(Question("What is R1 + R2?" + ASK, str(results[0] + results[min(1, size.sub_goals - 1)])))
    return Episode("math", seed, SYSTEM, f"Compute R1..R{size.sub_goals}, one sheet at a time; at the end "
                   "R1 + R2 is needed.", [tool("calc", "Evaluate one page of a sheet.", sheet="integer",
                                               page="integer"), tool("finish", "Check a result.", result="string")],
                   steps, qs, [Fact(i, str(results[s.subgoal])) for i, s in enumerate(steps) if s.closes])


def instructions(seed: int, size: Size) -> Episode:
    """Issue 12: constraints set in the first user message, a long stretch of tool output, asked at the end."""
    rng = random.Random(f"instructions-{seed}")
    port = str(rng.randint(3000, 9899))
    frozen = f"{rng.choice(['billing', 'ledger', 'payroll', 'auth'])}_{rng.randint(10, 99)}.py"
    prefix = f"{rng.choice(['kvx', 'ops', 'rel', 'zed'])}{rng.randint(1, 9)}-"
    day = rng.choice(["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"])
    services = [f"svc-{w.lower()}" for w in rng.sample(WORDS, size.sub_goals)]

    def step(g, j, closes):
        s = services[g]
        if closes:
            return Step(g, "close_review", {"service": s}, f"Review of {s} closed: {rng.randint(2, 9)} warnings.")
        rows = [f"{rng.randint(10, 23)}:{rng.randint(10, 59)} {s} {rng.choice(['INFO', 'WARN', 'DEBUG'])} "
                f"listening on {rng.choice([8080, 8000, 5000, 3000])}, touched "
                f"{rng.choice(['config.js', 'main.py', 'util.py'])}, branch feature-{rng.randint(1, 99)}"
                for _ in range(size.rows)]
        user = f"Sub-goal {g + 1}: review the logs of {s}." if j == 0 else None
        return Step(g, "read_log", {"service": s, "page": j + 1}, "\n".join(rows), user)

    steps = _steps(size.sub_goals, size.steps, step)
    task = (f"Standing instructions for this whole task: deploy the service on port {port}; never modify "
            f"{frozen}; start every branch name with {prefix}; we ship on {day}. Now review the logs of "
            f"{', '.join(services)} one by one.")
    qs = [Question("Which port must the service be deployed on?" + ASK, port),
          Question("Which file must never be modified?" + ASK, frozen),
          Question("What prefix must every branch name start with?" + ASK, prefix),
          Question("On which day do we ship?" + ASK, day)]
    return Episode("instructions", seed, SYSTEM, task, [tool("read_log", "Read a page of a service's logs.",
                                                             service="string", page="integer"),
                                                        tool("close_review", "Close a review.", service="string")],
                   steps, qs, [Fact(-1, v) for v in (port, frozen, prefix, day)])


from .agent_families import AGENT_FAMILIES  # noqa: E402  (they share SYSTEM and ASK above)

# What was tuned on is reported apart from what was not (issue 33 allows the old families and at most two
# new ones).  The wording of the first five was what the summary's and the probe's heuristics were once fit
# to.  Coding and research were used to shape the recall's evidence rule (compaction/recall.py: which lines
# rival the live context, excerpts of long lines, the recall budget; 2026-12-07).  Nothing was tuned on
# support and data: they are the held-out families.
TUNED_ON = ("ledger", "search", "code", "math", "instructions", "coding", "research")
HELD_OUT_FAMILIES = tuple(f for f in AGENT_FAMILIES if f not in TUNED_ON)
FAMILIES: Dict[str, Callable[[int, Size], Episode]] = {
    "ledger": ledger, "search": search, "code": code, "math": math, "instructions": instructions,
    **AGENT_FAMILIES}
