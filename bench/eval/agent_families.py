"""Four task families shaped like real agent work: a coding agent fixing a repo, a research agent reading
the web, a support agent working a ticket queue, a data agent analysing a warehouse.

Each episode is ``Size.sub_goals`` sub-goals of ``Size.steps`` tool steps whose outputs look like the real
thing (source files, pytest runs, git, JSON, psql tables, pandas reprs, ticket threads, policies, search
results, web pages).  The asked values live in different places (``episode.PLACES``): only in the
assistant's own statement, in the middle of a long output, inside a JSON output, in a user message sent
mid-session, and one control question on the last sub-goal.  Every asked value occurs in exactly one
message of the episode; ``_generate`` draws again until that holds.
"""
from __future__ import annotations

import json
import random
import re
from datetime import datetime, timedelta
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import agent_outputs as fmt
from .episode import Episode, Fact, Question, Size, Step, tool

ATTEMPTS = 200
Slot = Tuple[str, Optional[str]]          # (step kind, place of the asked value it states, or None)


def _shared() -> Tuple[str, str]:
    """families.ASK and families.SYSTEM, imported on use: families.py imports this module at its end."""
    from .families import ASK, SYSTEM
    return ASK, SYSTEM


class Draft:
    """An episode being written: steps in order, and each asked value with the message that states it."""

    def __init__(self, rng: random.Random, size: Size):
        self.rng, self.size, self.rows = rng, size, size.rows
        self.steps: List[Step] = []
        self.questions: List[Question] = []
        self.facts: List[Fact] = []

    def ask(self, place: str, prompt: str, answer: str, source: str = "output") -> None:
        """A question on a value stated by the step being built (the next one appended)."""
        self.questions.append(Question(prompt + _shared()[0], answer, place != "recent", place))
        self.facts.append(Fact(len(self.steps), answer, source))

    # Line budgets: a long output (a file, a page, a thread), a medium one and a short one.
    def long(self) -> int:          # at least 17: a "middle" value needs a text of 15+ lines around it
        return max(17, 3 * self.rows + 2)

    def medium(self) -> int:
        return 2 * self.rows + 1


def _plan(size: Size, early: Sequence[Slot], recent: str, head: Sequence[str],
          fillers: Union[Sequence[str], Callable[[int], Sequence[str]]], tail: Sequence[str],
          order: Sequence[str]) -> List[Tuple[List[Slot], bool]]:
    """Per sub-goal: its step slots in order, and whether the mid-session user fact is sent in it.

    The early facts go round-robin into the first ~60% of the sub-goals (so they are compacted away by the
    end), the recent one into the last.  Fillers (a list, or one per sub-goal) pad a sub-goal to
    ``size.steps``; the optional tail goes first when a sub-goal has more facts than room."""
    n = size.sub_goals
    n_early = max(1, min(n - 1, round(0.6 * n)))
    carry: List[List[Slot]] = [[] for _ in range(n)]
    for i, fact in enumerate(early):
        carry[i % n_early].append(fact)
    carry[-1].append((recent, "recent"))
    plans = []
    for g in range(n):
        facts = [f for f in carry[g] if f[0] != "user"]
        places = dict(facts)
        first = [(k, places.get(k)) for k in head]
        last = [(k, places.get(k)) for k in tail]
        mid = [f for f in facts if f[0] not in head and f[0] not in tail]
        free = [k for k in (fillers(g) if callable(fillers) else fillers) if k not in places]
        while len(first) + len(mid) + len(last) < size.steps and free:
            mid.append((free.pop(0), None))
        while len(first) + len(mid) + len(last) > size.steps and last and last[0][1] is None:
            last.pop(0)
        mid.sort(key=lambda s: order.index(s[0]))
        plans.append((first + mid + last, len(facts) < len(carry[g])))
    return plans


def _write(d: Draft, plans, makers: Dict[str, Callable[[int, Optional[str], bool], Step]],
           opener: Callable[[int], str], user_fact: Callable[[int], str]) -> None:
    """Make the steps: the sub-goal's request opens it, the user fact goes on its third step, and about one
    step in three carries the assistant's own statement (always the one stating an "assistant" value)."""
    for g, (slots, has_user) in enumerate(plans):
        for j, (kind, place) in enumerate(slots):
            notes = [opener(g)] if j == 0 else []
            if has_user and j == min(2, len(slots) - 1):
                notes.append(user_fact(g))   # registers its question on this step, before the step is added
            step = makers[kind](g, place, place == "assistant" or j % 3 == 1)
            notes += [step.user] if step.user else []
            step.user = "\n\n".join(notes) or None
            step.subgoal, step.opens, step.closes = g, j == 0, j == len(slots) - 1
            d.steps.append(step)


def _messages(ep: Episode) -> List[Tuple[int, str, str]]:
    """Every text the model sees, as (step, source, text): the task is step -1; tool-call arguments count."""
    out = [(-1, "output", ep.task)]
    for i, s in enumerate(ep.steps):
        out += [(i, src, t) for src, t in (("user", s.user), ("args", json.dumps(s.args)), ("output", s.output),
                                           ("say", s.say)) if t]
    return out


def _problems(ep: Episode) -> List[str]:
    """Why this draw cannot be used: an asked value that shows up in another message or in a question, or
    that does not sit where its place says."""
    msgs, prompts = _messages(ep), " ".join(q.prompt for q in ep.questions).lower()
    bad = []
    for q, f in zip(ep.questions, ep.facts):
        a = q.answer.lower()
        hits = [(i, src) for i, src, t in msgs if a in t.lower()]
        if a in prompts or hits != [(f.step, f.source)]:
            bad.append(f"{q.answer}: in {hits}, or in a prompt")
            continue
        text = ep.source_text(f)
        if q.place == "middle":
            lines = text.split("\n")
            at = next(k for k, line in enumerate(lines) if a in line.lower())
            if len(lines) < 15 or not 0.3 <= at / len(lines) <= 0.7:
                bad.append(f"{q.answer}: line {at} of {len(lines)}")
        if q.place == "json":
            try:
                json.loads(text)
            except ValueError:
                bad.append(f"{q.answer}: not JSON")
    return bad


def _generate(name: str, seed: int, size: Size, build: Callable[[random.Random, int, Size], Episode]) -> Episode:
    rng = random.Random(f"{name}-{seed}")
    problems: List[str] = []
    for _ in range(ATTEMPTS):
        ep = build(rng, seed, size)
        problems = _problems(ep)
        if not problems:
            return ep
    raise RuntimeError(f"{name} seed {seed} {size}: no clean draw in {ATTEMPTS} tries ({problems})")


def _pick(rng: random.Random, pool: Sequence[str], k: int) -> List[str]:
    """k distinct items (pool items are reused with a numeric suffix when k exceeds the pool)."""
    base = rng.sample(list(pool), min(k, len(pool)))
    return base + [f"{rng.choice(pool)}_{i + 2}" for i in range(k - len(base))]


# ---------------------------------------------------------------------------------------------------- coding

REPOS = [("payments-api", "payments"), ("ledgerd", "ledger"), ("invoicer", "billing"), ("fulfil-svc", "fulfil")]
MODULES = ["retry", "fx", "locks", "export", "webhooks", "pagination", "refunds", "tax", "settlement",
           "idempotency", "notifications", "scheduler", "payouts", "disputes", "statements", "audit"]
CONSTS = ["LOCK_TIMEOUT_MS", "BACKOFF_CAP_MS", "FLUSH_INTERVAL_MS", "MAX_BATCH_BYTES", "SETTLEMENT_WINDOW_S",
          "WEBHOOK_TIMEOUT_MS", "IDEMPOTENCY_TTL_S", "STATEMENT_PAGE_LIMIT"]
# a failing test and the bug report it belongs to
BUGS = {"rounds_half_even": "rounds JPY amounts up instead of half-even",
        "gives_up_after_limit": "retries forever when the gateway times out",
        "skips_void_entries": "counts voided entries in the daily total",
        "keeps_insertion_order": "reorders line items on export", "handles_empty_batch": "crashes on an empty batch",
        "respects_cutoff": "ignores the settlement cutoff on Fridays", "dedupes_events": "sends duplicate events",
        "accepts_naive_datetimes": "rejects naive datetimes"}
CASES = list(BUGS)
TEAMS = ["treasury", "rails", "checkout", "money-movement", "reconciliation", "ledger-core", "platform", "risk"]


