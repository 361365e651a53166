"""Where the history may be cut: pure rules over a list of :class:`MsgInfo` (no engine).

A cut before message ``m`` summarizes (or drops) ``msgs[n_prefix:m]`` and keeps ``msgs[m:]`` raw.  A cut
never separates an assistant tool call from any of its results: not before a tool message, and not after
a message while some tool call before it still waits for a result (parallel calls included).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence


@dataclass(frozen=True)
class MsgInfo:
    """What the cut rules need to know about one live message."""
    role: str
    tokens: int                  # tokens this message occupies in the live sequence
    tool_call: bool = False      # assistant message carrying tool calls
    summary: bool = False        # a summary produced by an earlier compaction
    cut_ok: bool = True          # a clean token boundary exists at this message's start
    open_after: Optional[bool] = None  # after this message a tool call still waits (None: == tool_call)

    @property
    def calls_open(self) -> bool:
        return self.tool_call if self.open_after is None else self.open_after


def starts(msgs: Sequence[MsgInfo], base: int = 0) -> List[int]:
    out, s = [], base
    for m in msgs:
        out.append(s)
        s += m.tokens
    out.append(s)
    return out


def cut_allowed(msgs: Sequence[MsgInfo], m: int) -> bool:
    """May the history be cut before message ``m`` (``m == len(msgs)``: after the last one)?"""
    if m <= 0 or m > len(msgs):
        return False
    if msgs[m - 1].calls_open:
        return False
    if m == len(msgs):
        return True
    return msgs[m].role != "tool" and msgs[m].cut_ok


def choose_cut(msgs: Sequence[MsgInfo], n_prefix: int, keep_recent_tokens: int, *, min_span: int = 1,
                extra_tail: int = 0) -> Optional[int]:
    """The snapshot cut: summarize ``msgs[n_prefix:cut]``, keep ``msgs[cut:]`` raw.

    The largest allowed cut that leaves at least ``keep_recent_tokens`` raw (``extra_tail`` counts tokens
    after the last message, e.g. a reply being generated) and covers at least ``min_span`` tokens of
    non-summary history.  ``None`` when there is no such cut (nothing worth summarizing yet).
    """
    st = starts(msgs)
    total = st[-1] + extra_tail
    best = None
    for m in range(n_prefix + 1, len(msgs) + 1):
        if total - st[m] < keep_recent_tokens:
            break
        if not cut_allowed(msgs, m):
            continue
        best = m
    if best is None:
        return None
    span = sum(x.tokens for x in msgs[n_prefix:best] if not x.summary)
    if span < max(1, min_span):
        return None
    return best


def drop_plan(msgs: Sequence[MsgInfo], n_prefix: int, need_tokens: int) -> Optional[int]:
    """Mode ``none`` (context shift): drop ``msgs[n_prefix:m]``; returns ``m``.

    Drops at least ``need_tokens`` and about half of what follows the prefix (as llama.cpp's context
    shift does), at an allowed cut. ``None`` if even dropping everything allowed does not free enough.
    """
    st = starts(msgs)
    after_prefix = st[-1] - st[n_prefix]
    goal = max(need_tokens, after_prefix // 2)
    last_ok = None
    for m in range(n_prefix + 1, len(msgs) + 1):
        if not cut_allowed(msgs, m):
            continue
        last_ok = m
        if st[m] - st[n_prefix] >= goal:
            return m
    if last_ok is not None and st[last_ok] - st[n_prefix] >= need_tokens:
        return last_ok
    return None


__all__ = ["MsgInfo", "starts", "cut_allowed", "choose_cut", "drop_plan"]
