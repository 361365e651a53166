"""A background preparation: a :class:`SummaryJob` on a fork of the live sequence up to the cut, then the rebased context
(``prefix + summary + raw tail``) prefilled with ``prepare_rebase`` and kept caught up by the engine.

States: ``summarizing`` -> ``ready`` (summary and replacement built; rebase being prefilled, or not
started when the pool had no room) -> ``caught_up`` (the commit is O(1) plus the last few tokens).
"""
from __future__ import annotations

import time
from typing import Callable, Optional

from ..engine.port import engine_errors, grant_rows
from .summary.job import Summary, SummaryJob
from .swap import Replacement


class Preparation:
    def __init__(self, job: SummaryJob, *, cut: int, cut_token: int, prefix_tok: int, instructions: Optional[str],
                 build: Callable[[Summary], Replacement], reason: str):
        self.job, self.cut, self.cut_token, self.prefix_tok = job, cut, cut_token, prefix_tok
        self.instructions, self._build, self.reason = instructions, build, reason
        self.t0 = time.perf_counter()
        self.replacement: Optional[Replacement] = None
        self.rebase = None
        self.rebase_t0, self.rebase_rows = 0.0, 0             # when the rebased prefill started, and its rows then
        self.fallback_t0, self.fallback_rows = 0.0, 0  # the same for the fallback's context
        self.commit_trigger: Optional[str] = None   # "compress": commit once caught up
        self.ready_at: Optional[float] = None
        self.fallback: Optional[Replacement] = None  # the fallback summary's context, prefilled meanwhile
        self.fallback_rebase = None
        self.fallback_summary: Optional[Summary] = None
        self.abandoned: list = []                    # cancelled after the swap (see use_fallback)
        self.rows = 0                                # rows per step granted (see set_rows)
        self.written = 0                             # summary tokens written when the edge came (use_fallback)
        self.pace = None                             # and the attempt's (prompt seconds, tokens/s) then
        self._granted = None                         # (rows, attempt, fallback behind) last granted

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> str:
        if self.replacement is None:
            return "summarizing"
        if self.rebase is not None and self.rebase.done():
            return "caught_up"
        return "ready"

    @property
    def summary(self) -> Optional[Summary]:
        return self.job.summary

    def summary_left(self) -> int:
        return 0 if self.job.done else max(0, self.job.max_tokens - self.job.generated)

    # ------------------------------------------------------------------ verbs
    def advance(self, seq, n: int, *, room: Callable[[int], bool], mode: str = "exact") -> bool:
        """Poll the summary; once there, build the replacement and start the rebased prefill (when the
        pool has room for it). True when the summary just became ready.  The fallback's prepared context
        is kept until the model summary's context is caught up (the window edge may come first)."""
        became = False
        if self.replacement is None:
            polled = self.job.poll()
            self.set_rows(self.rows)  # a retry started by the poll gets the same rows per step
            if not polled:
                return False
            self._ready()
            became = True
        if self.rebase is None:
            need = len(self.replacement.tokens) + n - self.cut_token
            if not room(need) and self.fallback is not None:
                self.drop_fallback()  # both do not fit: the model's summary wins
            if room(need):
                try:
                    self.rebase = seq.prepare_rebase(self.prefix_tok, self.replacement.tokens, self.cut_token, mode=mode)
                    self.rebase_t0, self.rebase_rows = time.perf_counter(), need
                    self._grant(self.rebase)
                except engine_errors():  # no slot or cells now: the commit prepares it synchronously
                    self.rebase = None
        if self.state == "caught_up":
            self.drop_fallback()
        return became

    def prepare_fallback(self, seq, n: int, summary: Summary, *, room: Callable[[int], bool],
                         mode: str = "exact") -> None:
        """While the model writes its summary, prefill the context of the deterministic fallback summary
        too: if the window edge comes first, the swap onto it is O(1) (the stall stays within
        ``max_stall_ms``) instead of a synchronous prefill."""
        if self.fallback is not None or self.replacement is not None:
            return
        replacement = self._build(summary)
        if not room(len(replacement.tokens) + n - self.cut_token):
            return
        try:
            self.fallback_rebase = seq.prepare_rebase(self.prefix_tok, replacement.tokens, self.cut_token, mode=mode)
            self.fallback_t0, self.fallback_rows = time.perf_counter(), len(replacement.tokens) + n - self.cut_token
            self._grant(self.fallback_rebase)
            self.fallback = replacement
            self.fallback_summary = summary
        except engine_errors():
            self.fallback_rebase = None

    def set_rows(self, n: int) -> None:
        """Rows per engine step the summary and the prepared contexts may take next to the conversation's
        own decoding (0: the engine's default chunk).  Raised as the window edge nears.  While the
        fallback's context is behind, the model's attempt gets no rows of its own, and beside the
        conversation's decoding next to nothing (the deadline rows spend the background share's credit):
        the fallback is what the edge commits when the model is late, and the two sharing the rows left
        both behind (measured, Qwen2.5-Coder-1.5B, 2 cores: an attempt started 8 s before the edge,
        abandoned there, and a 10 s stall prefilling the fallback's context)."""
        a = self.job.attempt
        behind = self.fallback_rebase is not None and not self.fallback_rebase.done()
        key = (n, a, behind)
        if key == self._granted:
            return
        self.rows, self._granted = n, key  # (a retried attempt is a new one: it is granted too)
        grant_rows(a, 0 if behind else n)
        for x in (self.rebase, self.fallback_rebase):
            grant_rows(x, n)

    def _grant(self, x) -> None:
        if self.rows:
            grant_rows(x, self.rows)

    def cells(self, n: int) -> int:
        """Cells this preparation holds beyond the live sequence (summary fork, prepared contexts)."""
        tail = max(0, n - self.cut_token)
        out = 0
        if not self.job.done:
            out += self.job.prompt_tokens + self.job.max_tokens
        if self.replacement is not None and self.rebase is not None:
            out += len(self.replacement.tokens) + tail
        if self.fallback is not None:
            out += len(self.fallback.tokens) + tail
        return out

    def use_fallback(self) -> Summary:
        """The edge came first: the fallback (its context prefilled) becomes the replacement.  The model's
        summary and its context are abandoned: :meth:`release` cancels them after the swap (a cancel
        waits for the engine's next step; the conversation should not)."""
        self.set_rows(0)  # abandoned work must not slow the swap's own engine steps
        self.written = self.job.generated   # what the model managed by the edge (its pace is measured)
        a = self.job.attempt
        self.pace = a.pace(self.written) if a is not None and hasattr(a, "pace") else None
        if a is not None:  # stop writing now (a flag: no wait); the fork is closed after the swap
            a.cancel()
        self.abandoned = [x for x in (self.job, self.rebase) if x is not None]
        if self.fallback is None:  # not prefilled (no room, or no time): the swap prefills it
            self.fallback_summary = self.job.fallback_summary("max_stall")
            self.fallback, self.fallback_rebase = self._build(self.fallback_summary), None
        self.replacement, self.rebase = self.fallback, self.fallback_rebase
        self.fallback, self.fallback_rebase = None, None
        self.job.summary = self.fallback_summary
        return self.fallback_summary

    def release(self) -> None:
        for x in self.abandoned:
            try:
                x.cancel()
            except Exception:  # noqa: BLE001
                pass
        self.abandoned = []

    def _ready(self) -> None:
        self.replacement = self._build(self.job.summary)
        self.ready_at = time.perf_counter()

    def finish(self, timeout_s: Optional[float]) -> Summary:
        """Block for the summary at most ``timeout_s`` (then the fallback); build the replacement."""
        if self.replacement is None:
            self.job.wait(timeout_s)
            self._ready()
        return self.job.summary

    def drop_rebase(self) -> None:
        """The live tokens after the cut changed: the prepared rebase follows old tokens; redo it later."""
        self.drop_fallback()
        if self.rebase is not None:
            try:
                self.rebase.cancel()
            except Exception:  # noqa: BLE001
                pass
            self.rebase = None

    def cancel(self) -> None:
        self.job.cancel()
        self.drop_rebase()
        self.drop_fallback()
        self.release()

    def drop_fallback(self) -> None:
        rebase, self.fallback_rebase, self.fallback = self.fallback_rebase, None, None
        if rebase is not None:
            try:
                rebase.cancel()
            except Exception:  # noqa: BLE001
                pass

    @property
    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1000.0


__all__ = ["Preparation"]
