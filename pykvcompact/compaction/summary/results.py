"""What the replaced history said, copied verbatim into every summary message (the extractive pass).

A small model asked to summarize pages of history drops the lines that matter, and the deterministic
fallback summary carries no values of its own.  So every summary message also lists, word for word, what
the replaced span said, and carries that list from summary to summary (re-summarizing a summary makes
facts decay).  No model is involved, and nothing here reads the *wording* of a line to decide whether it
matters: what is listed, and what goes first when space is short, is decided by structure alone.

In order of priority (the last tier is dropped first when the budget is short, oldest first within a tier):
1. the assistant's own statements — its text replies, short (the agent's distilled knowledge: "config.toml
   sets max_pool_size = 47"); a long reply is clipped in its middle and its fenced code left out;
2. short tool outputs (at most ``SHORT_LINES`` lines and ``SHORT_CHARS`` characters), whole, and the lines of
   a longer output the model noted right after reading it (``notes.py``), in place of 3;
3. the last line of a longer tool output (pages, files, logs: their middle is in the history file, which
   ``search_history`` and the session's recall search).
A repeated call (same tool, same arguments) supersedes its earlier outputs; the outputs of the session's
own tools (``search_history`` echoes the history, the compaction tool's result is a notice) and an
assistant reply that is a tool call the parser did not take (a call, not a statement) are never listed.
Regexes here recognise syntax only (a call tag, JSON naming a function, a code fence).
Pure functions.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .tool_call_syntax import CALL_TAGS

RESULTS_HEADING = "From the replaced history, verbatim (the assistant's statements, then the tools' outputs):"
SESSION_TOOLS = ("search_history", "compact_conversation")
SHORT_LINES = 2          # a tool output of at most this many non-empty lines ...
SHORT_CHARS = 480        # ... and characters is listed whole; a longer one by its last line
MAX_LINE_CHARS = 220     # a listed line longer than this keeps its head and its tail
MAX_LABEL_CHARS = 100    # a call's label (name and arguments) longer than this keeps its head and its tail
CLAIM = "(assistant)"    # the prefix of what the assistant stated (not a tool)
NOTED = "(noted)"        # the prefix of the lines of a tool output the model noted (compaction/summary/notes.py)
LAST_OF = ", last of {n} lines"   # marks the excerpt of a long tool output

# a reply that opens as a call: a call tag, or JSON naming a function and its arguments
_UNPARSED_CALL_RE = re.compile(r'^\s*(?:' + CALL_TAGS + r'|(?:\{\s*)+"name"\s*:.*"(?:arguments|parameters)"\s*:)',
                               re.DOTALL)
_FENCE_RE = re.compile(r"```.*?(?:```|$)", re.DOTALL)
_SPACE_RE = re.compile(r"\s+")
_LAST_OF_RE = re.compile(r"^- .*?, last of \d+ lines: ")


@dataclass(frozen=True)
class Result:
    tidx: int        # transcript index of the message it comes from
    line: str        # the line as listed: "- read_file(path=a.toml): max_pool_size = 47"
    claim: bool      # the assistant's statement, not a tool's output
    tier: int = 2    # 1: the assistant's statement, 2: a short tool output, 3: a long output's last line


def _clip(text: str, limit: int = MAX_LINE_CHARS) -> str:
    text = _SPACE_RE.sub(" ", text).strip()
    if len(text) <= limit:
        return text
    half = (limit - 3) // 2
    return text[:half].rstrip() + " … " + text[-half:].lstrip()


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


def _label(name: str, args: dict) -> str:
    """``name(arg=value, ...)``: which call the output answers (also what makes a repeated call the same)."""
    shown = ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in args.items())
    return _clip(f"{name}({shown})" if shown else name, MAX_LABEL_CHARS)


def extract(messages: Sequence[Tuple[int, dict]], context: Sequence[dict] = (),
            notes: Optional[Dict[int, List[str]]] = None) -> List[Result]:
    """What ``messages`` (``(transcript index, message)``, oldest first) said, in order.  ``context``: the
    messages before them, whose tool calls may name a tool result's call.  A tool result is matched to the
    nearest call with its id before it (ids repeat: ``call_0`` after a restart).  ``notes``: transcript
    index -> the lines of that tool output the model noted: listed instead of the structural excerpt, in
    the first tier."""
    calls: Dict[str, Tuple[str, dict]] = {}
    for m in context:
        for c in filter(None, map(_call_of, m.get("tool_calls") or [])):
            calls[c[0]] = c[1:]
    out: List[Result] = []
    for tidx, m in messages:
        for c in filter(None, map(_call_of, m.get("tool_calls") or [])):
            calls[c[0]] = c[1:]
        r = _result_of(tidx, m, calls, (notes or {}).get(tidx))
        if r is not None:
            out.append(r)
    return out


def _result_of(tidx: int, m: dict, calls: Dict[str, Tuple[str, dict]], noted: Optional[List[str]] = None
               ) -> Optional[Result]:
    role, content = m.get("role"), m.get("content")
    if m.get("summary") or m.get("recall") or role not in ("tool", "assistant") or not isinstance(content, str):
        return None
    if role == "assistant":
        if _UNPARSED_CALL_RE.search(content):
            return None   # a call the parser did not take: a request, not a statement
        text = _clip(_FENCE_RE.sub(" [code] ", content))
        return Result(tidx, f"- {CLAIM} {text}", True, 1) if text.strip(" [code]") else None
    name, args = calls.get(str(m.get("tool_call_id", "")), (m.get("name") or "tool", {}))
    if name in SESSION_TOOLS or m.get("name") in SESSION_TOOLS:
        return None
    lines = [x for x in content.split("\n") if x.strip()]
    if not lines:
        return None
    label = _label(name, args)
    if noted:   # the lines the model chose: listed like a short output (their place is the output's)
        return Result(tidx, f"- {NOTED} {label}: {_clip(' / '.join(noted))}", False, 2)
    if len(lines) <= SHORT_LINES and len(content) <= SHORT_CHARS:
        return Result(tidx, f"- {label}: {_clip(' / '.join(x.strip() for x in lines))}", False, 2)
    return Result(tidx, f"- {label}{LAST_OF.format(n=len(lines))}: {_clip(lines[-1])}", False, 3)


LAST_TIER = 3   # a long output's last line: the first left out


def tier_of(line: str) -> int:
    """The priority tier of a listed line (see the module's doc): 1 is kept longest."""
    if line.startswith(f"- {CLAIM}"):
        return 1
    return LAST_TIER if _LAST_OF_RE.match(line) else 2


def _key(line: str) -> str:
    return _SPACE_RE.sub(" ", line.lstrip("-*• ")).strip().lower()


def _call_key(line: str) -> Optional[str]:
    """The call a tool line answers (its label), None for the assistant's statements."""
    if line.startswith(f"- {CLAIM}"):
        return None
    head = line[2:]
    if head.startswith(NOTED + " "):
        head = head[len(NOTED) + 1:]
    m = re.match(r"^(.*?)(?:, last of \d+ lines)?: ", head)
    return m.group(1) if m else None


def supersedes(old: Sequence[str], new: Sequence[str]) -> bool:
    """Does a line of ``new`` answer a call that a line of ``old`` answers (a newer output of the same call,
    which :func:`merge` keeps instead of the older one)?"""
    calls = {_call_key(x) for x in old} - {None}
    return any(_call_key(x) in calls for x in new)


def merge(carried: Sequence[str], new: Iterable[Result]) -> List[str]:
    """``carried`` (an earlier summary's list) then the new lines, in order, without duplicates (the newest
    copy stays); the newest output of a repeated call (same tool, same arguments) supersedes the earlier."""
    lines = list(carried) + [r.line for r in new]
    out, seen, calls = [], set(), set()
    for line in reversed(lines):
        key, call = _key(line), _call_key(line)
        if key in seen or (call is not None and call in calls):
            continue
        seen.add(key)
        if call is not None:
            calls.add(call)
        out.append(line)
    return out[::-1]


def fit(lines: Sequence[str], budget: int, count: Callable[[str], int], left_out: int = 0
        ) -> Tuple[List[str], int]:
    """``(kept, left_out)``: ``lines`` within ``budget`` tokens, as :func:`section` renders them with the
    count of lines already left out by earlier summaries (``left_out``).  Over budget, the last tier goes
    first (a long output's last line, then short outputs, then the assistant's statements), oldest first
    within a tier (the history file and ``search_history`` still hold them: the section says how many).
    Each line is counted once (a long list is not re-counted per dropped line)."""
    lines = list(lines)
    fixed = count(section([], left_out + len(lines), True)) + 1   # the heading and the note, at their largest
    sizes = [count(x) + 1 for x in lines]
    order = sorted(range(len(lines)), key=lambda i: (-tier_of(lines[i]), i))
    total, gone = fixed + sum(sizes), set()
    for i in order:
        if total <= budget:
            break
        gone.add(i)
        total -= sizes[i]
    kept = [x for i, x in enumerate(lines) if i not in gone]
    left = left_out + len(gone)
    while kept and count(section(kept, left, True)) > budget:   # the estimate was off (merged tokens)
        drop = min(range(len(kept)), key=lambda i: (-tier_of(kept[i]), i))
        kept.pop(drop)
        left += 1
    if not kept and count(section([], left, True)) > budget:
        return [], 0   # not even the note fits: nothing is listed (the history file holds them all)
    return kept, left


def section(lines: Sequence[str], dropped: int = 0, searchable: bool = False) -> str:
    """The summary message's section of what the history said ("" when there is nothing to list);
    ``dropped``: how many lines earlier summaries and this one left out for space."""
    if not lines and not dropped:
        return ""
    body = list(lines)
    if dropped:
        where = "search_history finds them" if searchable else "they are in the history file"
        body.append(f"({dropped} earlier lines left out for space; {where}.)")
    return RESULTS_HEADING + "\n" + "\n".join(body)


__all__ = ["RESULTS_HEADING", "LAST_TIER", "Result", "extract", "merge", "supersedes", "fit", "section", "tier_of"]
