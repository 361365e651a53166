"""Executing the policy's decisions: make room before each step, compact (synchronously or by committing
the background preparation), drop only when nothing can be summarized, run the schedule between steps.
The background mode's preparation is a part of its own (background.py); the compactor swaps it in."""
from __future__ import annotations

import time
from typing import Callable, Optional

from .. import events as ev
from .policy import sync_due
from . import scheduler
from .background import IDLE_POLL_S, Background
from .cuts import Cuts
from ..engine.port import free_cells
from .preparation import Preparation
from .swap import Replacement, Swap

LOOSE = ("manual", "tool", "window_full")


class Compactor:
    def __init__(self, ctx, transcript, maker, policy, limits, emit: Callable[[ev.Event], None],
                 fork_cells: Optional[int] = None):
        """``fork_cells``: cells the session reserved beyond its window for forks (None: the pool's)."""
        self.ctx, self.transcript, self.maker, self.policy, self.limits, self.emit = ctx, transcript, maker, policy, limits, emit
        self.fork_cells = fork_cells
        self.swap = Swap(ctx, transcript, policy.rebase, describe=maker.describe)
        self.meter = scheduler.RateMeter()
        self.cuts = Cuts(ctx, limits)
        self.margin = policy.chunk_tokens + 8   # the edge comes a chunk (and a little) before the window
        self.background = Background(ctx, maker, policy, limits, emit, self.cuts, self.meter, self.margin,
                                     fork_cells)
        self.last_skip = ""              # why the latest compaction was skipped
        self.worst_stall_ms = 0.0
        ctx.on_truncate = self._on_truncate

    @property
    def prep(self) -> Optional[Preparation]:
        """The background preparation in progress (None: none)."""
        return self.background.prep

    @property
    def call_tidx(self) -> Optional[int]:
        """Transcript index of the running call's first message: its messages stay raw until answered."""
        return self.cuts.call_tidx

    @call_tidx.setter
    def call_tidx(self, value: Optional[int]) -> None:
        self.cuts.call_tidx = value

    def cancel(self, reason: Optional[str]) -> None:
        """Drop the background preparation (a ``preparation_restarted`` event says why, unless None)."""
        self.background.cancel(reason)

    def _on_truncate(self, n: int) -> None:
        p = self.prep
        if p is not None and n < len(self.ctx):
            if n < p.cut_token:
                self.cancel("history_changed")
            else:
                p.drop_rebase()

    # ------------------------------------------------------------------ room before a step
    def room_ok(self, after: int) -> bool:
        if after > self.limits.window:
            return False
        mode = self.policy.mode
        if mode == "none" or not sync_due(self.policy, self.limits, after):
            return True
        if mode == "background":
            return scheduler.edge_action(self.policy, self.limits, self.background.state(after), self.margin).kind == "none"
        return self.cuts.choose() is None or self.cuts.gains_nothing()

    def make_room(self, after_fn: Callable[[], int], drop: bool = True) -> bool:
        """Compact (or, when nothing can be summarized and ``drop``, drop) so that ``after_fn()`` tokens fit."""
        after = after_fn()
        bg = self.policy.mode == "background"
        if bg and self.prep is None and after <= self.limits.window - self.margin and sync_due(self.policy, self.limits, after):
            self.background.start("hard", loose=True)  # late: prepare now and use the headroom above hard meanwhile
        if self.policy.mode != "none" and not self.room_ok(after):
            trigger = "fixed" if self.policy.mode == "fixed" else "hard"
            if self.prep is not None or self.cuts.choose() is not None:
                self.compact(trigger, edge=bg)
                after = after_fn()
        if not drop:
            return after <= self.limits.window
        if after > self.limits.window and self.policy.mode != "none" and self.cuts.choose(True, 0, floor=False) is not None:
            # keep_recent cannot stay raw this time: summarize up to the newest cut rather than drop turns
            if self.compact("window_full", edge=True) is None and self.last_skip == "no_gain" and not self.maker.tight:
                self.maker.tight = True  # the messages a summary keeps verbatim left no gain: summarize them too
                self.compact("window_full", edge=True)
            after = after_fn()
        if after > self.limits.window:
            why = "truncation" if self.policy.mode == "none" else ("no_gain" if self.last_skip == "no_gain" else "no_cut_point")
            self.drop(after - self.limits.window, why)
            after = after_fn()
        return after <= self.limits.window

    # ------------------------------------------------------------------ compaction
    def compact(self, trigger: str, instructions: Optional[str] = None, edge: bool = False) -> Optional[ev.Rebased]:
        if self.policy.mode == "background" or self.prep is not None:
            return self._commit(trigger, instructions, edge)
        return self._sync(trigger, instructions)

    def _skip(self, reason: str, trigger: str) -> None:
        self.last_skip = reason
        self.emit(ev.CompactionSkipped(reason, trigger, len(self.ctx) / self.limits.window))

    def _sync(self, trigger: str, instructions: Optional[str]) -> Optional[ev.Rebased]:
        t0 = time.perf_counter()
        window_full = trigger == "window_full"
        cut = self.cuts.choose(trigger in LOOSE, 0 if window_full else None, floor=not window_full)
        if cut is None:
            self._skip("no_cut_point", trigger)
            return None
        self.emit(ev.SummaryStarted(cut, self.ctx.cut_token(cut), background=False, reason=trigger))
        job = self.maker.start(cut, instructions, background=False, trigger=trigger)
        summary = job.wait()
        self.emit(self.maker.ready_event(summary, (time.perf_counter() - t0) * 1000.0))
        replacement = self.maker.replacement(cut, summary)
        return self._swap(replacement, trigger, t0, prepared=False, summary=summary)

    def _commit(self, trigger: str, instructions: Optional[str], edge: bool) -> Optional[ev.Rebased]:
        """Swap onto the preparation (started now if there is none).  At the window edge (``edge``) the
        wait is bounded: at most ``max_stall_ms`` for the model summary's context to catch up, then the
        fallback summary (its context prefilled meanwhile).  Otherwise (``/compact``) the summary is
        waited for."""
        t0 = time.perf_counter()
        background = self.background
        p = background.prep
        if p is not None and instructions and p.instructions != instructions:
            background.cancel("new_instructions")
            p = None
        if instructions or trigger == "manual":   # (the tool: in defer, when it is called)
            background.ask_model_again()
            p = background.prep
        if p is not None and trigger == "manual":  # (the tool's re-cut is decided once, in defer)
            background.recut_for(trigger)
            p = background.prep
        if p is not None and trigger == "window_full":  # prepared for a later cut than this moment needs
            background.cancel("window_full")
            p = None
        window_full = trigger == "window_full"
        if p is None and not background.start(trigger, instructions, loose=trigger in LOOSE or edge,
                                              keep_recent=0 if window_full else None, floor=not window_full,
                                              edge=edge):
            self._skip("no_cut_point", trigger)
            return None
        p = background.prep
        prepared = p.state == "caught_up"
        if edge and not prepared:
            summary = background.wait_at_edge(p, t0)
        else:
            summary = p.finish(None)
        wait_ms = (time.perf_counter() - t0) * 1000.0 if not prepared else 0.0
        if summary.reason == "max_stall":
            background.missed_edge(p, summary.attempts, wait_ms)
        elif not summary.fallback:
            background.missed = 0
        if summary.reason == "max_stall" or (p.ready_at and p.ready_at >= t0):
            self.emit(self.maker.ready_event(summary, p.elapsed_ms))
        replacement, rebase = p.replacement, p.rebase
        p.drop_fallback()
        background.prep = None
        try:
            return self._swap(replacement, trigger, t0, prepared=prepared, summary=summary, rebase=rebase, wait_ms=wait_ms)
        finally:
            if rebase is not None and not getattr(rebase, "committed", False):  # the swap failed or gained nothing
                p.abandoned.append(rebase)
            p.release()

    def _swap(self, replacement: Replacement, trigger: str, t0: float, *, prepared: bool, summary, rebase=None,
              wait_ms: float = 0.0) -> Optional[ev.Rebased]:
        if self.swap.gain(replacement) <= 0:  # the summary is not smaller than what it replaces: remember it
            if rebase is not None:
                try:
                    rebase.cancel()
                except Exception:  # noqa: BLE001
                    pass
            self.cuts.no_gain_until = len(self.ctx) + self.limits.min_span
            self._skip("no_gain", trigger)
            return None
        if self.policy.rebase == "splice" and self.maker.notes.writing:
            # the note's fork shares the cells a splice moves: the engine refuses to move them, and the swap
            # fell back to prefilling a fresh sequence (12 s measured, Qwen2.5-Coder-1.5B, 2 cores)
            self.maker.notes.close("splice")
        info = self.swap.run(replacement, reason=f"compaction ({trigger})", rebase=rebase)
        self._notes_fit()
        self._history_changed()
        self.emit(ev.Offloaded(self.transcript.path, info["offloaded"]))
        stall = (time.perf_counter() - t0) * 1000.0
        self.worst_stall_ms = max(self.worst_stall_ms, stall)
        e = ev.Rebased(info.get("mode", self.policy.rebase), info["tokens_before"], info["tokens_after"], stall,
                       int(info.get("catch_up_tokens", 0)), trigger=trigger, prepared=prepared,
                       engine_stall_ms=info.get("stall_ms"), wait_ms=wait_ms, fallback=summary.fallback,
                       worst_stall_ms=self.worst_stall_ms, summary_tokens=len(replacement.tokens),
                       kept_tokens=self.maker.kept_tokens(replacement.msg),
                       summary_reused=int(info.get("summary_reused", 0)))
        self.emit(e)
        return e

    def _history_changed(self) -> None:
        """A swap replaced the history: what was learnt about the old one (no gain, a tight summary) is void."""
        self.cuts.no_gain_until = -1
        self.last_skip, self.maker.tight = "", False

    def drop(self, need: int, reason: str) -> bool:
        """Context shift: drop the oldest turns after the system prompt (offloaded first)."""
        from .cut_rules import cut_allowed, drop_plan
        self.cancel("window_full")
        ctx = self.ctx
        if len(ctx.entries) <= ctx.n_prefix or ctx.entries[ctx.n_prefix].start_tok is None:
            return False
        infos = ctx.msg_infos()
        m = drop_plan(infos, ctx.n_prefix, need)
        if m is None:  # not enough to free: drop all that can be dropped (the caller says if it still fails)
            m = max((k for k in range(ctx.n_prefix + 1, len(infos) + 1) if cut_allowed(infos, k)), default=None)
        if m is None:
            return False
        if self.policy.mode != "none" and self._summarize_instead(m, need):
            return True
        t0 = time.perf_counter()
        span = ctx.span(m)
        self.emit(ev.Dropped(m - ctx.n_prefix, span[1] - span[0], reason=reason))
        can_shift = ctx.engine.capabilities.get("can_shift") and self.policy.mode == "none"
        info = self.swap.run(Replacement(m, None, None, "", []), reason=f"context shift ({reason})",
                             mode="splice" if can_shift else None)
        self._history_changed()
        self._notes_fit()
        self.emit(ev.Offloaded(self.transcript.path, info["offloaded"]))
        stall = (time.perf_counter() - t0) * 1000.0
        self.worst_stall_ms = max(self.worst_stall_ms, stall)
        self.emit(ev.Rebased(info.get("mode", "exact"), info["tokens_before"], info["tokens_after"], stall,
                             int(info.get("catch_up_tokens", 0)), trigger="window", worst_stall_ms=self.worst_stall_ms))
        return True

    def _notes_fit(self) -> None:
        """After a swap a note still being written holds its fork of the old sequence, whose cells the live
        one no longer shares: it is cancelled when the pool lacks the room the live context may still grow
        into (the window's rest and the session's forks), else it finishes."""
        need = self.limits.window - len(self.ctx) + (self.fork_cells or 0)
        if self.maker.notes.writing and free_cells(self.ctx.engine) < need:
            self.maker.notes.close("no_room")

    def _summarize_instead(self, m: int, need: int) -> bool:
        """A summarizing mode does not drop a summary message or the user's words while a summary can make
        the room: when the span a context shift would drop holds either, it is replaced by a summary written
        without the model (the earlier summary's kept messages, instructions and listed lines carried
        forward, the span's own listed), if that frees ``need`` tokens.  False when even its smallest plan
        does not (the caller then drops, the last resort, with a ``dropped`` event)."""
        ctx = self.ctx
        span = ctx.entries[ctx.n_prefix:m]
        if not any(e.summary or e.msg.get("role") == "user" for e in span):
            return False
        t0 = time.perf_counter()
        p_tok, m_tok = ctx.span(m)[:2]
        self.emit(ev.SummaryStarted(m, ctx.cut_token(m), background=False, reason="window_full"))
        try:
            summary = self.maker.start(m, None, background=False, affordable=0, trigger="window_full").wait()
            replacement = self.maker.replacement(m, summary)
            while replacement is not None and (m_tok - p_tok) - len(replacement.tokens) < need:
                replacement = replacement.smaller() if replacement.smaller is not None else None
        except Exception:  # noqa: BLE001 - a summary that cannot be built: the drop still makes room
            return False
        if replacement is None:
            self._skip("no_gain", "window_full")
            return False
        self.emit(self.maker.ready_event(summary, (time.perf_counter() - t0) * 1000.0))
        return self._swap(replacement, "window_full", t0, prepared=False, summary=summary) is not None

    # ------------------------------------------------------------------ the background mode's schedule
    def tick(self, turn_end: bool = False) -> None:
        """Between steps (background mode): advance the preparation, start one when the schedule says,
        restart one the raw tail has outgrown, commit one a COMPRESS verdict (or the tool) asked for once
        caught up.  ``turn_end``: a call's messages are all in, or a reply is being written or just
        closed: what comes next will be the raw tail."""
        if self.policy.mode != "background":
            return
        self.background.step(turn_end)
        due = self.background.commit_due()
        if due is not None:
            self._commit(due.commit_trigger, None, edge=False)

    def idle(self, seconds: float) -> None:
        """Advance the preparation for up to ``seconds`` while the conversation has nothing to add."""
        deadline = time.perf_counter() + seconds
        while self.policy.mode == "background":
            self.tick(turn_end=True)
            p = self.prep
            left = deadline - time.perf_counter()
            if p is None or left <= 0 or (p.state == "caught_up" and p.fallback is None):
                return
            time.sleep(min(left, IDLE_POLL_S))

    def defer(self, trigger: str) -> bool:
        """Background mode: commit a preparation (started now if needed) once it is caught up, instead of
        waiting for it.  True when a commit is scheduled (or done, if it was caught up already)."""
        if self.policy.mode != "background" or not self.background.defer(trigger):
            return False
        self.tick()
        return True

    def compress(self) -> None:
        """A COMPRESS verdict: synchronous modes compact now; background commits once caught up."""
        if self.policy.mode != "background":
            if self.cuts.choose() is not None:
                self.compact("compress")
            return
        if self.background.compress():
            self.tick()


__all__ = ["Compactor"]
