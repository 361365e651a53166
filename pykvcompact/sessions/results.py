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
- never the output of the session's own tools (``search_history`` echoes the history, the compaction
  tool's result is a notice).
Pure functions.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

RESULTS_HEADING = "Key results, copied verbatim from the history:"
SESSION_TOOLS = ("search_history", "compact_conversation")
SHORT_LINES = 2          # a tool output of at most this many non-empty lines ...
SHORT_CHARS = 480        # ... and characters is a result, not data
MAX_LINE_CHARS = 220     # a result line longer than this keeps its head and its tail
CLAIM = "(assistant)"    # the prefix of a result the assistant stated (not a tool)

_NUMBER = r"[-+]?\d[\d,]*(?:\.\d+)?%?"
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
_CONCLUSIVE_RE = re.compile(
    r"\b(total|totals|final|result|results|verified|settled|answer|answers|conclusion|concluded|confirmed|"
    r"established|resolved|fixed|passed|failed|balance|outcome|decided|found|equals?)\b",
    re.IGNORECASE)
_HEDGE_RE = re.compile(r"\b(might|maybe|perhaps|possibly|probably|unverified|unconfirmed|rumou?red?|allegedly|"
                       r"guess|could be|not sure|uncertain|unclear)\b", re.IGNORECASE)
_SPACE_RE = re.compile(r"\s+")


@dataclass(frozen=True)
class Result:
    tidx: int        # transcript index of the message it comes from
    line: str        # the line as listed: "- settle(account=ACC-1042): Settled total: 1,204.50"
    claim: bool      # the assistant's statement, not a tool's output (dropped first when over budget)


def values_of(text: str) -> List[str]:
    """The values in ``text``: numbers of two digits or more, decimals, dates, ids, hashes, paths."""
    return [m.group(0).rstrip(".,") for m in _VALUE_RE.finditer(text or "")]


def _clip(line: str) -> str:
    line = _SPACE_RE.sub(" ", line).strip()
    if len(line) <= MAX_LINE_CHARS:
        return line
    half = (MAX_LINE_CHARS - 3) // 2
    return line[:half].rstrip() + " … " + line[-half:].lstrip()


def _calls(messages: Sequence[dict]) -> Dict[str, Tuple[str, dict]]:
    """tool_call_id -> (function name, arguments) of every assistant tool call in ``messages``."""
    out: Dict[str, Tuple[str, dict]] = {}
    for m in messages:
        for tc in m.get("tool_calls") or []:
            if not isinstance(tc, dict):
                continue
            f = tc.get("function", tc) if isinstance(tc.get("function", tc), dict) else {}
            args = f.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    args = {}
            out[str(tc.get("id", ""))] = (str(f.get("name", "tool")), args if isinstance(args, dict) else {})
    return out


def _listing(lines: Sequence[str]) -> bool:
    """Records, not a statement: two or more lines that start alike (the first word's shape: ``tx``,
    ``Doc``, ``12:41``), as rows of a table, a log or search hits do."""
    shapes = {re.sub(r"\d", "0", (x.split() or [""])[0]) for x in lines}
    return len(lines) >= 2 and len(shapes) == 1


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
    ``context``: other messages whose tool calls may name a tool result's call (the span's own are used
    too)."""
    calls = _calls(list(context) + [m for _, m in messages])
    out: List[Result] = []
    for tidx, m in messages:
        role, content = m.get("role"), m.get("content")
        if m.get("summary") or role not in ("tool", "assistant") or not isinstance(content, str):
            continue
        lines = [x for x in content.split("\n") if x.strip()]
        if role == "tool":
            name, args = calls.get(str(m.get("tool_call_id", "")), (m.get("name") or "tool", {}))
            if name in SESSION_TOOLS or m.get("name") in SESSION_TOOLS:
                continue
            short = len(lines) <= SHORT_LINES and len(content) <= SHORT_CHARS and not _listing(lines)
        for raw in lines:
            line = _clip(raw)
            if not values_of(line) or _HEDGE_RE.search(line):
                continue
            conclusive = bool(_CONCLUSIVE_RE.search(line))
            sentence = len(" ".join(raw.split())) <= MAX_LINE_CHARS   # a longer line is data (a listing)
            if role == "tool" and ((short and sentence) or conclusive):
                out.append(Result(tidx, f"- {_label(name, args, line)}: {line}", False))
            elif role == "assistant" and conclusive and len(lines) <= SHORT_LINES:
                out.append(Result(tidx, f"- {CLAIM} {line}", True))
    return out


def states_result(messages: Sequence[dict]) -> bool:
    """Does the newest tool output (the tool messages after the last other message) state a result?  A
    sub-goal that just closed with a value is the rubric's first reason to compress: the probe's
    ``result_cue`` (``Policy``) rests on this."""
    tail: List[dict] = []
    for m in reversed(messages):
        if m.get("role") != "tool":
            break
        tail.append(m)
    if not tail:
        return False
    found = extract(list(enumerate(reversed(tail))), messages)
    return any(not r.claim for r in found)


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


def fit(lines: Sequence[str], budget: int, count: Callable[[str], int]) -> Tuple[List[str], int]:
    """``(kept, dropped)``: ``lines`` within ``budget`` tokens, as :func:`section` renders them.  Over
    budget, the assistant's statements go first, then the oldest results (the history file and
    ``search_history`` still hold them: the section says how many)."""
    lines = list(lines)
    dropped = 0
    while lines and count(section(lines, dropped, True)) > budget:
        k = next((i for i, x in enumerate(lines) if x.startswith(f"- {CLAIM}")), 0)
        lines.pop(k)
        dropped += 1
    if not lines and dropped and count(section([], dropped, True)) > budget:
        return [], 0   # not even the note fits: nothing is listed (the history file holds them all)
    return lines, dropped


def section(lines: Sequence[str], dropped: int = 0, searchable: bool = False) -> str:
    """The summary message's results section ("" when there is nothing to list)."""
    if not lines and not dropped:
        return ""
    body = list(lines)
    if dropped:
        where = "search_history finds them" if searchable else "they are in the history file"
        body.append(f"({dropped} earlier results left out for space; {where}.)")
    return RESULTS_HEADING + "\n" + "\n".join(body)


__all__ = ["RESULTS_HEADING", "Result", "values_of", "extract", "states_result", "merge", "fit", "section"]
