"""Key results, copied verbatim from the replaced history into the summary message (the extractive pass).

A small model asked to summarize pages of tool output summarizes the pages and drops the one line that
settles them (measured: fact recall 0.00 over 51 summaries on Qwen2.5-Coder-1.5B), and the deterministic
fallback summary carries no values at all.  So every summary message also lists, word for word, the lines
of the replaced span that state a result with a value — a number, an id, a path — and carries that list
from summary to summary (re-summarizing a summary makes facts decay).  No model is involved: what is
listed is exactly what the tools said.

What counts as a result (generic, no task knowledge):
- every line with a value of a *short* tool output (one or two lines: a status, a check, a total) —
  longer outputs and rows that start alike are data (file contents, pages of records, log lines) that
  the summary describes, not results;
- a line with a value of a long tool output, or of the assistant's own reply, when it also reads as a
  conclusion (total, final, result, verified, answer, ...);
- never a hedged line ("might be", "unverified", "maybe"): a summary must not turn a guess into a fact;
- never a label without its value: a line's last clause that ends on a colon, " =", an arrow or an
  ellipsis with no digit in it ("Settled total:", "**Total:**") is cut off, and a line left without a
  value is not a result (a reply cut at its token limit, a heading over the lines that follow);
- never the output of the session's own tools (``search_history`` echoes the history, the compaction
  tool's result is a notice);
- never an assistant reply written as a tool call the parser did not take (a call, not a statement:
  measured, Qwen2.5-Coder-1.5B wrote ``{{"name": "finish", "arguments": {"result": "R1 + R2 = 581`` as
  text, and the copied line made it answer 581 where the history said 9136).
Pure functions.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..summarizer import CALL_TAGS

RESULTS_HEADING = "Key results, copied verbatim from the history (where the summary above differs, these are right):"
SESSION_TOOLS = ("search_history", "compact_conversation")
SHORT_LINES = 2          # a tool output of at most this many non-empty lines ...
SHORT_CHARS = 480        # ... and characters is a result, not data
LONG_TAIL = 3            # a longer output's conclusion is in its last lines (a test run's summary line)
MAX_LINE_CHARS = 220     # a result line longer than this keeps its head and its tail
CLAIM = "(assistant)"    # the prefix of a result the assistant stated (not a tool)

_VALUE_RE = re.compile(
    r"(?<![\w.])(?:"
    r"\d{4}-\d{2}-\d{2}(?:T[\d:]+)?"                 # a date
    r"|[-+]?\d[\d,]*\.\d+%?"                         # a decimal: 12.5, -1,449.83
    r"|[-+]?\d{2,}[\d,]*%?"                          # a number of two digits or more: 42, 2026, 1,000
    r")(?![\w])"
    r"|\b(?=[\w.-]*\d)(?=[\w.-]*[A-Za-z])[A-Za-z0-9]+(?:[-_.][A-Za-z0-9]+)+\b"  # an id: ACC-1042, build_77, v1.2
    r"|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"                      # a hash
    r"|(?:[\w.-]+/)+[\w.-]+"                                                  # a path
)
# a reply that opens as a call: a call tag, or JSON naming a function and its arguments (JSON with a
# "name" and a value is an answer: {"name": "report", "total": 9136})
_UNPARSED_CALL_RE = re.compile(r'^\s*(?:' + CALL_TAGS + r'|(?:\{\s*)+"name"\s*:.*"(?:arguments|parameters)"\s*:)',
                               re.DOTALL)
_CONCLUSIVE_RE = re.compile(
    r"\b(total|totals|final|result|results|verified|settled|answer|answers|conclusion|concluded|confirmed|"
    r"checked|validated|established|resolved|fixed|passed|failed|balance|outcome|decided|found|equals?)\b",
    re.IGNORECASE)
_HEDGE_RE = re.compile(
    r"\b(might|maybe|perhaps|possibly|probably|likely|unlikely|unverified|unconfirmed|rumou?red?|allegedly|"
    r"guess(?:ed)?|estimated?|approximately|approx|roughly|seems?|appears?|apparently|suspect(?:ed)?|"
    r"may (?:be|have)|could be|i think|i believe|not sure|uncertain|unclear|tentative(?:ly)?)\b", re.IGNORECASE)
# lines of source code, not statements: an indented line, a keyword first, an assertion or a call
_CODE_RE = re.compile(r"^\s{2,}\S|^\s*(def|class|return|raise|assert|import|from|if|elif|else|for|while|try|except|"
                      r"with|function|const|let|var|public|private|static|#include)\b|[;{}]\s*$|[\w)\]]\s*[=!]=\s*[\w(\[\"']")
# not a sub-goal closing, whatever the values: failures, and work announced as still going on
_OPEN_RE = re.compile(r"\b(error|errors|exception|traceback|failed|failure|refused|timeout|timed out|warning|"
                      r"progress|page \d+ of|loading|loaded|running|pending|in progress|next page|call again|"
                      r"continue|continuing|remaining|partial)\b|\d+%", re.IGNORECASE)
_SPACE_RE = re.compile(r"\s+")
# a label left waiting for its value at the end of a line: its last clause has no digit and ends on a colon
# (ASCII or full-width), " =", an arrow, a dash or an ellipsis, before any emphasis, quote or closing tag.
# Only that clause is cut ("Final total: 4410. Breakdown:" keeps its value; "2001:db8::" and "drive D:",
# in a clause with a digit, are values)
_DANGLING_RE = re.compile(r"(?:^|(?<=[.;,!?(]))[^.;,!?(\d]*(?:[:\uff1a\uff1d]|\s=|->|\s-|\.\.\.|\u2026)"
                          r"[*_`\"'\s)\]]*(?:</\w+>)?[*_`\"'\s)\]]*$")


@dataclass(frozen=True)
class Result:
    tidx: int        # transcript index of the message it comes from
    line: str        # the line as listed: "- settle(account=ACC-1042): Settled total: 1,204.50"
    claim: bool      # the assistant's statement, not a tool's output (dropped first when over budget)
    conclusive: bool = False   # it reads as a conclusion (the probe's result cue needs one)


def values_of(text: str) -> List[str]:
    """The values in ``text``: numbers of two digits or more, decimals, dates, ids, hashes, paths."""
    return [m.group(0).rstrip(".,") for m in _VALUE_RE.finditer(text or "")]


def _clip(line: str) -> str:
    line = _SPACE_RE.sub(" ", line).strip()
    if len(line) <= MAX_LINE_CHARS:
        return line
    half = (MAX_LINE_CHARS - 3) // 2
    return line[:half].rstrip() + " … " + line[-half:].lstrip()


def _call_of(tc) -> Optional[Tuple[str, str, dict]]:
    """``(id, function name, arguments)`` of one assistant tool call, or None when it is malformed."""
    if not isinstance(tc, dict):
        return None
    f = tc.get("function", tc)
    f = f if isinstance(f, dict) else {}
    args = f.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            args = {}
    return str(tc.get("id", "")), str(f.get("name", "tool")), args if isinstance(args, dict) else {}


def _shape(line: str) -> str:
    """The first word with its digits as 0: rows of a table, a log or search hits share it."""
    return re.sub(r"\d", "0", (line.split() or [""])[0])


def _listing(lines: Sequence[str]) -> bool:
    """Records, not a statement: two or more lines that start alike (``tx``, ``Doc``, ``12:41``)."""
    return len(lines) >= 2 and len({_shape(x) for x in lines}) == 1


def _label(name: str, args: dict, line: str) -> str:
    """``name(arg=value, ...)`` with the arguments the line does not already show (at most 60 chars)."""
    shown = []
    for k, v in args.items():
        s = v if isinstance(v, str) else json.dumps(v)
        if str(s) not in line:
            shown.append(f"{k}={s}")
    label = f"{name}({', '.join(shown)})" if shown else name
    return label if len(label) <= 60 else f"{name}(…)"


def extract(messages: Sequence[Tuple[int, dict]], context: Sequence[dict] = ()) -> List[Result]:
    """The results stated in ``messages`` (``(transcript index, message)``, oldest first), in order.
    ``context``: the messages before them, whose tool calls may name a tool result's call.  A tool
    result is matched to the nearest call with its id before it (ids repeat: ``call_0`` after a restart)."""
    calls: Dict[str, Tuple[str, dict]] = {}
    for m in context:
        for c in filter(None, map(_call_of, m.get("tool_calls") or [])):
            calls[c[0]] = c[1:]
    out: List[Result] = []
    for tidx, m in messages:
        for c in filter(None, map(_call_of, m.get("tool_calls") or [])):
            calls[c[0]] = c[1:]
        out.extend(_results_of(tidx, m, calls))
    return out


def _results_of(tidx: int, m: dict, calls: Dict[str, Tuple[str, dict]]) -> List[Result]:
    role, content = m.get("role"), m.get("content")
    if m.get("summary") or role not in ("tool", "assistant") or not isinstance(content, str):
        return []
    lines = [x for x in content.split("\n") if x.strip()]
    short = len(lines) <= SHORT_LINES and len(content) <= SHORT_CHARS and not _listing(lines)
    if role == "tool":
        name, args = calls.get(str(m.get("tool_call_id", "")), (m.get("name") or "tool", {}))
        if name in SESSION_TOOLS or m.get("name") in SESSION_TOOLS:
            return []
    elif not short or _UNPARSED_CALL_RE.search(content):
        return []   # the assistant's long replies are reasoning, its unparsed calls requests: not results
    out = []
    shapes = Counter(_shape(x) for x in lines)
    for raw in (lines if short else lines[-LONG_TAIL:]):
        flat = _DANGLING_RE.sub("", " ".join(raw.split())).rstrip()
        if not values_of(flat) or _HEDGE_RE.search(flat) or _CODE_RE.search(raw):
            continue
        if not short and shapes[_shape(raw)] >= 3:
            continue   # one more row of a table or a log, not its conclusion
        conclusive = bool(_CONCLUSIVE_RE.search(flat))
        sentence = len(flat) <= MAX_LINE_CHARS   # a longer line is data (a listing)
        line = _clip(flat)
        if role == "tool" and ((short and sentence) or conclusive):
            out.append(Result(tidx, f"- {_label(name, args, line)}: {line}", False, conclusive))
        elif role == "assistant" and conclusive:
            out.append(Result(tidx, f"- {CLAIM} {line}", True, True))
    return out


def states_result(messages: Sequence[dict]) -> bool:
    """Does the newest tool output (the tool messages after the last other message) close a sub-goal with
    a result: a conclusive line with a value, no failure, nothing announced as still going on?  The
    probe's ``result_cue`` (``Policy``) rests on this: a stricter test than what the summary lists."""
    tail: List[dict] = []
    for m in reversed(messages):
        if m.get("role") != "tool":
            break
        tail.append(m)
    if not tail:
        return False
    tail.reverse()
    if any(_OPEN_RE.search(m.get("content") or "") for m in tail if isinstance(m.get("content"), str)):
        return False
    found = extract(list(enumerate(tail)), messages[:len(messages) - len(tail)])
    return any(r.conclusive and not r.claim for r in found)


