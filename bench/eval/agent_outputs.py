"""Tool-output formats for the agent families (agent_families.py): Python sources, pytest runs, git, JSON,
psql tables, pandas reprs, ticket threads, markdown documents, search results and web pages.

Every long format takes a line budget that the family derives from ``Size.rows``, so an episode grows
linearly with rows.  Where a format carries an asked value "in the middle", the value goes at the candidate
line nearest a random point in the middle 40-60% of the text (``middle_index``): deep enough that nobody
skimming the head or tail of the output sees it.
"""
from __future__ import annotations

import json
import textwrap
from typing import Iterable, List, Optional, Sequence, Tuple

WIDTH = 80
ROOT = "/home/agent/work"


def sha(rng, n: int = 7) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def bar(title: str = "", ch: str = "=") -> str:
    return f" {title} ".center(WIDTH, ch) if title else ch * WIDTH


def middle_index(rng, n_lines: int, candidates: Sequence[int]) -> int:
    """The candidate line nearest a random point in the middle of an ``n_lines`` text."""
    target = rng.uniform(0.4, 0.6) * n_lines
    return min(candidates, key=lambda i: abs(i - target))


def layered_json(obj, flat_below: int, _depth: int = 0) -> str:
    """JSON indented by two spaces down to depth ``flat_below`` and compact beneath it: one record a line,
    as many APIs and ``jq`` pipelines print it.  ``json.loads`` reads it back."""
    if _depth >= flat_below or not isinstance(obj, (dict, list)) or not obj:
        return json.dumps(obj, ensure_ascii=False)
    pad, end = "  " * (_depth + 1), "  " * _depth
    if isinstance(obj, dict):
        items = [f"{pad}{json.dumps(k)}: {layered_json(v, flat_below, _depth + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    return "[\n" + ",\n".join(pad + layered_json(v, flat_below, _depth + 1) for v in obj) + "\n" + end + "]"


# ----------------------------------------------------------------------------------------------- Python code

VERBS = ["load", "parse", "build", "apply", "normalize", "validate", "resolve", "merge", "split", "settle",
         "schedule", "render", "collect", "refresh", "reconcile", "encode"]
NOUNS = ["payload", "batch", "entry", "record", "request", "invoice", "amount", "event", "window", "cursor",
         "ledger", "receipt", "quote", "token", "refund", "line_items"]
FIELDS = ["account_id", "currency", "amount_minor", "batch_id", "merchant_id", "status", "attempts",
          "created_at", "region", "sku"]

# Function templates, 2 to 10 lines; the fields are filled per module so no two files read alike.
_FUNCS = [
    '''def {fn}({arg}: Iterable[dict]) -> list:
    """{Doc}."""
    out = []
    for item in {arg}:
        if item.get("status") == "void":
            continue
        out.append({helper}(item))
    return out''',
    '''def {fn}({arg}, limit: int = {small}) -> dict:
    attempt = 0
    while True:
        try:
            return {arg}()
        except TransientError as exc:
            attempt += 1
            if attempt >= limit:
                raise RetryExhausted("{fn}") from exc
            log.warning("{fn}: %s (attempt %d)", exc, attempt)''',
    '''def {fn}(amount: Decimal, currency: str) -> Decimal:
    places = CURRENCY_PLACES.get(currency, 2)
    quantum = Decimal(1).scaleb(-places)
    return amount.quantize(quantum, rounding=ROUND_HALF_UP)''',
    '''def {fn}(value: str) -> str:
    return value.strip().lower().replace(" ", "_")''',
    '''@dataclass(frozen=True)
class {Cls}:
    id: str
    {field}: int
    status: str = "pending"

    def is_final(self) -> bool:
        return self.status in ("settled", "void")''',
    '''def {fn}(rows: Iterable[dict]) -> dict:
    totals: dict = defaultdict(int)
    for row in rows:
        totals[row["{field}"]] += row.get("quantity", 1)
    return dict(totals)''',
    '''def {fn}({arg}: dict, *, strict: bool = False) -> Optional[str]:
    """{Doc}."""
    key = {arg}.get("{field}")
    if key is None and strict:
        raise KeyError("{field}")
    return key''',
    '''def {fn}(items: list, size: int = {small}) -> Iterable[list]:
    for start in range(0, len(items), size):
        yield items[start:start + size]''',
    '''def {fn}(self_check: bool = False) -> None:
    """{Doc}."""
    if self_check and not _REGISTRY:
        raise RuntimeError("registry is empty")
    for name, handler in sorted(_REGISTRY.items()):
        log.debug("registered %s -> %s", name, handler.__qualname__)''',
]
_DOCS = ["Drop void entries and convert the rest", "Return the key the downstream queue expects",
         "Log what is registered, for the startup banner", "Keep the legacy ordering for old clients"]


def _fill(template: str, rng, module: str) -> List[str]:
    names = dict(fn=f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}", arg=rng.choice(NOUNS),
                 helper=f"_{rng.choice(VERBS)}_{rng.choice(NOUNS)}", field=rng.choice(FIELDS),
                 Cls=f"{module.title().replace('_', '')}{rng.choice(['State', 'Entry', 'Job', 'Snapshot'])}",
                 small=rng.choice([3, 4, 5, 8, 16, 50, 100]), Doc=rng.choice(_DOCS))
    return template.format(**names).split("\n")