def _coding(rng: random.Random, seed: int, size: Size) -> Episode:
    d = Draft(rng, size)
    repo, pkg = rng.choice(REPOS)
    n = size.sub_goals
    mods = _pick(rng, MODULES, 3 * n + 8)
    goal_mods, spare = mods[:n], mods[n:]
    issues = rng.sample(range(4100, 4990), n)
    cases = [_pick(rng, CASES, 3) for _ in range(n)]
    bugs = [BUGS[c[0]] for c in cases]
    sources: Dict[str, str] = {}
    asked = rng.sample(CONSTS, 2)        # the middle constant and the recent one; other files reuse the names
    major, minor, patch = rng.randint(1, 4), rng.randint(10, 30), rng.randint(2, 9)
    tag = f"v{major}.{minor}.{patch}"
    read: set = set()

    def src_path(m):
        return f"src/{pkg}/{m}.py"

    def consts(exclude=()):
        names = rng.sample([c for c in CONSTS if c not in exclude], 2)
        return [(c, str(rng.randrange(500, 99950, 50))) for c in names]

    def fail(g, place, say):
        m, test = goal_mods[g], f"test_{goal_mods[g]}_{cases[g][0]}"
        others = [f"tests/test_{x}.py" for x in rng.sample(spare, min(len(spare), d.rows // 4))]
        files = [(p, "." * rng.randint(4, 30)) for p in [f"tests/test_{m}.py"] + others]
        marks = list(files[0][1])
        marks[rng.randrange(len(marks))] = "F"
        files[0] = (files[0][0], "".join(marks))
        got, want, fn = rng.randint(10, 999), rng.randint(10, 999), f"{rng.choice(fmt.VERBS)}_{m}"
        setup = [f"{v} = make_{m}({rng.choice(fmt.FIELDS)}={rng.randint(1, 500)})" for v in ("obj", "other")]
        setup += [f"obj.{rng.choice(fmt.FIELDS)} = other.{rng.choice(fmt.FIELDS)}" for _ in range(d.rows // 4)]
        short = d.rows < 8      # a small run is shown with --tb=short
        f = fmt.failure(f"tests/test_{m}.py", test, setup, f"assert {fn}(obj) == {want}",
                        [f"assert {got} == {want}", f" +  where {got} = {fn}(<{m.title()}Entry id=obj-1>)"],
                        rng.randint(20, 140), tb_short=short)
        warns = [(f"tests/test_{x}.py::test_{x}_{rng.choice(CASES)}",
                  f"{fmt.ROOT}/src/{pkg}/{x}.py:{rng.randint(10, 99)}: DeprecationWarning: "
                  "datetime.datetime.utcnow() is deprecated and scheduled for removal in a future version.",
                  "started = datetime.utcnow()")
                 for x in rng.sample(spare, min(len(spare), d.rows // 8))]
        args = {"args": " ".join(p for p, _ in files) + (" -q --tb=short" if short else "")}
        text = fmt.pytest_run(files, [f], warns, quiet=short, seconds=rng.uniform(0.3, 9))
        return Step(g, "run_tests", args, text, say=rng.choice([
            f"{test} fails: {fn}() returns {got} where {want} is expected. The code is in {src_path(m)}.",
            f"One failure, {test}; the rest of the run is green. {fn}() is the place to look."]) if say else None)

    def src(g, place, say):
        m = goal_mods[g] if place != "recent" or goal_mods[g] not in read else spare.pop()
        read.add(m)
        fact = None
        if place:
            name = asked[place == "recent"]
            value = str(rng.randrange(10050, 99950, 50))
            fact = (name, value, rng.choice(["Tuned after the March incident; keep in sync with the gateway.",
                                             "Measured on production traffic; see the runbook before changing.",
                                             "Must stay below the load balancer's idle timeout."]))
            d.ask(place, f"What is {name} set to in {src_path(m)}?", value)
        other = consts(exclude=asked if place else ())[:1 + (d.rows > 4 or place is not None)]
        if not place and rng.random() < 0.7:      # a distractor: an asked name with another value
            other[0] = (rng.choice(asked), str(rng.randrange(500, 99950, 50)))
        text = fmt.python_source(rng, d.long() if place else d.medium(), m,
                                 f"{m.title()} helpers for the {pkg} service.", other, fact)
        sources[m] = text
        fns = re.findall(r"^def (\w+)", text, re.M) or ["the module"]
        return Step(g, "read_file", {"path": src_path(m)}, text, say=rng.choice([
            f"{fns[0]}() is on the failing path; it does not special-case the input from the test.",
            f"{fns[-1]}() in {src_path(m)} is the one the test reaches."])
            if say else None)

    def extra_src(g, place, say):
        m = spare.pop()
        text = fmt.python_source(rng, d.medium(), m, f"Shared {m} utilities.", consts()[:1 + (d.rows > 4)])
        return Step(g, "read_file", {"path": src_path(m)}, text,
                    say=f"Nothing in {src_path(m)} touches this bug." if say else None)

    def log(g, place, say):
        path = src_path(goal_mods[g])
        count = max(3, d.rows + d.rows // 3 - 1)
        entries = [(fmt.sha(rng), _subject(rng, goal_mods, issues)) for _ in range(count)]
        deco = [f"HEAD -> fix/{issues[g]}-{cases[g][0].replace('_', '-')}"] + [""] * len(entries)
        release = rng.randrange(2, len(entries))
        entries[release] = (entries[release][0], f"Release v{major}.{minor}.{patch - 1}")
        deco[release] = f"tag: v{major}.{minor}.{patch - 1}"
        return Step(g, "git", {"args": f"log --oneline -n {len(entries)} -- {path}"}, fmt.git_log(entries, deco),
                    say=f"The last change before this branch was {entries[1][0]}; it touched the same loop." if say
                    else None)

    def tests_src(g, place, say):
        m = goal_mods[g]
        names = dict.fromkeys(f"test_{m}_{c}" for c in cases[g] + CASES)
        text = fmt.test_source(rng, d.medium(), m, f"{rng.choice(fmt.VERBS)}_{m}", list(names))
        return Step(g, "read_file", {"path": f"tests/test_{m}.py"}, text,
                    say="The tests build objects through factories; nothing mocks the clock." if say else None)

    def flaky(g, place, say):
        m, test = goal_mods[g], f"test_{goal_mods[g]}_backoff_jitter_bounds"
        failed = rng.choice([f for f in (3, 5, 7, 9, 11, 13) if f <= max(3, d.rows + 1)])
        rate = f"{failed * 100 / 80:g}"
        d.ask("assistant", f"What failure rate (in percent) did you measure for {test} over repeated runs?",
              rate, "say")
        text = fmt.pytest_repeat(f"tests/test_{m}.py", test, 80, sorted(rng.sample(range(1, 81), failed)), rng)
        return Step(g, "run_tests", {"args": f"tests/test_{m}.py::{test} --count 80 -q --tb=no -rf"}, text,
                    say=f"{test} is flaky rather than broken: {failed} of 80 runs failed, a {rate}% failure rate, "
                    "always on the jitter bound. I'll keep it out of this fix.")

    def cov(g, place, say):
        m = goal_mods[g]
        paths = [src_path(x) for x in [m] + rng.sample(spare, min(len(spare), max(1, d.rows // 2)))]
        rng.shuffle(paths)
        files, value = {}, ""
        for p in paths:
            while True:
                stmts = rng.randint(40, 400)
                covered = rng.randint(stmts // 2, stmts - 1)
                pct = covered * 100 / stmts
                if f"{pct:.2f}"[-1] != "0":
                    break
            missing = sorted(rng.sample(range(12, stmts + 30), min(4, stmts - covered)))
            files[p] = {"summary": {"covered_lines": covered, "num_statements": stmts, "percent_covered": pct,
                                    "percent_covered_display": f"{pct:.2f}", "missing_lines": stmts - covered,
                                    "excluded_lines": 0}, "missing_lines": missing, "excluded_lines": []}
            if p == src_path(m):
                value = f"{pct:.2f}"
        d.ask(place, f"What percent_covered_display does coverage.json give for {src_path(m)}?", value)
        meta = {"format": 3, "version": "7.5.3", "timestamp": "2024-06-11T09:41:07.513206",
                "branch_coverage": False, "show_contexts": False}
        text = "{\n  \"meta\": " + json.dumps(meta) + ",\n  \"files\": " + fmt.layered_json(files, 2, 1) + "\n}"
        return Step(g, "read_file", {"path": "coverage.json"}, text,
                    say=f"Coverage of {src_path(m)} is uneven; the missing lines are the error branches." if say
                    else None)

    def contrib(g, place, say):
        team = f"{rng.choice(TEAMS)}-{rng.choice(['guild', 'stewards', 'owners', 'maintainers', 'crew'])}"
        d.ask(place, f"Which team must approve changes to {src_path(goal_mods[g])}, according to CONTRIBUTING.md?",
              team)
        text = _contributing(rng, d.long(), repo, pkg, goal_mods[g], team, spare)
        return Step(g, "read_file", {"path": "CONTRIBUTING.md"}, text,
                    say="Noted the review rules; the PR needs the owning team's approval." if say else None)

    def diff(g, place, say):
        m = goal_mods[g]
        cached = sources.get(m, "")      # the file as read earlier, when it is long enough to show a hunk
        files = [(src_path(m), cached if cached.count("\n") >= 24 else
                  fmt.python_source(rng, max(40, d.long()), m, "", consts()))]
        if d.rows >= 10:
            files.append((f"tests/test_{m}.py", fmt.test_source(rng, max(40, d.long()), m, f"load_{m}",
                                                                [f"test_{m}_{c}" for c in CASES])))
        paths = " ".join(p for p, _ in files)
        note = f"The fix is limited to {src_path(m)}; the test now covers the edge case." if say else None
        if d.rows < 5:          # a small run looks at the summary only
            counts = [(p, rng.randint(1, 6), rng.randint(0, 3)) for p in [src_path(m), f"tests/test_{m}.py"]]
            w = max(len(p) for p, _, _ in counts)
            text = "\n".join([f" {p.ljust(w)} | {a + r:2} {'+' * a}{'-' * r}" for p, a, r in counts] + [
                f" 2 files changed, {sum(a for _, a, _ in counts)} insertions(+), {sum(r for _, _, r in counts)} "
                "deletions(-)"])
            return Step(g, "git", {"args": f"diff --stat -- {src_path(m)} tests/test_{m}.py"}, text, say=note)
        return Step(g, "git", {"args": f"diff -- {paths}"}, fmt.git_diff(rng, files, max(1, d.rows // 5)),
                    say=note)

    def passed(g, place, say):
        m = goal_mods[g]
        files = [(f"tests/test_{x}.py", "." * rng.randint(6, 40)) for x in [m] + spare[:d.rows // 2]]
        warns = [(f"tests/test_{x}.py::test_{x}_{rng.choice(CASES)}",
                  f"{fmt.ROOT}/.venv/lib/python3.11/site-packages/freezegun/api.py:{rng.randint(100, 900)}: "
                  "DeprecationWarning: datetime.datetime.utcfromtimestamp() is deprecated",
                  "return real_datetime.utcfromtimestamp(t)") for x in ([m] + spare)[:d.rows // 5]]
        text = fmt.pytest_run(files, [], warns, quiet=True, seconds=rng.uniform(0.3, 9))
        return Step(g, "run_tests", {"args": f"tests/test_{m}.py {' '.join(p for p, _ in files[1:])} -q"}, text,
                    say=f"tests/test_{m}.py passes now, and the neighbouring suites too." if say else None)

    def status(g, place, say):
        m = goal_mods[g]
        branch = f"fix/{issues[g]}-{cases[g][0].replace('_', '-')}"
        touched = [src_path(m), f"tests/test_{m}.py"] + [src_path(x) for x in spare[:d.rows // 3]]  # the formatter
        say = "Only the expected files changed, plus what the formatter touched." if say else None
        if d.rows < 6:          # a small run uses the short format
            text = "\n".join([f"## {branch}...origin/{branch}"] + [f" M {p}" for p in touched] +
                              [f"?? scratch/repro_{issues[g]}.py"])
            return Step(g, "git", {"args": "status -sb"}, text, say=say)
        text = fmt.git_status(branch, touched, [f"scratch/repro_{issues[g]}.py"])
        return Step(g, "git", {"args": "status"}, text, say=say)

    def opener(g):
        m = goal_mods[g]
        return rng.choice([f"Next: issue #{issues[g]}: {src_path(m)} {bugs[g]}. Find the cause and fix it.",
                           f"Now #{issues[g]}. Support says the {m} code {bugs[g]}; the tests in tests/test_{m}.py "
                           "should show it.", f"Can you take #{issues[g]} next? Reported as: {m} {bugs[g]}."])

    def user_fact(g):
        d.ask("user", "What tag did I ask you to use for the release?", tag, "user")
        return rng.choice([f"By the way: when everything is green, tag the release as {tag}.",
                           f"Heads-up from release management: this batch ships as {tag}, so use that tag."])

    plans = _plan(size, [("src", "middle"), ("flaky", "assistant"), ("cov", "json"), ("contrib", "middle"),
                         ("user", "user")], "src", head=["fail"],
                  fillers=lambda g: ["src", "status", "log", "tests_src", "src2"] if g == 1 else
                  ["src", "log", "tests_src", "src2", "src2"], tail=["diff", "pass"],
                  order=["src", "log", "flaky", "tests_src", "cov", "contrib", "src2", "status"])
    makers = {"fail": fail, "src": src, "src2": extra_src, "log": log, "tests_src": tests_src, "flaky": flaky,
              "cov": cov, "contrib": contrib, "diff": diff, "pass": passed, "status": status}
    _write(d, plans, makers, opener, user_fact)
    task = (f"You're working in the {repo} repository (Python 3.11, pytest). CI on main has been red since last "
            f"week's merges. Work through the open issues {', '.join(f'#{i}' for i in issues)} one at a time: find "
            "the cause, make the smallest fix, and run the relevant tests. Follow CONTRIBUTING.md. I'll check in.")
    return Episode("coding", seed, _shared()[1], task,
                   [tool("read_file", "Read a file of the repository.", path="string"),
                    tool("run_tests", "Run pytest with the given arguments.", args="string"),
                    tool("git", "Run a git command (log, status, diff, ...).", args="string")],
                   d.steps, d.questions, d.facts)


def _subject(rng, mods, issues) -> str:
    m = rng.choice(mods)
    return rng.choice([f"Fix {rng.choice(fmt.VERBS)}_{m} when the batch is empty (#{rng.randint(3000, 4099)})",
                       f"Bump {rng.choice(['urllib3', 'pydantic', 'sqlalchemy', 'httpx'])} from "
                       f"{rng.randint(1, 2)}.{rng.randint(0, 9)}.{rng.randint(0, 9)} to "
                       f"{rng.randint(2, 3)}.{rng.randint(0, 9)}.{rng.randint(0, 9)}",
                       f"Refactor {m}: split {rng.choice(fmt.VERBS)}_{rng.choice(fmt.NOUNS)}",
                       f"Add regression test for #{rng.choice(issues) - rng.randint(50, 900)}",
                       f"Log {rng.choice(fmt.NOUNS)} ids on retry", f"Merge pull request #{rng.randint(3000, 4099)} "
                       f"from acme/{m}-cleanup", f"Tighten typing in {m}"])


def _contributing(rng, budget: int, repo: str, pkg: str, module: str, team: str, spare: Sequence[str]) -> str:
    """CONTRIBUTING.md with the code-owner rules in the middle; ``team`` owns ``module`` (the other rules,
    for other files and teams, are the distractors)."""
    k = max(1, (budget - 20) // 4)
    others = [t for t in TEAMS if not team.startswith(t)]
    rules = [f"- `src/{pkg}/{m}.py`: @acme/{rng.choice(others)}-{rng.choice(['team', 'owners', 'squad'])}"
             for m in rng.sample(list(spare), min(len(spare), k + 2))]
    setup = ["```bash"] + ["python -m venv .venv && . .venv/bin/activate", "pip install -e '.[dev]'",
                           "pre-commit install"][:k] + ["```"]
    tests = [f"- {t}" for t in ["Run `pytest -q` before pushing; CI runs the same with `-W error`.",
                                "Mark tests that need the sandbox gateway with `@pytest.mark.gateway`.",
                                "Never commit recorded cassettes that contain card numbers.",
                                "Use the factories in `tests/factories.py` instead of hand-built objects.",
                                "Time-dependent tests use freezegun; do not sleep in tests."]][:k + 1]
    after = [f"- {t}" for t in ["Commit subjects are imperative and under 72 characters.",
                                "Reference the issue in the body (`Fixes #1234`).",
                                "Squash fixups before asking for review.",
                                "Releases are tagged from main by the release manager.",
                                "Changelog fragments go in `changes/`, one file per PR."]][:k + 1]
    owners = ["Every change needs one approval from the owning team:"] + rules
    sections = ([("Development setup", setup)] if budget >= 24 else []) + [
        ("Tests", tests), ("Code owners", owners), ("Commits and releases", after)]
    lines = fmt.markdown(sections, f"Contributing to {repo}")
    rule = f"- `src/{pkg}/{module}.py`: @acme/{team} (two approvals while the migration runs)"
    slots = [i for i, line in enumerate(lines) if line.startswith("- `src/")]
    return "\n".join(fmt.put_middle(rng, lines, slots, rule))


# -------------------------------------------------------------------------------------------------- research

PLACE_A = ["Harrow", "Ashby", "Kelling", "Marston", "Wyre", "Brannock", "Fennick", "Calder", "Thursby", "Oldwick"]
PLACE_B = ["mere Fen", "dale Marshes", " Levels", "ford Estuary", " Moss", "wick Water"]
COUNTIES = ["Westmarch", "Eastholm", "Northcombe", "Southfold", "Lowmoor", "Highcross"]
AUTHORS = ["Penhallow", "Ashdown", "Marwood", "Trevelyan", "Oakeshott", "Caldicott", "Fairbairn", "Wexcombe",
           "Quennell", "Stanbury", "Ravenhill", "Tregear", "Kettleby", "Sowerby", "Latchford", "Brackenbury"]
PEOPLE = ["Ruth Ellery", "Tom Pryor", "Sanjay Mehta", "Claire Dunmore", "Owen Hollis", "Mags Latimer",
          "Peter Blackmore", "Ines Duarte", "Kwame Asante", "Hannah Yeo"]
FIRST = ["Alice", "Martin", "Helen", "Rupert", "Joanna", "Farid", "Eleanor", "Gareth"]
OFFICE = "National Statistics Office"
# metric name, how a value is written, a value
METRICS = [("peak count of wintering waterbirds", "{:,} birds", lambda r: r.randint(5200, 61000)),
           ("number of annual visitors", "{:,} visitors", lambda r: r.randint(18500, 96000)),
           ("total restoration cost", "£{:.2f} million", lambda r: r.randint(121, 989) / 100),
           ("area of reedbed", "{:.1f} hectares", lambda r: r.randint(601, 8990) / 10),
           ("mean phosphate concentration", "{:.3f} mg/l", lambda r: r.randint(21, 290) / 1000),
           ("number of volunteer hours logged", "{:,} hours", lambda r: r.randint(1210, 19800))]
HEDGES = ["roughly", "about", "an estimated", "around", "more than", "close to", "nearly"]
LOW_SOURCES = [("fenwalker.blog", "Fen Walker"), ("wildweekends.co", "Wild Weekends"),
               ("birdingforum.net", "Birding Forum"), ("localfacts.info", "Local Facts")]
FILLER = [
    "{place} sits on the floodplain of the River {river}, about {n} kilometres from the coast.",
    "The site was drained for grazing in the nineteenth century and rewetting began in {year}.",
    "Volunteers from the {trust} carry out monthly counts along the {n}-kilometre boardwalk.",
    "Local accounts put the {metric} at {hedged}, though the methodology is not described.",
    "According to a {year} leaflet, the {metric} was {hedged} at the time.",
    "The {council} has described the project as one of the largest of its kind in {county}.",
    "Heavy rain in the winter of {year} flooded the lower hides for several weeks.",
    "{person}, who has walked the reserve for decades, remembers when the reeds were cut by hand.",
    "Access is from the car park on Mill Lane; the main trail is step-free for the first kilometre.",
    "Funding came partly from a heritage grant and partly from water-company mitigation payments.",
    "Scrub clearance is done in autumn to avoid the breeding season.",
    "Several figures circulate online; some appear to be copied from older pages without a date.",
    "The {trust} publishes its survey results each spring, usually with a short methods note.",
    "A {year} estimate suggested {hedged}, but the authors cautioned that coverage was incomplete.",
    "Water levels are managed with a series of sluices installed during the first phase of works.",
    "Grazing by a small herd of Konik ponies keeps the wet meadows open.",
    "Visitor surveys run on a sample of weekends and are scaled up, so totals are approximate.",
    "The management plan runs until {later} and is reviewed every five years.",
    "{person} of the {trust} said the results were encouraging but that one good year proves little.",
    "Some older guides still describe the site as closed in winter, which has not been true since {year}.",
    "Bird hides were rebuilt in {year} after the old ones were damaged by fire.",
    "The {council} owns the southern half of the site; the {trust} leases the rest.",
    "Guided walks leave the visitor hub at ten on Saturdays from April to September.",
    "A {year} newsletter gave {hedged} for the {metric}, without saying how it was measured.",
    "{person} told a local paper that the {metric} was {hedged}, a number repeated on several websites since.",
    "Dogs are allowed on the perimeter path only, and must be kept on a short lead.",
    "The reedbed is cut on a seven-year rotation so that some stands are always mature.",
    "Otters returned to the main channel in {year}, the first confirmed record for decades.",
    "The nearest railway station is {n} kilometres away, with a bus on weekdays only.",
    "A second phase of works, costing a further sum that was never published, ended in {year}.",
    "Monitoring methods changed in {year}, so earlier and later figures are not strictly comparable.",
    "School groups visit throughout the year, and the education room can be booked in advance.",
    "Some of the wettest fields are still privately owned and are not open to the public.",
    "The site is designated as a Site of Special Scientific Interest and a Ramsar wetland.",
    "Car parking charges were introduced in {year}; members of the {trust} park free.",
]


def _research(rng: random.Random, seed: int, size: Size) -> Episode:
    d = Draft(rng, size)
    n = size.sub_goals
    place = rng.choice(PLACE_A) + rng.choice(PLACE_B)
    county = rng.choice(COUNTIES)
    trust, council = f"{place.split()[0]} Wetlands Trust", f"{county} County Council"
    slug = place.lower().replace(" ", "-")
    shuffled = rng.sample(METRICS, len(METRICS))
    metrics = [shuffled[g % len(shuffled)] for g in range(n)]
    authors = rng.sample(AUTHORS, len(AUTHORS))
    rate = f"1.1{rng.randint(10, 99)}{rng.randint(1, 9)}"
    used_urls: set = set()
    queries: set = set()

    def value(g):
        return metrics[g][1].format(metrics[g][2](rng))

    def number(text):          # "61,240 visitors" -> "61,240"; "£4.83 million" -> "4.83"
        return text.split()[0].lstrip("£")

    def asked_value(g):
        """A value to ask about: no trailing decimal zero (a reply of "407" must match, not need "407.0")."""
        while True:
            v = value(g)
            if not ("." in number(v) and number(v).endswith("0")):
                return v

    def hedged(g):
        return f"{rng.choice(HEDGES)} {value(g)}"

    def prose(g, short=False):
        """Paragraphs of two to four sentences (one or two on a short page); a page repeats a sentence only
        once it has used them all."""
        pool: List[str] = []
        while True:
            para = []
            for _ in range(rng.randint(1, 2) if short else rng.randint(2, 4)):
                if not pool:
                    pool = rng.sample(FILLER, len(FILLER))
                para.append(pool.pop().format(
                    place=place, river=rng.choice(["Wend", "Ouse", "Lark", "Brue"]), n=rng.randint(2, 14),
                    trust=trust, year=rng.randint(1998, 2019), later=rng.randint(2027, 2034), metric=metrics[g][0],
                    hedged=hedged(g), council=council, county=county, person=rng.choice(PEOPLE)))
            yield " ".join(para)

    def url(site, title):
        words = re.findall(r"[a-z0-9]+", title.lower())[:7]
        u = f"https://{site}/{rng.choice(['news', 'reports', 'posts', 'p'])}/{'-'.join(words)}"
        while u in used_urls:
            u += f"-{rng.randint(2, 9)}"
        used_urls.add(u)
        return u

    def fetched(g, site, title, budget, fact=None, after=2016):
        when = f"{rng.randint(after, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        u = url(site, title)
        return u, fmt.page(rng, [f"# {title}", f"{u} · published {when}"], prose(g, budget < 12), budget, fact)

    def results(g, query, official=None, k=None):
        k = (k or max(2, d.rows // 2 + 1)) - (official is not None)
        out = []
        for _ in range(k):
            site, name = rng.choice(LOW_SOURCES + [(f"www.{slug.split('-')[0]}wetlands.org.uk", trust),
                                                   (f"www.{county.lower()}.gov.uk", council),
                                                   ("en.wikipedia.org", "Wikipedia")])
            title = rng.choice([f"{place}: {metrics[g][0]}", f"Visiting {place} - {name}",
                                f"{place} restoration update", f"How many? {place} in numbers"])
            out.append({"title": title, "url": url(site, title), "snippet": rng.choice([
                f"... the {metrics[g][0]} at {place} is {hedged(g)}, according to volunteers ...",
                f"... {place} ({county}) ... {hedged(g)} ... updated {rng.randint(2012, 2023)} ...",
                f"... we were told the {metrics[g][0]} is {value(g)}, which seems about right ..."]),
                "date": f"{rng.randint(2012, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"})
        if official:
            title = f"{county} environment statistics {rng.randint(2021, 2024)}"
            out.insert(rng.randrange(len(out) + 1), {
                "title": title, "url": url("www.nso-statistics.org", title), "date": "2024-03-28",
                "snippet": f"... the {OFFICE}'s latest release puts the {metrics[g][0]} at {place} at {official} ..."})
        text = json.dumps(out, indent=2, ensure_ascii=False) if rng.random() < 0.5 else fmt.layered_json(out, 1)
        return {"query": query}, text, out

    def search(g, place_, say):
        rule = None
        official = None
        if place_:
            official = asked_value(g)
            rule = rng.choice([f"If sources disagree on a figure, go with the {OFFICE}'s number; blogs and forums "
                               "don't count.", f"Where the numbers conflict, the {OFFICE} figure wins. Use that one."])
            d.ask(place_, f"Applying my rule for conflicting sources, what figure for the {metrics[g][0]} at "
                  f"{place} should the briefing use?", number(official))
        args, text, out = results(g, f"{place} {metrics[g][0]}" + (f" {2024 - g}" if g >= len(METRICS) else ""),
                                  official)
        low = [r for r in out if any(s in r["url"] for s, _ in LOW_SOURCES)]
        return Step(g, "web_search", args, text, user=rule,
                    say=f"{len(out)} results, {len(low)} of them blogs or forums; opening the better sources." if say
                    else None)

    def search2(g, place_, say):
        query = f"{place} {metrics[g][0]} {rng.choice(['report', 'official', 'survey'])} {rng.randint(2019, 2024)}"
        while query in queries:
            query += " pdf"
        queries.add(query)
        args, text, _ = results(g, query, k=max(2, d.rows // 3 + 1))
        return Step(g, "web_search", args, text,
                    say="The refined search mostly repeats the same pages." if say else None)

    def page(g, place_, say):
        site, title = rng.choice([("en.wikipedia.org", f"{place} - Wikipedia"),
                                  (f"www.{slug}.org.uk", f"About {place}"),
                                  (f"www.visit-{county.lower()}.com", f"{place} nature reserve guide")])
        u, text = fetched(g, site, title, d.medium())
        return Step(g, "fetch_page", {"url": u}, text,
                    say="Background only; no dated figure on this page." if say else None)

    def blog(g, place_, say):
        site, name = rng.choice(LOW_SOURCES)
        v = value(g)
        title = rng.choice([f"My day out at {place}", f"{place}: everything you need to know",
                            f"Is {place} worth a visit?"])
        u, text = fetched(g, site, title, d.medium(), f"For the record, the {metrics[g][0]} is {v}. I checked with "
                          "a warden, so you can take that to the bank.")
        return Step(g, "fetch_page", {"url": u}, text,
                    say=f"{name} states {v} with total confidence but cites a conversation, not a source." if say
                    else None)

    def forum(g, place_, say):
        site = rng.choice(LOW_SOURCES)[0]
        title = f"Re: {metrics[g][0]} at {place}?"
        u = url(site, title)
        posts = []
        for _ in range(max(2, d.rows // 3 + 1)):
            who = rng.choice(["wader_watcher", "fenland_phil", "reedbunting77", "moss_ranger", "tern_again"])
            posts += ["", f"{who} wrote ({rng.randint(1, 28)} {rng.choice(['Mar', 'Jun', 'Oct'])} "
                      f"{rng.randint(2014, 2023)}):", rng.choice([
                          f"Last I heard it was {hedged(g)}, but don't quote me.",
                          f"The trust's leaflet says {value(g)}. Might be out of date.",
                          f"Pretty sure it's {value(g)}, my cousin volunteers there.",
                          "Does anyone have the actual report? Everything online seems to copy everything else."])]
        return Step(g, "fetch_page", {"url": u}, "\n".join([f"# {title}", u] + posts),
                    say="The forum thread is hearsay; several posters contradict each other." if say else None)

    def report(g, place_, say):
        year, who = rng.randint(2019, 2023), authors.pop()
        d.ask(place_, f"Who compiled the {trust}'s {year} report on the {metrics[g][0]} at {place}? "
              "Give the surname.", who)
        fact = (f"The {year} report was compiled by Dr {rng.choice(FIRST)} {who} of the {trust}, who led the "
                f"fieldwork with a team of {rng.randint(8, 40)} volunteers and checked the counts twice.")
        u, text = fetched(g, f"www.{slug}.org.uk", f"{year} monitoring report | {trust}", d.long(), fact, year)
        return Step(g, "fetch_page", {"url": u}, text,
                    say="This is the trust's own report, with a methods section; the most careful source so far."
                    if say else None)

    def change(g, place_, say):
        y1, y2 = rng.randint(2010, 2015), rng.randint(2019, 2023)
        while True:         # a rise of 10% to 200%, stated with a non-zero decimal
            a, b = metrics[g][2](rng), metrics[g][2](rng)
            pct = f"{(b - a) * 100 / a:.1f}"
            if 1.1 * a < b < 3 * a and not pct.endswith("0"):
                break
        d.ask("assistant", f"By what percentage did you calculate that the {metrics[g][0]} at {place} rose between "
              f"{y1} and {y2}?", pct, "say")
        fa, fb = metrics[g][1].format(a), metrics[g][1].format(b)
        fact = (f"The survey series shows the change clearly: in {y1} the figure was {fa}, and by {y2} it had "
                f"reached {fb}.")
        u, text = fetched(g, f"www.{county.lower()}.gov.uk", f"{place}: ten years of monitoring", d.long(), fact,
                          y2)
        return Step(g, "fetch_page", {"url": u}, text,
                    say=f"From {fa} in {y1} to {fb} in {y2}: a rise of {pct}%. I'll quote the change, not one year.")

    def audit(g, place_, say):
        year, v = rng.randint(2020, 2023), asked_value(g)
        d.ask(place_, f"What audited figure for the {metrics[g][0]} in {year} did the {council} page give?", number(v))
        fact = (f"The audited figure for {year} is {v}. It supersedes the provisional estimate published earlier, "
                "which had been quoted in several news stories.")
        u, text = fetched(g, f"www.{county.lower()}.gov.uk", f"{place}: audited figures", d.long(), fact, year + 1)
        return Step(g, "fetch_page", {"url": u}, text,
                    say="An official page with audited figures; it explains why older estimates differ." if say
                    else None)

    def news(g, place_, say):
        ref = f"{rng.randint(19, 24)}/{rng.randint(10000, 99999):05d}/FUL"
        d.ask(place_, f"What is the reference of the planning application for the new visitor centre at {place}?",
              ref)
        fact = (f"A planning application (reference {ref}) for a new visitor centre was submitted to the {council} "
                "in the spring; a decision is expected after the consultation closes.")
        u, text = fetched(g, f"www.{county.lower()}courier.co.uk", f"Plans lodged for {place} visitor centre",
                          d.medium(), fact)
        return Step(g, "fetch_page", {"url": u}, text,
                    say="The news story is recent and names the applicant; useful for the outlook section." if say
                    else None)

    def opener(g):
        return rng.choice([f"Next for the briefing: the {metrics[g][0]}.",
                           f"Now the {metrics[g][0]}, please, and how reliable it is.",
                           f"Moving on: the {metrics[g][0]}. Check more than one source."])

    def user_fact(g):
        d.ask("user", "What GBP-to-EUR exchange rate did I tell you to use?", rate, "user")
        return (f"One more thing: the briefing goes to our Brussels office, so convert any GBP amounts to EUR at "
                f"{rate}, the rate finance gave us.")

    plans = _plan(size, [("report", "middle"), ("change", "assistant"), ("search", "json"), ("audit", "middle"),
                         ("user", "user")], "news", head=["search"],
                  fillers=["page", "blog", "search2", "forum", "page", "blog", "page"], tail=[],
                  order=["page", "report", "blog", "forum", "change", "search2", "audit", "news"])
    makers = dict(search=search, search2=search2, page=page, blog=blog, forum=forum, report=report, change=change,
                  audit=audit, news=news)
    _write(d, plans, makers, opener, user_fact)
    task = (f"I'm writing a briefing on {place} in {county} for the regional nature partnership. Using web "
            f"search, establish: {'; '.join('the ' + metrics[g][0] for g in range(n))}. Many figures online are "
            "outdated or unsourced, so keep track of where each number comes from.")
    return Episode("research", seed, _shared()[1], task,
                   [tool("web_search", "Search the web; returns a JSON list of results.", query="string"),
                    tool("fetch_page", "Fetch a web page as text.", url="string")], d.steps, d.questions, d.facts)


# --------------------------------------------------------------------------------------------------- support

SHOPS = ["Brightwell Home", "Nordvik Appliances", "Casa Lumen"]
CUSTOMERS = ["Marta Kowalczyk", "Liam O'Brien", "Sofia Brandt", "Yusuf Demir", "Elena Rossi", "Henrik Lund",
             "Chloé Martin", "Daniel Novak", "Aisha Rahman", "Pieter de Vries", "Grace Okafor", "Lucas Moreau"]
AGENTS = ["Jonas (tier 1)", "Priya (tier 1)", "Marek (tier 2)", "Aoife (tier 1)", "Tomás (billing)"]
PRODUCTS = [("espresso machine", "Aurora 3", "AU3"), ("dishwasher", "Fjell 45", "FJ45"),
            ("air purifier", "Breeze Pro", "BZP"), ("stand mixer", "Kneda 6", "KN6"),
            ("robot vacuum", "Sweeply S2", "SWS2"), ("induction hob", "Calor 60", "CL60")]
PROBLEMS = ["arrived with a cracked water tank", "has not arrived although tracking says delivered",
            "was charged twice on my card", "stopped working after two weeks", "is the wrong model",
            "arrived without the power cable"]
CARRIERS = [("UPS", lambda r: "1Z" + "".join(r.choice("0123456789ABCDEFGHJKLMNPRSTVWXYZ") for _ in range(6))
             + "".join(r.choice("0123456789") for _ in range(10))),
            ("DHL", lambda r: "JD01" + "".join(r.choice("0123456789") for _ in range(16))),
            ("GLS", lambda r: "GLS" + "".join(r.choice("0123456789") for _ in range(11)))]
DETAILS = {"label_created": "Shipment information received", "picked_up": "Picked up from the sender's warehouse",
           "in_transit": "Departed from facility", "at_depot": "Arrived at the delivery depot",
           "out_for_delivery": "With the driver for delivery today"}
QUEUE_A = ["refund", "billing", "payments", "returns", "warranty", "logistics"]
QUEUE_B = ["approvals", "escalations", "review", "claims", "exceptions"]
QUEUE_C = ["emea", "tier2", "l2", "eu_west", "nordics"]


def _support(rng: random.Random, seed: int, size: Size) -> Episode:
    d = Draft(rng, size)
    n = size.sub_goals
    shop = rng.choice(SHOPS)
    ids = rng.sample(range(40000, 99999), 6 * n + 16)
    tickets = [f"TCK-{i}" for i in ids[:n]]
    orders = [f"ORD-{i}" for i in ids[n:2 * n]]
    old_tickets = [f"TCK-{i - 30000}" for i in ids[2 * n:3 * n]]       # each customer's earlier ticket ...
    old_orders = [f"ORD-{i}" for i in ids[3 * n:4 * n]]                # ... about an earlier order
    spare_orders = [f"ORD-{i}" for i in ids[4 * n:]]
    accounts = [f"ACC-{rng.randint(100000, 999999)}" for _ in range(n)]
    people = rng.sample(CUSTOMERS, min(n, len(CUSTOMERS))) * 2
    products = [rng.choice(PRODUCTS) for _ in range(n)]
    problems = [rng.choice(PROBLEMS) for _ in range(n)]
    queues = rng.sample([f"{a}_{b}_{c}" for a in QUEUE_A for b in QUEUE_B for c in QUEUE_C], 12)
    approval_queue = next(q for q in queues if q.startswith(("refund", "billing", "payments")))
    queues.remove(approval_queue)
    deliver_after = f"{rng.randint(12, 17)}:{rng.choice(['15', '40', '45', '50'])}"
    policies_read: List[str] = []
    macros_read: List[str] = []

    def clock(start_day):
        """Increasing timestamps from a day in spring 2024 (a fixed calendar, not today's date)."""
        t = datetime(2024, 3, 1, 8, 0) + timedelta(days=start_day, minutes=rng.randint(0, 600))
        while True:
            yield t
            t += timedelta(minutes=rng.randint(25, 1900))

    def iso():
        return next(clock(rng.randint(0, 90))).strftime("%Y-%m-%dT%H:%M:%SZ")

    def as_json(obj):
        """indent=2 when it fits the line budget (half the time), else one record a line, else compact."""
        limit = 4 * d.rows + 10
        for text in ([json.dumps(obj, indent=2, ensure_ascii=False)] if rng.random() < 0.5 else []) + [
                fmt.layered_json(obj, 2), fmt.layered_json(obj, 1)]:
            if text.count("\n") < limit:
                return text
        return json.dumps(obj, ensure_ascii=False)

    def thread(g, tid, budget, product, problem, order_id, fact=None, status="open"):
        """A ticket thread of about ``budget`` lines; ``fact`` is a line the customer adds to a message in
        the middle of the thread."""
        name, (item, model, code) = people[g], product
        first, times = name.split()[0], clock(rng.randint(0, 90))
        said = [f"Hello, my {model} {item} ({order_id}) {problem}.",
                "I would like this sorted before the weekend if possible.",
                rng.choice(["I have been a customer for years and this is the first time this has happened.",
                            "Your chat said someone would call me back, but nobody did."])]
        msgs = [(next(times), f"{name} (customer)", fmt.wrap([" ".join(said[:1 + 2 * (budget >= 20)])], 90))]
        if budget >= 24:
            msgs.append((next(times), "system", [f"Ticket created via email. SLA: first reply within "
                                                 f"{rng.choice([4, 8, 24])} business hours."]))
        header = [f"Ticket {tid} · {model} {item}: {problem}", f"Status: {status} · Priority: "
                  f"{rng.choice(['normal', 'high'])} · Requester: {name} ({accounts[g]})"]
        room, turn, agent = budget - (3 if fact else 0), 0, rng.choice(AGENTS)
        while True:
            if turn % 2 == 0:
                agent = rng.choice(AGENTS)
                greeting = rng.choice([f"Hi {first}, thanks for getting in touch.", f"Hello again {first}.",
                                       f"Thanks {first}, that helps."])
                body = ([f"> {rng.choice(said)}", ""] if budget >= 20 else []) + [" ".join([greeting,
                    rng.choice(["Could you confirm the delivery address and a phone number for the courier?",
                                f"I have asked the warehouse to check the batch this {item} came from.",
                                "Could you send a photo of the label on the underside of the device?",
                                "I've opened a trace with the carrier; they usually answer within two working days.",
                                "Sorry about the wait. I've passed this to a colleague who handles these cases."])])]
                new = (next(times), agent, fmt.wrap(body, 90) if budget < 20 else body[:2] + fmt.wrap(body[2:], 90))
            elif turn % 4 == 3 and rng.random() < 0.5:
                new = (next(times), f"{agent.split()[0]} (internal note)", [rng.choice([
                    "Checked the carrier portal: last scan at the depot.", "Customer has one earlier ticket.",
                    f"Batch {code}-{rng.randint(100, 999)} had other reports of damage."])])
            else:
                new = (next(times), f"{name} (customer)", fmt.wrap([rng.choice([
                    "Thanks. The address is correct, and I'm reachable on the number in my account.",
                    "Here is the photo. The box was already dented when the driver handed it over.",
                    "I still have the original packaging if you need it back.",
                    "I have been waiting for four days now. Please give me an update.",
                    "My neighbour did not receive anything either, I asked.",
                    "Can you just send a new one? I don't mind returning this one."])], 90))
            if len(fmt.ticket_thread(header, msgs + [new])) > room and len(msgs) >= 2:
                break
            msgs.append(new)
            turn += 1
        while fact and len(fmt.ticket_thread(header, msgs)) < 12:     # the fact needs 15+ lines around it
            msgs.append((next(times), "system", [rng.choice(["Customer viewed the ticket.", "SLA reminder sent."])]))
        if fact:     # the customer's own follow-up, between the messages nearest the middle of the thread
            starts = [len(fmt.ticket_thread(header, msgs[:k])) + 2 for k in range(1, len(msgs) + 1)]
            k = starts.index(fmt.middle_index(rng, starts[-1] + 3, starts)) + 1
            msgs.insert(k, (None, f"{name} (customer)", [fact]))
            stamps = sorted(t for t, _, _ in msgs if t) + [next(times)]
            msgs = [(stamps[i], who, body) for i, (_, who, body) in enumerate(msgs)]
        stamped = [(t.strftime("%Y-%m-%d %H:%M"), who, body) for t, who, body in msgs]
        lines = fmt.ticket_thread(header, stamped)
        return "\n".join(lines)

    def ticket(g, place_, say):
        fact = None
        if place_:
            code = products[g][2]
            serial = f"{code}{rng.randint(10, 99)}-{rng.randint(100000, 999999)}"
            d.ask(place_, f"What serial number did the customer give in ticket {tickets[g]}?", serial)
            fact = f"Forgot to say: the serial number on the sticker underneath is {serial}."
        return Step(g, "get_ticket", {"ticket_id": tickets[g]},
                    thread(g, tickets[g], d.long() if fact else 3 * d.rows, products[g], problems[g], orders[g],
                           fact),
                    say=f"{people[g].split()[0]} reports that the {products[g][1]} {problems[g]}; the order is "
                    f"{orders[g]}. Checking the order first." if say else None)

    def history(g, place_, say):
        tid = old_tickets[g]
        text = thread(g, tid, 3 * d.rows - 2, rng.choice(PRODUCTS), rng.choice(PROBLEMS), old_orders[g],
                      status="closed")
        return Step(g, "get_ticket", {"ticket_id": tid}, text, say=rng.choice([
            "The earlier ticket was closed without a refund; same courier.",
            f"{tid} is an older, unrelated complaint; nothing to carry over."]) if say else None)

    def macro(g, place_, say):
        item, model, _ = products[g]
        slug = rng.choice(["damaged-on-arrival", "late-delivery", "duplicate-charge", "missing-parts", "wrong-item"])
        slug = slug if slug not in macros_read else f"{slug}-{len(macros_read)}"
        macros_read.append(slug)
        paras = ["Hi {{first_name}},", "Thank you for your patience, and I'm sorry about the trouble with your "
                 "{{product_name}}.", "I have checked your order {{order_id}} with our warehouse and the carrier.",
                 "Here is what happens next: we send a replacement by express delivery, and a prepaid return label "
                 "for the faulty one by email.", "You don't need to return anything before the replacement arrives.",
                 "If the carrier cannot deliver at a time that suits you, reply to this email with a better slot.",
                 "Your reference for this case is {{ticket_id}}; please keep it in any reply.",
                 "If anything is still not right, reply here and the same team will pick it up.",
                 "Kind regards,", "{{agent_name}}", "Customer care"]
        body = [line for p in paras for line in (p, "")][:max(3, 2 * d.rows - 2)]     # paragraphs, blank-separated
        text = "\n".join([f"# Macro: {slug.replace('-', ' ')}", f"Use for: {model} {item} and similar cases.", ""]
                          + body).rstrip()
        return Step(g, "read_policy", {"policy": f"macros/{slug}"}, text,
                    say="The macro fits; I'll adapt the second paragraph to this customer." if say else None)

    def events(k):
        steps = (["label_created", "picked_up"] + ["in_transit"] * max(0, k - 4) + ["at_depot", "out_for_delivery"])
        times = clock(rng.randint(0, 90))
        return [{"at": next(times).strftime("%Y-%m-%dT%H:%M:%SZ"), "status": st,
                 "location": rng.choice(["Venlo DC", "Duisburg hub", "Lyon depot", "Gdansk hub", "Malmö depot"]),
                 "detail": DETAILS[st]} for st in steps[-k:] if k]

    def order(g, place_, say, oid=None):
        oid = oid or orders[g]
        carrier, make = rng.choice(CARRIERS)
        tracking = make(rng)
        item, model, code = products[g] if oid == orders[g] else rng.choice(PRODUCTS)
        price = rng.randint(89, 1299) + rng.choice([0.0, 0.5, 0.9, 0.99])
        obj = {"order_id": oid, "status": rng.choice(["delivered", "in_transit", "out_for_delivery"]),
               "placed_at": iso(), "account_id": accounts[g],
               "items": [{"sku": f"{code}-{rng.randint(100, 999)}", "name": f"{model} {item}", "qty": 1,
                          "unit_price_eur": price}] + [
                   {"sku": f"ACC-{rng.randint(10, 99)}", "name": rng.choice(["descaler", "filter set", "spare brush"]),
                    "qty": rng.randint(1, 3), "unit_price_eur": rng.randint(5, 40) + 0.99} for _ in range(d.rows // 4)],
               "shipping": {"carrier": carrier, "tracking_number": tracking, "events": events(d.rows // 2 + 1)}}
        if place_ == "json":
            d.ask(place_, f"What is the tracking number of order {oid}?", tracking)
        if place_ == "recent":
            rma = f"RMA-{rng.randint(1000000, 9999999)}"
            obj["returns"] = [{"rma": rma, "status": "label_sent", "created_at": iso(), "reason": problems[g]}]
            d.ask(place_, f"What is the RMA number of the return on order {oid}?", rma)
        return Step(g, "lookup", {"kind": "order", "id": oid}, as_json(obj),
                    say=f"{oid} went out with {carrier}; the last scan is in the events list." if say else None)

    def order2(g, place_, say):
        return order(g, None, say, spare_orders.pop())

    def account(g, place_, say):
        while True:
            disputes, open_cents = [], 0
            for _ in range(2 + d.rows // 2):
                cents = rng.randint(1500, 90000)
                status = rng.choice(["open", "open", "won", "lost", "closed"])
                disputes.append({"id": f"DSP-{rng.randint(10000, 99999)}", "opened_at": iso(), "order_id":
                                 rng.choice(spare_orders), "amount_eur": cents / 100, "status": status,
                                 "reason": rng.choice(["item_not_received", "duplicate_charge", "damaged", "fraud"])})
                open_cents += cents * (status == "open")
            if sum(x["status"] == "open" for x in disputes) >= 2 and open_cents % 10:
                break
        total = f"{open_cents / 100:.2f}"
        opened = [x for x in disputes if x["status"] == "open"]
        oldest = min(opened, key=lambda x: x["opened_at"])["id"]
        obj = {"account_id": accounts[g], "name": people[g],
               "customer_since": f"{rng.randint(2015, 2023)}-{rng.randint(1, 12):02d}-01",
               "tier": rng.choice(["standard", "plus", "pro"]), "disputes": disputes,
               "recent_orders": [{"order_id": o, "placed_at": iso()[:10], "total_eur": rng.randint(20, 1400) + 0.9,
                                  "status": rng.choice(["delivered", "returned", "cancelled"])}
                                 for o in rng.sample(spare_orders, min(len(spare_orders), d.rows // 2))]}
        if place_:
            d.ask(place_, f"What total amount (EUR) of open disputes did you work out for account {accounts[g]}?",
                  total, "say")
        note = f"{accounts[g]} is a {obj['tier']} customer since {obj['customer_since'][:4]}." if say else None
        if place_:
            note = (f"{accounts[g]} has {len(opened)} open disputes totalling {total} EUR; the oldest is {oldest}. "
                    "I'll mention them before promising anything.")
        return Step(g, "lookup", {"kind": "account", "id": accounts[g]}, as_json(obj), say=note)

    def policy(g, place_, say):
        name = "refunds" if place_ else rng.choice([p for p in ["delivery", "warranty", "returns", "goodwill",
                                                                "damaged-goods", "chargebacks"]
                                                    if p not in policies_read] or ["escalation"])
        policies_read.append(name)
        text = _policy(rng, d.long() if place_ else d.medium(), name, shop, queues)
        if place_:
            queue = approval_queue
            d.ask(place_, "Which queue must you assign refunds that need team-lead approval to, per the refunds "
                  "policy?", queue)
            lines = text.split("\n")
            lines = fmt.put_middle(rng, lines, [i for i, line in enumerate(lines) if line.startswith("- ")],
                                   f"- Refunds above {rng.choice([150, 200, 250, 300])} EUR need team-lead approval: "
                                   f"assign the ticket to the `{queue}` queue and do not promise a date.")
            text = "\n".join(lines)
        return Step(g, "read_policy", {"policy": name}, text,
                    say=f"The {name} policy applies here; nothing in it blocks a resolution." if say else None)

    def opener(g):
        return rng.choice([f"Next ticket: {tickets[g]} from {people[g]}. Please handle it.",
                           f"Can you pick up {tickets[g]}? The customer has written twice already.",
                           f"{tickets[g]} is next in the queue; {people[g].split()[0]} is waiting on a reply."])

    def user_fact(g):
        d.ask("user", f"After what time does the customer of ticket {tickets[g]} want deliveries?", deliver_after,
              "user")
        return (f"Update on {tickets[g]}: {people[g].split()[0]} phoned in. Deliveries only after {deliver_after}, "
                "as they work mornings. Please make sure the courier gets that.")

    plans = _plan(size, [("ticket", "middle"), ("account", "assistant"), ("order", "json"), ("policy", "middle"),
                         ("user", "user")], "order", head=["ticket"],
                  fillers=["order", "account", "history", "policy", "macro", "order2", "order2"], tail=[],
                  order=["order", "account", "history", "policy", "macro", "order2"])
    _write(d, plans, dict(ticket=ticket, history=history, macro=macro, order=order, order2=order2,
                          account=account, policy=policy), opener, user_fact)
    task = (f"You're on the {shop} customer-support queue today. Work through the tickets "
            f"{', '.join(tickets)} one at a time: read the thread, check the order and account, follow the "
            "written policies, and tell me what you would do for each customer.")
    return Episode("support", seed, _shared()[1], task,
                   [tool("get_ticket", "Read a support ticket thread.", ticket_id="string"),
                    tool("lookup", "Look up a record as JSON; kind is order or account.", kind="string", id="string"),
                    tool("read_policy", "Read an internal policy document (markdown).", policy="string")],
                   d.steps, d.questions, d.facts)


_POLICY_RULES = [
    "Items returned within {n} days in their original packaging get a full refund.",
    "Opened small appliances can be returned within {n} days if they are unused and complete.",
    "Refund to the original payment method only; never to a different card or a bank transfer.",
    "Delivery complaints must be raised within {n} days of the carrier's delivered scan.",
    "For damaged goods, ask for photos of the item and of the outer box before anything else.",
    "Goodwill credit is capped at {n} EUR per customer per rolling year.",
    "Replacements ship express at no cost when the first item arrived damaged.",
    "Chargebacks go to the `{queue}` queue; do not refund an order with an open chargeback.",
    "Suspected fraud goes to the `{queue}` queue with the order id in the subject line.",
    "Warranty claims after {n} months need the serial number and the proof of purchase.",
    "If the carrier shows delivered but the customer disagrees, open a trace with the carrier first.",
    "Do not quote internal queue names or policy versions to customers.",
    "Customers with {n} or more returns in a year are reviewed by the `{queue}` team.",
    "Partial refunds need the customer's written agreement in the ticket.",
    "Escalate to a team lead when a customer mentions legal action or the press.",
    "Address changes after dispatch are handled by the `{queue}` queue with the carrier.",
]


def _policy(rng, budget: int, name: str, shop: str, queues: List[str]) -> str:
    """An internal policy document: sections of bullet rules up to ``budget`` lines.  Queue names come from
    ``queues``, which no longer holds the asked one: these are all distractors."""
    rules = rng.sample(_POLICY_RULES, len(_POLICY_RULES))
    sections, used = [], 2
    for heading in ["Scope", "Eligibility", "Approvals", "Special cases", "Escalation", "Record keeping"]:
        k = min(len(rules), max(2, (budget - 2) // 6))
        if used + 3 + k > budget or not rules:
            break
        body = [f"- {rules.pop().format(n=rng.choice([3, 14, 30, 45, 60]), queue=rng.choice(queues))}"
                for _ in range(k)]
        sections.append((heading, body))
        used += 3 + k
    title = f"{name.replace('-', ' ').title()} policy ({shop}, v{rng.randint(3, 9)}.{rng.randint(0, 9)})"
    return "\n".join(fmt.markdown(sections, title))


# ------------------------------------------------------------------------------------------------------ data

WAREHOUSES = ["analytics", "dwh_prod", "warehouse"]
PLANS = ["starter", "team", "business", "enterprise"]
REGIONS = ["emea", "na", "apac", "latam"]
COUNTRIES = ["DE", "FR", "GB", "NL", "SE", "ES", "IT", "PL", "US", "CA", "BR", "MX", "JP", "AU", "IN", "SG",
             "DK", "NO", "FI", "IE", "PT", "AT", "CH", "BE"]
# table: columns with their types (the first is the key)
TABLES = {
    "accounts": [("account_id", "bigint"), ("plan", "text"), ("region", "text"), ("country", "text"),
                 ("created_at", "timestamp with time zone"), ("mrr_eur", "numeric(10,2)"), ("seats", "integer"),
                 ("churned_at", "timestamp with time zone"), ("sales_owner", "text")],
    "subscriptions": [("subscription_id", "bigint"), ("account_id", "bigint"), ("plan", "text"),
                      ("started_at", "date"), ("ended_at", "date"), ("mrr_eur", "numeric(10,2)"),
                      ("billing_period", "text"), ("discount_pct", "numeric(5,2)")],
    "invoices": [("invoice_id", "bigint"), ("account_id", "bigint"), ("issued_at", "date"),
                 ("amount_eur", "numeric(12,2)"), ("status", "text"), ("paid_at", "date"), ("currency", "text")],
    "trials": [("trial_id", "bigint"), ("account_id", "bigint"), ("started_at", "date"),
               ("converted_at", "date"), ("days_to_convert", "numeric(6,2)"), ("source", "text")],
    "refunds": [("refund_id", "bigint"), ("invoice_id", "bigint"), ("amount_eur", "numeric(12,2)"),
                ("reason", "text"), ("created_at", "date"), ("approved_by", "text")],
    "events": [("event_id", "bigint"), ("account_id", "bigint"), ("name", "text"), ("ts", "timestamp"),
               ("properties", "jsonb")],
    "signups": [("signup_id", "bigint"), ("email_domain", "text"), ("created_at", "date"), ("utm_source", "text"),
                ("plan", "text")],
}
CATEGORIES = {"plan": PLANS, "region": REGIONS, "country": COUNTRIES,
              "status": ["paid", "open", "void", "uncollectible"], "currency": ["EUR", "USD", "GBP", "SEK"],
              "reason": ["duplicate", "requested_by_customer", "fraudulent", "service_outage", "downgrade"],
              "billing_period": ["monthly", "annual"], "source": ["organic", "paid_search", "partner", "referral"],
              "utm_source": ["google", "newsletter", "linkedin", "partner", "direct", "podcast", "g2"],
              "name": ["login", "invite_sent", "report_exported", "plan_changed", "seat_added", "api_key_created"],
              "sales_owner": ["a.khan", "j.berg", "m.rossi", "s.ito", "unassigned"],
              "approved_by": ["a.khan", "j.berg", "auto"], "email_domain": ["gmail.com", "outlook.com", "acme.io",
                                                                         "globex.com", "initech.de", "umbrella.co"]}
PIPELINES = ["orders_daily", "accounts_snapshot", "invoices_sync", "events_compaction", "trials_rollup"]


def _note(rng, i: int, column: str, ty: str) -> str:
    if i == 0:
        return "Primary key."
    if column.endswith("_id"):
        return f"Foreign key to {column[:-3]}s."
    if column in CATEGORIES:
        return "One of: " + ", ".join(CATEGORIES[column][:4]) + (", ..." if len(CATEGORIES[column]) > 4 else ".")
    if ty.startswith(("timestamp", "date")):
        return rng.choice(["UTC.", "Null while active.", "Set by the billing sync.", "Backfilled in 2022."])
    return rng.choice(["Includes discounts.", "Excludes VAT.", "Converted at the month-end rate.", "Never negative."])


def _data(rng: random.Random, seed: int, size: Size) -> Episode:
    d = Draft(rng, size)
    n = size.sub_goals
    wh = rng.choice(WAREHOUSES)
    shuffled = rng.sample(list(TABLES), len(TABLES))
    tables = [shuffled[g % len(shuffled)] for g in range(n)]
    cutoff = str(rng.randint(700000, 899999))
    jobs = [f"{p}-{rng.randint(1000, 9999)}" for p in rng.sample(PIPELINES, len(PIPELINES))]
    calls: set = set()

    def unique(code):
        """The call's arguments, made unique (the environment answers a call by its arguments)."""
        k = 2
        base = code
        while code in calls:
            code, k = f"{base}  # {k}", k + 1
        calls.add(code)
        return code

    def cell(col, ty):
        """A plausible value for a column, by its name and type (as pandas prints it)."""
        if col in CATEGORIES:
            return rng.choice(CATEGORIES[col])
        if ty == "bigint":
            return rng.randint(100000, 999999)
        if ty == "integer":
            return rng.randint(1, 400)
        if ty.startswith("numeric"):
            return round(rng.uniform(0, 40) if "pct" in col else rng.uniform(1, 4800), 2)
        day = datetime(2023, 1, 1) + timedelta(days=rng.randint(0, 540), seconds=rng.randint(0, 86399))
        if ty == "date":
            return day.strftime("%Y-%m-%d")
        if ty.startswith("timestamp"):
            return day.strftime("%Y-%m-%d %H:%M:%S") + ("+00:00" if "zone" in ty else "")
        return '{"v": 2}'

    def kinds(t, want):
        return [c for c, ty in TABLES[t] if want(ty)]

    def query(g, place_, say):
        t = tables[g]
        if d.rows >= len(TABLES[t]) and rng.random() < 0.5:     # \d has a fixed size: only in larger episodes
            cols = TABLES[t]
            w, tw = max(len(c) for c, _ in cols), max(len(ty) for _, ty in cols)
            lines = [f"Table \"public.{t}\"".center(w + tw + 30).rstrip(),
                     f" {'Column'.ljust(w)} | {'Type'.ljust(tw)} | Collation | Nullable | Default",
                     f"-{'-' * w}-+-{'-' * tw}-+-----------+----------+---------"]
            lines += [f" {c.ljust(w)} | {ty.ljust(tw)} |           | {'not null' if i == 0 else '':8} |"
                      for i, (c, ty) in enumerate(cols)]
            lines += ["Indexes:", f"    \"{t}_pkey\" PRIMARY KEY, btree ({cols[0][0]})"]
            return Step(g, "run_sql", {"query": unique(f"\\d {t}")}, "\n".join(lines),
                        say=f"{t} has {len(cols)} columns; {cols[0][0]} is the key." if say else None)
        when = kinds(t, lambda ty: ty in ("date", "timestamp") or ty.startswith("timestamp"))[0]
        amount = (kinds(t, lambda ty: ty.startswith("numeric")) or [None])[0]
        months = [(datetime(2024, 1, 1) + timedelta(days=31 * i)).strftime("%Y-%m-01")
                  for i in range(d.rows + d.rows // 2)]
        rows = [[mo, rng.randint(200, 9000)] + ([round(rng.uniform(1e4, 9e5), 2)] if amount else [])
                for mo in months]
        sql = (f"SELECT date_trunc('month', {when})::date AS month, count(*) AS n"
               + (f", sum({amount}) AS {amount}" if amount else "") + f" FROM {t} GROUP BY 1 ORDER BY 1;")
        return Step(g, "run_sql", {"query": unique(sql)},
                    fmt.psql_table(["month", "n"] + ([amount] if amount else []), rows),
                    say=f"Monthly volume in {t} is steady apart from the spike in {rng.choice(rows)[0][:7]}." if say
                    else None)

    def top(g, place_, say):
        t = tables[g]
        key = "account_id" if any(c == "account_id" for c, _ in TABLES[t]) else TABLES[t][0][0]
        amount = (kinds(t, lambda ty: ty.startswith("numeric")) or [None])[0]
        k = max(2, 2 * d.rows - 2)
        sql = (f"SELECT {key}, count(*) AS n" + (f", round(sum({amount}), 2) AS {amount}" if amount else "")
               + f" FROM {t} GROUP BY 1 ORDER BY 2 DESC LIMIT {k};")
        counts = sorted((rng.randint(40, 3000) for _ in range(k)), reverse=True)
        rows = [[rng.randint(100000, 999999), c] + ([round(c * rng.uniform(20, 400), 2)] if amount else [])
                for c in counts]
        return Step(g, "run_sql", {"query": unique(sql)},
                    fmt.psql_table([key, "n"] + ([amount] if amount else []), rows),
                    say=f"The top {key} values look like real customers, not test data." if say else None)

    def head(g, place_, say):
        t = tables[g]
        cols = [(c, ty) for c, ty in TABLES[t] if ty != "jsonb"][:6]
        k = max(3, 2 * d.rows - 2)
        code = f"df_{t} = pd.read_sql_table('{t}', engine)\ndf_{t}.head({k})"
        return Step(g, "run_python", {"code": unique(code)},
                    fmt.frame([c for c, _ in cols], [[cell(c, ty) for c, ty in cols] for _ in range(k)]),
                    say=f"The frame loads fine; {cols[0][0]} comes back as int64." if say else None)

    def counts(g, place_, say):
        t = tables[g]
        when = kinds(t, lambda ty: ty == "date" or ty.startswith("timestamp"))[0]
        k = max(2, 2 * d.rows - 2)
        months = [(datetime(2023, 7, 1) + timedelta(days=31 * i)).strftime("%Y-%m") for i in range(k)]
        code = f"df_{t}['{when}'].dt.to_period('M').value_counts().sort_index().tail({k})"
        return Step(g, "run_python", {"code": unique(code)},
                    fmt.value_counts(when, [(m, rng.randint(400, 9000)) for m in months]),
                    say=f"No empty months in {t}; volume roughly doubles over the period." if say else None)

    def describe(g, place_, say):
        t = tables[g]
        cols = kinds(t, lambda ty: ty.startswith("numeric") or ty == "integer")
        code = f"df_{t}[{cols!r}].describe()"
        if not cols:
            key = "account_id" if any(c == "account_id" for c, _ in TABLES[t]) else TABLES[t][1][0]
            cols, code = ["n"], f"df_{t}.groupby('{key}').size().to_frame('n').describe()"
        samples = [[float(cell(c, ty)) for _ in range(50)] for c, ty in TABLES[t] if c in cols] or [
            [float(rng.randint(1, 90)) for _ in range(50)]]
        extra = [0.01, 0.05, 0.1, 0.9, 0.95, 0.99][:max(0, d.rows - 6)]
        if extra:
            code = code.replace(".describe()", f".describe(percentiles={sorted(extra + [0.25, 0.5, 0.75])})")
        return Step(g, "run_python", {"code": unique(code)}, fmt.describe(cols, samples, extra),
                    say="Skewed; I'll use medians rather than means for this table." if say else None)

    def job(g, place_, say):
        jid = jobs.pop() if jobs else f"adhoc-{rng.randint(1000, 9999)}"
        written = rng.randint(1200000, 9800000)
        stages = []
        for name in ["extract", "validate", "dedupe", "enrich", "transform", "join_accounts", "aggregate",
                     "quality_checks", "load", "publish", "vacuum", "notify"][:max(2, d.rows - 2)]:
            stages.append({"name": name, "state": "SUCCEEDED", "rows_in": written + rng.randint(1000, 90000),
                           "rows_out": written + rng.randint(1000, 90000), "seconds": rng.randint(4, 900)})
        obj = {"job_id": jid, "pipeline": jid.rsplit("-", 1)[0], "state": "SUCCEEDED",
               "started_at": f"2024-06-{rng.randint(1, 28):02d}T02:{rng.randint(0, 59):02d}:00Z",
               "duration_s": sum(x["seconds"] for x in stages), "rows_read": written + rng.randint(20000, 200000),
               "rows_written": written, "rows_rejected": rng.randint(0, 4000), "stages": stages,
               "output_path": f"s3://{wh}-lake/{jid.rsplit('-', 1)[0]}/dt=2024-06-{rng.randint(1, 28):02d}/"
                              f"part-{rng.randint(0, 999):05d}.parquet"}
        if place_ == "json":
            d.ask(place_, f"How many rows did job {jid} write?", str(written))
        if place_ == "recent":
            d.ask(place_, f"What output_path did job {jid} report?", obj["output_path"])
        text = json.dumps(obj, indent=2)
        if rng.random() < 0.5 or text.count("\n") >= 4 * d.rows + 10:
            text = fmt.layered_json(obj, 1)
        return Step(g, "get_job_status", {"job_id": jid}, text,
                    say=f"{jid} succeeded with {obj['rows_rejected']} rejected rows; the data is fresh." if say
                    else None)

    def dictionary(g, place_, say):
        threshold = str(rng.randint(100100, 199900))
        d.ask(place_, "Below which account_id are accounts internal test accounts, per the data dictionary?",
              threshold)
        sections = []
        for t in rng.sample([t for t in TABLES if t != "accounts"], len(TABLES) - 1):
            sections.append([f"## {t}", ""] + [f"- `{c}` ({ty}): {_note(rng, i, c, ty)}" for i, (c, ty) in
                                                  enumerate(TABLES[t][:max(2, d.rows // 2)])] + [""])
        head = [f"# Data dictionary (warehouse `{wh}`, schema `public`)", ""]
        accounts = ["## accounts", "", f"- `account_id` (bigint): primary key. Ids below {threshold} are internal "
                    "test accounts; exclude them from every metric."] + [
            f"- `{c}` ({ty}): {_note(rng, 1, c, ty)}" for c, ty in TABLES["accounts"][1:max(2, d.rows // 2)]] + [""]
        while len(head) + sum(map(len, sections)) + len(accounts) > d.long() + 1 and len(sections) > 2:
            sections.pop()
        starts, pos = [], len(head)
        for sec in sections + [[]]:
            starts.append(pos)
            pos += len(sec)
        at = fmt.middle_index(rng, pos + len(accounts), [x + 2 for x in starts]) - 2
        sections.insert(starts.index(at), accounts)
        lines = head + [line for sec in sections for line in sec]
        return Step(g, "run_python", {"code": unique("print(open('docs/data_dictionary.md').read())")},
                    "\n".join(lines[:-1]), say="The dictionary explains the status columns; noted." if say else None)

    def series(g, place_, say):
        plan = rng.choice(PLANS)
        k = 2 * d.rows + 2
        while True:
            cents = sorted(rng.randint(50, 9000) for _ in range(k))
            mid = cents[k // 2 - 1] + cents[k // 2]
            if mid % 2:
                break
        median = f"{mid // 200}.{(mid % 200) * 5:03d}"
        d.ask("assistant", f"What median days_to_convert did you compute for {plan}-plan trials?", median, "say")
        code = (f"s = df_trials.loc[df_trials.plan == '{plan}', 'days_to_convert'].sort_values()"
                ".reset_index(drop=True)\nprint(s)")
        return Step(g, "run_python", {"code": unique(code)}, fmt.series([c / 100 for c in cents], "days_to_convert",
                                                                      "float64"),
                    say=f"For {plan}-plan trials the median days_to_convert is {median} (n={k}); the mean is pulled "
                    "up by a few slow enterprise deals, so I'll report the median.")

    def weekly(g, place_, say):
        k = max(12, 3 * d.rows + 3)
        start = datetime(2024, 1, 1) + timedelta(weeks=rng.randint(0, 20))
        weeks = [(start + timedelta(weeks=i)).strftime("%Y-%m-%d") for i in range(k)]
        rows = [[w, rng.randint(10000, 99999), rng.randint(1000, 9999), rng.randint(100, 999)] for w in weeks]
        at = fmt.middle_index(rng, k + 3, list(range(2, k + 2))) - 2
        d.ask(place_, f"In the weekly signups query, how many signups were counted for the week of {weeks[at]}?",
              str(rows[at][1]))
        sql = ("SELECT date_trunc('week', created_at)::date AS week, count(*) AS signups, "
               "count(*) FILTER (WHERE plan <> 'starter') AS paid, count(DISTINCT utm_source) AS sources "
               "FROM signups GROUP BY 1 ORDER BY 1;")
        return Step(g, "run_sql", {"query": unique(sql)},
                    fmt.psql_table(["week", "signups", "paid", "sources"], rows),
                    say="Weekly signups look seasonal; no gaps in the series." if say else None)

    def opener(g):
        t = tables[g]
        return rng.choice([f"Next stage: look at the {t} table and tell me whether it's usable for the review.",
                           f"Now the {t} data, please. Same checks as before.",
                           f"Moving on to {t}. Anything odd in there should go in the caveats section."])

    def user_fact(g):
        d.ask("user", "What cutoff id did I give you for the analysis?", cutoff, "user")
        return (f"Before you go further: use the fiscal year starting April 1, and only count accounts with an id "
                f"above the cutoff {cutoff} (older ones were migrated and are unreliable).")

    plans = _plan(size, [("dict", "middle"), ("series", "assistant"), ("job", "json"), ("weekly", "middle"),
                         ("user", "user")], "job", head=["query"],
                  fillers=["head", "counts", "top", "job", "describe", "query", "job"], tail=[],
                  order=["dict", "job", "head", "top", "series", "counts", "weekly", "describe", "query"])
    _write(d, plans, dict(query=query, head=head, counts=counts, describe=describe, job=job, dict=dictionary,
                          top=top, series=series, weekly=weekly), opener, user_fact)
    task = (f"We need the quarterly churn and conversion review from the `{wh}` warehouse. Work through the tables "
            f"{', '.join(dict.fromkeys(tables))} one at a time: check the nightly loads, profile the data, and "
            "compute the numbers I ask for. run_sql talks to Postgres; run_python has pandas and an `engine`.")
    return Episode("data", seed, _shared()[1], task,
                   [tool("run_sql", "Run a SQL query on the warehouse (psql output).", query="string"),
                    tool("run_python", "Run Python (pandas) in the analysis kernel; returns stdout.", code="string"),
                    tool("get_job_status", "Status of a pipeline job, as JSON.", job_id="string")],
                   d.steps, d.questions, d.facts)


def coding(seed: int, size: Size) -> Episode:
    return _generate("coding", seed, size, _coding)


def research(seed: int, size: Size) -> Episode:
    return _generate("research", seed, size, _research)


def support(seed: int, size: Size) -> Episode:
    return _generate("support", seed, size, _support)


def data(seed: int, size: Size) -> Episode:
    return _generate("data", seed, size, _data)


AGENT_FAMILIES: Dict[str, Callable[[int, Size], Episode]] = {"coding": coding, "research": research,
                                                              "support": support, "data": data}
