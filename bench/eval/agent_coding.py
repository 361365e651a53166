"""The coding family: a coding agent fixing bugs in a repository: source files, pytest runs, git, CONTRIBUTING.md, coverage.json."""
from __future__ import annotations

import json
import random
import re
from typing import Dict, Sequence

from . import agent_outputs as fmt
from .agent_draft import Draft, pick, plan, shared, write_steps
from .episode import Episode, Size, Step, tool


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


def build_coding(rng: random.Random, seed: int, size: Size) -> Episode:
    d = Draft(rng, size)
    repo, pkg = rng.choice(REPOS)
    n = size.sub_goals
    mods = pick(rng, MODULES, 3 * n + 8)
    goal_mods, spare = mods[:n], mods[n:]
    issues = rng.sample(range(4100, 4990), n)
    cases = [pick(rng, CASES, 3) for _ in range(n)]
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

    plans = plan(size, [("src", "middle"), ("flaky", "assistant"), ("cov", "json"), ("contrib", "middle"),
                         ("user", "user")], "src", head=["fail"],
                  fillers=lambda g: ["src", "status", "log", "tests_src", "src2"] if g == 1 else
                  ["src", "log", "tests_src", "src2", "src2"], tail=["diff", "pass"],
                  order=["src", "log", "flaky", "tests_src", "cov", "contrib", "src2", "status"])
    makers = {"fail": fail, "src": src, "src2": extra_src, "log": log, "tests_src": tests_src, "flaky": flaky,
              "cov": cov, "contrib": contrib, "diff": diff, "pass": passed, "status": status}
    write_steps(d, plans, makers, opener, user_fact)
    task = (f"You're working in the {repo} repository (Python 3.11, pytest). CI on main has been red since last "
            f"week's merges. Work through the open issues {', '.join(f'#{i}' for i in issues)} one at a time: find "
            "the cause, make the smallest fix, and run the relevant tests. Follow CONTRIBUTING.md. I'll check in.")
    return Episode("coding", seed, shared()[1], task,
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