def python_source(rng, budget: int, module: str, doc: str, consts: Sequence[Tuple[str, str]],
                  fact: Optional[Tuple[str, str, str]] = None) -> str:
    """A module of about ``budget`` lines: docstring, the imports its functions use, constants, functions.
    ``fact`` is (NAME, value, comment): a constant defined next to the code that uses it, mid-file."""
    blocks: List[List[str]] = []
    room = budget - (8 if budget >= 15 else 5) - len(consts) - (4 if fact else 0)
    while True:
        fits = [t for t in _FUNCS if t.count("\n") + 3 <= room] or ([] if blocks else [min(_FUNCS, key=len)])
        if not fits:
            break
        blocks.append(_fill(rng.choice(fits), rng, module))
        room -= len(blocks[-1]) + 2
    code = "\n".join("\n".join(b) for b in blocks)
    imports = [line for line, used in (
        ("from collections import defaultdict", "defaultdict" in code),
        ("from dataclasses import dataclass", "@dataclass" in code),
        ("from decimal import ROUND_HALF_UP, Decimal", "Decimal" in code),
        ("from typing import Iterable, Optional", "Iterable" in code or "Optional" in code)) if used]
    if "TransientError" in code:
        imports += ["", "from .errors import RetryExhausted, TransientError"]
    lines = ([f'"""{doc}"""', "from __future__ import annotations", ""] if budget >= 15 else []) + [
        "import logging"] + imports + ["", "log = logging.getLogger(__name__)"] + [f"{k} = {v}" for k, v in consts]
    starts = []
    for body in blocks:
        lines += ["", ""]
        starts.append(len(lines))
        lines += body
    if fact:
        name, value, comment = fact
        at = middle_index(rng, len(lines) + 4, starts or [len(lines)])
        lines[at:at] = [f"# {comment}", f"{name} = {value}", "", ""]
    return "\n".join(lines)


def test_source(rng, budget: int, module: str, func: str, tests: Sequence[str]) -> str:
    lines = ["import pytest", "", f"from app.{module} import {func}", f"from tests.factories import make_{module}"]
    for name in tests:
        if len(lines) + 7 > budget and len(lines) > 4:
            break
        field = rng.choice(FIELDS)
        lines += ["", "", f"def {name}():", f"    obj = make_{module}({field}={rng.randint(1, 900)})"]
        lines += [f"    obj.{rng.choice(FIELDS)} = {rng.choice(['None', '0', repr('EUR'), repr('JPY')])}"]
        lines += [f"    result = {func}(obj)", f"    assert result == {rng.randint(2, 999)}"]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ pytest

def failure(path: str, test: str, setup: Sequence[str], check: str, e_lines: Sequence[str], lineno: int,
            exc: str = "AssertionError", tb_short: bool = False) -> dict:
    """One failure as pytest shows it: the test's source, the failing line marked '>', then the E lines
    (``--tb=short``: only the failing line and the first E line)."""
    if tb_short:
        body = [f"{path}:{lineno}: in {test}", f"    {check}", f"E   {e_lines[0]}"]
    else:
        body = [f"    def {test}():"] + [f"        {s}" for s in setup] + [f">       {check}"] + [
            f"E       {e}" for e in e_lines]
    return {"path": path, "test": test, "exc": exc, "lineno": lineno, "short": e_lines[0], "body": body,
            "tb_short": tb_short}