def _key(line: str) -> str:
    return _SPACE_RE.sub(" ", line.lstrip("-*• ")).strip().lower()


def merge(carried: Sequence[str], new: Iterable[Result]) -> List[str]:
    """``carried`` (an earlier summary's list) then the new results, without duplicates; an assistant's
    statement whose values all appear in a listed tool result is a restatement and is left out."""
    out, seen, tool_values = [], set(), set()
    for line in carried:
        if _key(line) not in seen:
            seen.add(_key(line))
            out.append(line)
            if not line.startswith(f"- {CLAIM}"):
                tool_values.update(values_of(line))
    new = list(new)
    for r in new:
        if not r.claim:
            tool_values.update(values_of(r.line))
    for r in new:
        k = _key(r.line)
        if k in seen or (r.claim and set(values_of(r.line)) <= tool_values):
            continue
        seen.add(k)
        out.append(r.line)
    return out


def fit(lines: Sequence[str], budget: int, count: Callable[[str], int], left_out: int = 0
        ) -> Tuple[List[str], int]:
    """``(kept, left_out)``: ``lines`` within ``budget`` tokens, as :func:`section` renders them with the
    count of results already left out by earlier summaries (``left_out``).  Over budget, the assistant's
    statements go first, then the oldest results (the history file and ``search_history`` still hold
    them: the section says how many).  Each line is counted once (a long list is not re-counted per
    dropped line)."""
    lines = list(lines)
    fixed = count(section([], left_out + len(lines), True)) + 1   # the heading and the note, at their largest
    sizes = [count(x) + 1 for x in lines]
    order = [i for i, x in enumerate(lines) if x.startswith(f"- {CLAIM}")] + \
            [i for i, x in enumerate(lines) if not x.startswith(f"- {CLAIM}")]
    total, gone = fixed + sum(sizes), set()
    for i in order:
        if total <= budget:
            break
        gone.add(i)
        total -= sizes[i]
    kept = [x for i, x in enumerate(lines) if i not in gone]
    left = left_out + len(gone)
    while kept and count(section(kept, left, True)) > budget:   # the estimate was off (merged tokens)
        kept.pop(0)
        left += 1
    if not kept and count(section([], left, True)) > budget:
        return [], 0   # not even the note fits: nothing is listed (the history file holds them all)
    return kept, left


def section(lines: Sequence[str], dropped: int = 0, searchable: bool = False) -> str:
    """The summary message's results section ("" when there is nothing to list); ``dropped``: how many
    results earlier summaries and this one left out for space."""
    if not lines and not dropped:
        return ""
    body = list(lines)
    if dropped:
        where = "search_history finds them" if searchable else "they are in the history file"
        body.append(f"({dropped} earlier results left out for space; {where}.)")
    return RESULTS_HEADING + "\n" + "\n".join(body)


__all__ = ["RESULTS_HEADING", "Result", "values_of", "extract", "states_result", "merge", "fit", "section"]
