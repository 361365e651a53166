"""The cut a compaction uses now: where the live context may be cut for a summary, given what must stay
raw — ``keep_recent`` tokens, and the running call's messages until its reply begins (the model is about
to answer them) — and whether a summary there can still gain anything.  The rules of where a cut may fall
at all (never between a tool call and its results) are in ``cut_rules.py``; this object applies them to the
live context and the running call."""
from __future__ import annotations

from typing import Optional


class Cuts:
    def __init__(self, ctx, limits):
        self.ctx, self.limits = ctx, limits
        self.call_tidx: Optional[int] = None   # transcript index of the running call's first message
        self.no_gain_until = -1                # live size below which a summary is known to gain nothing

    def choose(self, loose: bool = False, keep_recent: Optional[int] = None, floor: bool = True) -> Optional[int]:
        """The cut to summarize up to (an index into the live messages; None: none).  ``loose`` (the limit is
        here, or the user asked): when no cut leaves ``keep_recent`` raw and covers ``min_span``, rather cut
        later (a span worth summarizing) than summarize a few tokens for no gain.  ``floor``: never after
        the running call's first message until its reply begins; only a full window (``floor=False``)
        cuts into them."""
        least = self.call_tail() if floor else 0
        keep = max(least, self.limits.keep_recent if keep_recent is None else keep_recent)
        cut = self.ctx.choose_cut(keep, self.limits.min_span)
        if cut is None and loose:
            cut = self.ctx.choose_cut(least, self.limits.min_span) or self.ctx.choose_cut(keep, 1)
        return cut

    def gains_nothing(self) -> bool:
        """Is the live context below the size at which a summary was found to gain nothing?"""
        return len(self.ctx) < self.no_gain_until

    def call_tail(self) -> int:
        """Live tokens from the running call's first message on (0 when no call runs or none is in yet)."""
        if self.call_tidx is None:
            return 0
        for i, entry in enumerate(self.ctx.entries):
            if entry.tidx >= self.call_tidx and not entry.summary:
                return self.tokens_from(i)
        return 0

    def unanswered_tail(self) -> int:
        """Live tokens from the first message after the last finished assistant reply (0: none)."""
        ctx = self.ctx
        entries, first = ctx.entries, ctx.n_prefix
        for i in range(len(entries) - 1, ctx.n_prefix - 1, -1):
            if entries[i].summary or entries[i].msg.get("role") == "assistant":
                first = i + 1
                break
        # what an agent waits on: a tool result, or the messages a reply is being written to (an agent
        # that only adds messages, never asking for a reply, would otherwise hold every swap to the edge)
        if first >= len(entries) or (ctx.partial is None and
                                     not any(e.msg.get("role") == "tool" for e in entries[first:])):
            return 0
        return self.tokens_from(first)

    def tokens_from(self, i: int) -> int:
        """Live tokens from entry ``i`` on, counted from the last token boundary at or before it."""
        for entry in reversed(self.ctx.entries[:i + 1]):
            if entry.start_tok is not None:
                return len(self.ctx) - entry.start_tok
        return 0


__all__ = ["Cuts"]