def pytest_run(files: Sequence[Tuple[str, str]], failures: Sequence[dict] = (),
               warnings: Sequence[Tuple[str, str, str]] = (), *, quiet: bool = False, seconds: float = 1.0) -> str:
    """A pytest session: ``files`` are (path, marks) with marks like '..F.'; warnings are (test id,
    location: message, source line)."""
    total = sum(len(m) for _, m in files)
    out = [] if quiet else [bar("test session starts"), "platform linux -- Python 3.11.9, pytest-8.2.2, pluggy-1.5.0",
                            f"rootdir: {ROOT}", "configfile: pyproject.toml",
                            "plugins: cov-5.0.0, repeat-0.9.3, xdist-3.6.1", f"collected {total} items", ""]
    done = 0
    if quiet:
        marks = "".join(m for _, m in files)
        for i in range(0, len(marks), 72):
            done += len(marks[i:i + 72])
            out.append(_progress("", marks[i:i + 72], done * 100 // total))
    else:
        for path, marks in files:
            done += len(marks)
            out.append(_progress(path, marks, done * 100 // total))
    if failures:
        out += ["", bar("FAILURES")]
        for f in failures:
            out += [bar(f["test"], "_")] + (f["body"] if f["tb_short"] else (
                [""] + f["body"] + ["", f"{f['path']}:{f['lineno']}: {f['exc']}"]))
    if warnings:
        out.append(bar("warnings summary"))
        for where, message, source in warnings:
            out += [where, f"  {message}", f"    {source}", ""]
        out.append("-- Docs: https://docs.pytest.org/en/stable/how-to/capture-warnings.html")
    if failures:
        out.append(bar("short test summary info"))
        out += [f"FAILED {f['path']}::{f['test']} - {f['short']}" for f in failures]
    n_failed = sum(m.count("F") for _, m in files)
    parts = ([f"{n_failed} failed"] if n_failed else []) + [f"{total - n_failed} passed"]
    if warnings:
        parts.append(f"{len(warnings)} warning{'s' * (len(warnings) > 1)}")
    summary = f"{', '.join(parts)} in {seconds:.2f}s"
    out.append(summary if quiet else bar(summary))
    return "\n".join(out)


def pytest_repeat(path: str, test: str, count: int, failed_at: Sequence[int], rng) -> str:
    """``pytest -q --count N --tb=no -rf`` on one test (pytest-repeat): the marks, then one line a failure."""
    marks = "".join("F" if i in failed_at else "." for i in range(1, count + 1))
    out = [_progress("", marks[i:i + 72], min(count, i + 72) * 100 // count) for i in range(0, count, 72)]
    out += [bar("short test summary info")] + [
        f"FAILED {path}::{test}[{i}-{count}] - assert {rng.uniform(0.301, 0.399):.3f} <= 0.3" for i in failed_at]
    out.append(f"{len(failed_at)} failed, {count - len(failed_at)} passed in {rng.uniform(2, 12):.2f}s")
    return "\n".join(out)


def _progress(label: str, marks: str, pct: int) -> str:
    head = f"{label} {marks}" if label else marks
    tag = f"[{pct:3d}%]"
    return head + " " * max(1, WIDTH - len(head) - len(tag)) + tag


# --------------------------------------------------------------------------------------------------- git

def git_log(entries: Sequence[Tuple[str, str]], decorations: Sequence[str] = ()) -> str:
    """``git log --oneline``: entries are (sha, subject); decorations go on the first lines, in order."""
    out = []
    for i, (h, subject) in enumerate(entries):
        deco = f" ({decorations[i]})" if i < len(decorations) and decorations[i] else ""
        out.append(f"{h}{deco} {subject}")
    return "\n".join(out)


def git_diff(rng, files: Sequence[Tuple[str, str]], hunks: int, context: int = 3) -> str:
    """``git diff -U<context>`` of small edits to each (path, source) file: ``hunks`` hunks in all."""
    out = []
    for k, (path, source) in enumerate(files):
        lines = source.split("\n")
        n = max(1, hunks // len(files) + (k < hunks % len(files)))
        out += [f"diff --git a/{path} b/{path}", f"index {sha(rng)}..{sha(rng)} 100644", f"--- a/{path}",
                f"+++ b/{path}"]
        inner = [i for i, line in enumerate(lines) if line.startswith("    ") and 3 <= i < len(lines) - 3]
        fixable = [i for i in inner if any(a in lines[i] for a, _ in _EDITS)]
        chosen = sorted(rng.sample(fixable, min(n, len(fixable))) or rng.sample(inner, min(n, len(inner))))
        for at in [a for i, a in enumerate(chosen) if i == 0 or a - chosen[i - 1] > 2 * context + 1]:
            old, new = lines[at], _edit(rng, lines[at])
            func = next((line for line in reversed(lines[:at]) if line.startswith(("def ", "class "))), "")
            c = context
            out.append(f"@@ -{at + 1 - c},{2 * c + 1} +{at + 1 - c},{2 * c + len(new)} @@ {func}".rstrip())
            out += [" " + line for line in lines[at - c:at]] + ["-" + old] + ["+" + line for line in new]
            out += [" " + line for line in lines[at + 1:at + 1 + c]]
    return "\n".join(out)


# Edits a bug fix plausibly makes to the function templates above (and to test assertions).
_EDITS = [("rounding=ROUND_HALF_UP", "rounding=ROUND_HALF_EVEN"), ("attempt >= limit", "attempt > limit"),
          (".get(currency, 2)", ".get(currency.upper(), 2)"), ('== "void"', 'in ("void", "refunded")'),
          ("range(0, len(items), size)", "range(0, len(items), max(1, size))"),
          ('+= row.get("quantity", 1)', '+= int(row.get("quantity") or 1)'),
          ("value.strip().lower()", "value.strip().casefold()"), ("key is None and strict", "not key and strict"),
          ("obj.currency = None", "obj.currency = 'EUR'"), ("= 'JPY'", "= 'KWD'")]


def _edit(rng, line: str) -> List[str]:
    for a, b in _EDITS:
        if a in line:
            return [line.replace(a, b)]
    indent = line[:len(line) - len(line.lstrip())]
    return [indent + rng.choice(['log.debug("%s", locals())', "# clients rely on this order",
                                 'metrics.incr("path.taken")']), line]


def git_status(branch: str, modified: Sequence[str], untracked: Sequence[str] = ()) -> str:
    out = [f"On branch {branch}", f"Your branch is up to date with 'origin/{branch}'.", "",
           "Changes not staged for commit:", '  (use "git add <file>..." to update what will be committed)',
           '  (use "git restore <file>..." to discard changes in working directory)']
    out += [f"\tmodified:   {p}" for p in modified]
    if untracked:
        out += ["", "Untracked files:", '  (use "git add <file>..." to include in what will be committed)']
        out += [f"\t{p}" for p in untracked]
    out += ["", 'no changes added to commit (use "git add" and/or "git commit -a")']
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------ markdown

def markdown(sections: Sequence[Tuple[str, Sequence[str]]], title: str) -> List[str]:
    out = [f"# {title}"]
    for heading, body in sections:
        out += ["", f"## {heading}", ""] + list(body)
    return out


def put_middle(rng, lines: List[str], slots: Sequence[int], line: str) -> List[str]:
    """``lines`` with the slot nearest the middle replaced by ``line``."""
    at = middle_index(rng, len(lines), slots)
    return lines[:at] + [line] + lines[at + 1:]


# ------------------------------------------------------------------------------------- tables and pandas

def psql_table(columns: Sequence[str], rows: Sequence[Sequence]) -> str:
    """psql's aligned format: headers centred, numbers right-aligned, text left-aligned, then (N rows)."""
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(r[i], (int, float)) for r in rows) for i in range(len(columns))]
    out = [" " + " | ".join(c.center(w) for c, w in zip(columns, widths)).rstrip(),
           "+".join("-" * (w + 2) for w in widths)]
    for r in cells:
        out.append(" " + " | ".join(v.rjust(w) if numeric[i] else v.ljust(w)
                                    for i, (v, w) in enumerate(zip(r, widths))).rstrip())
    out.append(f"({len(rows)} row{'s' * (len(rows) != 1)})")
    return "\n".join(out)


def _cell(v) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def frame(columns: Sequence[str], rows: Sequence[Sequence], index: Optional[Sequence] = None) -> str:
    """A pandas DataFrame repr: index left, every column right-aligned under its header."""
    idx = [str(i) for i in (index if index is not None else range(len(rows)))]
    iw = max(len(i) for i in idx) if idx else 0
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    out = [" " * iw + "  " + "  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    out += [i.ljust(iw) + "  " + "  ".join(v.rjust(w) for v, w in zip(r, widths)) for i, r in zip(idx, cells)]
    return "\n".join(out)


def describe(columns: Sequence[str], samples: Sequence[Sequence[float]], extra: Sequence[float] = ()) -> str:
    """``df.describe()`` of numeric columns, computed from the samples (``extra``: more percentiles)."""
    ps = sorted(set(extra) | {0.25, 0.5, 0.75})
    stats = ["count", "mean", "std", "min"] + [f"{p * 100:g}%" for p in ps] + ["max"]
    rows = []
    for s in samples:
        v = sorted(s)
        n = len(v)
        mean = sum(v) / n
        std = (sum((x - mean) ** 2 for x in v) / max(1, n - 1)) ** 0.5
        rows.append([float(n), mean, std, v[0]] + [_quantile(v, p) for p in ps] + [v[-1]])
    table = [[f"{r[k]:.6f}" for r in rows] for k in range(len(stats))]
    return frame(columns, table, stats)


def _quantile(v: Sequence[float], p: float) -> float:
    pos = p * (len(v) - 1)
    lo = int(pos)
    return v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * (pos - lo)


def series(values: Sequence, name: str, dtype: str) -> str:
    """A pandas Series repr (short enough that pandas prints every row)."""
    cells = [_cell(v) for v in values]
    iw, vw = len(str(len(values) - 1)), max(len(c) for c in cells)
    return "\n".join([f"{i:<{iw}}    {c:>{vw}}" for i, c in enumerate(cells)] + [f"Name: {name}, dtype: {dtype}"])


def value_counts(name: str, counts: Sequence[Tuple[str, int]]) -> str:
    kw = max([len(name)] + [len(k) for k, _ in counts])
    vw = max(len(str(c)) for _, c in counts)
    return "\n".join([name] + [f"{k:<{kw}}    {c:>{vw}}" for k, c in counts] + ["Name: count, dtype: int64"])


# ------------------------------------------------------------------------------------ pages and threads

def wrap(paragraphs: Iterable[str], width: int = 96) -> List[str]:
    out: List[str] = []
    for p in paragraphs:
        if out:
            out.append("")
        out += textwrap.wrap(p, width, break_long_words=False, break_on_hyphens=False)
    return out


def page(rng, header: Sequence[str], paragraphs: Iterable[str], budget: int, fact: Optional[str] = None) -> str:
    """A fetched page as text: header lines, then paragraphs wrapped at 80 columns up to ``budget`` lines;
    ``fact`` is a paragraph put at the paragraph break nearest the middle."""
    extra = len(wrap([fact], 80)) + 1 if fact else 0
    blocks: List[List[str]] = []
    for p in paragraphs:
        block = wrap([p], 80)
        if blocks and len(header) + sum(len(b) + 1 for b in blocks) + len(block) + 1 + extra > budget:
            break
        blocks.append(block)
    if fact:
        starts, pos = [], len(header)
        for b in blocks + [[]]:
            starts.append(pos + 1)
            pos += len(b) + 1
        at = middle_index(rng, pos + extra, starts)
        blocks.insert(starts.index(at), wrap([fact], 80))
    lines = list(header)
    for b in blocks:
        lines += [""] + b
    return "\n".join(lines)


def ticket_thread(header: Sequence[str], messages: Sequence[Tuple[str, str, Sequence[str]]]) -> List[str]:
    """A helpdesk thread: header lines, then each (timestamp, author, body lines) under a rule."""
    out = list(header)
    for ts, author, body in messages:
        out += ["", f"--- {ts} · {author} ---"] + list(body)
    return out
