"""Executing the policy's decisions: make room before each step, compact (synchronously or by committing
the background preparation), drop only when nothing can be summarized, run the schedule between steps."""
from __future__ import annotations

import time
from typing import Callable, Optional

from .. import events as ev
from .policy import sync_due, summary_message_budget
from . import scheduler as sch
from .background import BackgroundPreparation
from ..engine.port import free_cells
from .preparation import Preparation
from .swap import Replacement, Swap

LOOSE = ("manual", "tool", "window_full")


class Compactor(BackgroundPreparation):
    def __init__(self, ctx, ledger, maker, policy, limits, emit: Callable[[ev.Event], None]):
        self.ctx, self.ledger, self.maker, self.policy, self.lim, self.emit = ctx, ledger, maker, policy, limits, emit
        self.swap = Swap(ctx, ledger, policy.rebase)
        self.prep: Optional[Preparation] = None
        self.meter = sch.RateMeter()
        self.no_gain_until = -1          # live size below which a summary is known to gain nothing
        self.last_skip = ""              # why the latest compaction was skipped
        self.call_tidx: Optional[int] = None   # transcript index of the running call's first message
        self.worst_stall_ms = 0.0
        self.paced = False               # a model summary missed the window edge: size the next ones to the pace
        self.skips = 0                   # preparations in a row that did not ask the model (no time)
        self.missed = 0                  # model summaries in a row abandoned at the window edge (max_stall)
        self.margin = policy.chunk_tokens + 8
        self.fork_cells: Optional[int] = None   # cells reserved beyond the window (set by the session)
        ctx.on_truncate = self._on_truncate

    # ------------------------------------------------------------------ helpers
    def _mark(self, loose: bool = False, keep_recent: Optional[int] = None, floor: bool = True) -> Optional[int]:
        """The cut to summarize up to.  ``loose`` (the limit is here, or the user asked): when no cut leaves
        ``keep_recent`` raw and covers ``min_span``, rather cut later (a span worth summarizing) than
        summarize a few tokens for no gain.  ``floor``: never after the running call's first message until
        its reply begins (the model is about to answer those messages); only a full window
        (``floor=False``) cuts into them."""
        least = self._call_tail() if floor else 0
        keep = max(least, self.lim.keep_recent if keep_recent is None else keep_recent)
        m = self.ctx.choose_mark(keep, self.lim.min_span)
        if m is None and loose:
            m = self.ctx.choose_mark(least, self.lim.min_span) or self.ctx.choose_mark(keep, 1)
        return m

    def _call_tail(self) -> int:
        """Live tokens from the running call's first message on (0 when no call runs or none is in yet)."""
        if self.call_tidx is None:
            return 0
        for i, e in enumerate(self.ctx.entries):
            if e.tidx >= self.call_tidx and not e.summary:
                return self._tokens_from(i)
        return 0

    def _tokens_from(self, i: int) -> int:
        """Live tokens from entry ``i`` on, counted from the last token boundary at or before it."""
        for e in reversed(self.ctx.entries[:i + 1]):
            if e.start_tok is not None:
                return len(self.ctx) - e.start_tok
        return 0

    def _room_for(self, n: int) -> bool:
        """Room for ``n`` more cells: in the pool, and within the cells this session reserved for forks
        (other sessions on the engine count on theirs)."""
        held = self.prep.cells(len(self.ctx)) if self.prep is not None else 0
        if self.fork_cells is not None and held + n > self.fork_cells:
            return False
        return free_cells(self.ctx.engine) >= n + 8

    def _state(self, after: int, waited_ms: float = 0.0) -> sch.State:
        p, n = self.prep, len(self.ctx)
        shadow = summary_message_budget(self.policy, self.lim.window) + max(0, after - (p.mark_tok if p else n))
        # the pool is asked only above hard (an engine query waits for the engine's next step)
        headroom = after < self.lim.hard or free_cells(self.ctx.engine) - (after - n) >= shadow
        state = p.state if p else "none"
        if state == "caught_up" and self.covers_unanswered(p):
            state = "ready"   # swapped in once the reply is written (the headroom above hard), or at the edge
        return sch.State(tokens=n, tokens_after=after, prep=state,
                         summary_left=p.summary_left() if p else self._next_writes(),
                         prefill_left=self.lim.summary + (n - p.mark_tok if p else self.lim.keep_recent),
                         waited_ms=waited_ms, headroom_ok=headroom)

    def _on_truncate(self, n: int) -> None:
        p = self.prep
        if p is not None and n < len(self.ctx):
            if n < p.mark_tok:
                self.cancel("history_changed")
            else:
                p.drop_rebase()

    # ------------------------------------------------------------------ room before a step
    def room_ok(self, after: int) -> bool:
        if after > self.lim.window:
            return False
        mode = self.policy.mode
        if mode == "none" or not sync_due(self.policy, self.lim, after):
            return True
        if mode == "background":
            return sch.edge_action(self.policy, self.lim, self._state(after), self.margin).kind == "none"
        return self._mark() is None or len(self.ctx) < self.no_gain_until

    def make_room(self, after_fn: Callable[[], int], drop: bool = True) -> bool:
        """Compact (or, when nothing can be summarized and ``drop``, drop) so that ``after_fn()`` tokens fit."""
        after = after_fn()
        bg = self.policy.mode == "background"
        if bg and self.prep is None and after <= self.lim.window - self.margin and sync_due(self.policy, self.lim, after):
            self.start("hard", loose=True)  # late: prepare now and use the headroom above hard meanwhile
        if self.policy.mode != "none" and not self.room_ok(after):
            trig = "fixed" if self.policy.mode == "fixed" else "hard"
            if self.prep is not None or self._mark() is not None:
                self.compact(trig, edge=bg)
                after = after_fn()
        if not drop:
            return after <= self.lim.window
        if after > self.lim.window and self.policy.mode != "none" and self._mark(True, 0, floor=False) is not None:
            # keep_recent cannot stay raw this time: summarize up to the newest cut rather than drop turns
            if self.compact("window_full", edge=True) is None and self.last_skip == "no_gain" and not self.maker.tight:
                self.maker.tight = True  # the messages a summary keeps verbatim left no gain: summarize them too
                self.compact("window_full", edge=True)
            after = after_fn()
        if after > self.lim.window:
            why = "truncation" if self.policy.mode == "none" else ("no_gain" if self.last_skip == "no_gain" else "no_cut_point")
            self.drop(after - self.lim.window, why)
            after = after_fn()
        return after <= self.lim.window

    # ------------------------------------------------------------------ compaction
    def compact(self, trigger: str, instructions: Optional[str] = None, edge: bool = False) -> Optional[ev.Rebased]:
        if self.policy.mode == "background" or self.prep is not None:
            return self._commit(trigger, instructions, edge)
        return self._sync(trigger, instructions)

    def _skip(self, reason: str, trigger: str) -> None:
        self.last_skip = reason
        self.emit(ev.CompactionSkipped(reason, trigger, len(self.ctx) / self.lim.window))

    def _sync(self, trigger: str, instructions: Optional[str]) -> Optional[ev.Rebased]:
        t0 = time.perf_counter()
        wf = trigger == "window_full"
        mark = self._mark(trigger in LOOSE, 0 if wf else None, floor=not wf)
        if mark is None:
            self._skip("no_cut_point", trigger)
            return None
        self.emit(ev.SummaryStarted(mark, self.ctx.mark_tok(mark), background=False, reason=trigger))
        job = self.maker.start(mark, instructions, background=False, trigger=trigger)
        summary = job.wait()
        self.emit(self.maker.ready_event(summary, (time.perf_counter() - t0) * 1000.0))
        rep = self.maker.replacement(mark, summary)
        return self._swap(rep, trigger, t0, prepared=False, summary=summary)

    def _commit(self, trigger: str, instructions: Optional[str], edge: bool) -> Optional[ev.Rebased]:
        """Swap onto the preparation (started now if there is none).  At the window edge (``edge``) the
        wait is bounded: at most ``max_stall_ms`` for the model summary's context to catch up, then the
        fallback summary (its context prefilled meanwhile).  Otherwise (``/compact``) the summary is
        waited for."""
        t0 = time.perf_counter()
        p = self.prep
        if p is not None and instructions and p.instructions != instructions:
            self.cancel("new_instructions")
            p = None
        if instructions or trigger == "manual":   # (the tool: in defer, when it is called)
            self.ask_model_again()
            p = self.prep
        if p is not None and trigger == "manual":  # (the tool's re-cut is decided once, in defer)
            self.recut_for(trigger)
            p = self.prep
        if p is not None and trigger == "window_full":  # prepared for a later cut than this moment needs
            self.cancel("window_full")
            p = None
        wf = trigger == "window_full"
        if p is None and not self.start(trigger, instructions, loose=trigger in LOOSE or edge,
                                        keep_recent=0 if wf else None, floor=not wf):
            self._skip("no_cut_point", trigger)
            return None
        p = self.prep
        prepared = p.state == "caught_up"
        if edge and not prepared:
            summary = self._wait_at_edge(p, t0)
        else:
            summary = p.finish(None)
        wait_ms = (time.perf_counter() - t0) * 1000.0 if not prepared else 0.0
        if summary.reason == "max_stall":
            # the pace it managed (at least a token: an attempt still in its prompt wrote none), so the next
            # preparation asks the model for what it can write in time (BackgroundPreparation._affordable)
            self.meter.summary(max(1, p.written), p.elapsed_ms / 1000.0)
            self.meter.summary_pace(*(p.pace or (p.elapsed_ms / 1000.0,)))  # no token yet: all of it was prompt
            self.paced = True
            self.missed += 1
            self.emit(ev.SummaryFailed("max_stall", summary.attempts,
                                       f"not ready at the window edge (waited {wait_ms:.0f} ms; max_stall_ms="
                                       f"{self.policy.max_stall_ms}; a wait stops early when the summary's "
                                       "measured progress says it cannot be in by then)"))
        elif not summary.fallback:
            self.missed = 0
        if summary.reason == "max_stall" or (p.ready_at and p.ready_at >= t0):
            self.emit(self.maker.ready_event(summary, p.elapsed_ms))
        rep, rb = p.replacement, p.rb
        p.drop_fallback()
        self.prep = None
        try:
            return self._swap(rep, trigger, t0, prepared=prepared, summary=summary, rb=rb, wait_ms=wait_ms)
        finally:
            if rb is not None and not getattr(rb, "committed", False):  # the swap failed or gained nothing
                p.abandoned.append(rb)
            p.release()

    def _model_in_time(self, p: Preparation) -> bool:
        """Can the model's summary still be written within ``max_stall_ms``?  By the measured background
        summary rate, else by this job's own progress (its prompt's prefill counted in: a low estimate).
        When it cannot and the fallback's context is prefilled, waiting would only add to the stall."""
        if p.state != "summarizing" or p.fallback_rb is None:
            return True
        need = p.job.seconds_left(self.meter.rates().summary_tok_s)
        return need is None or need <= self.policy.max_stall_ms / 1000.0  # unknown: wait and see

    def _wait_at_edge(self, p: Preparation, t0: float):
        """Until ``max_stall_ms`` after ``t0``: let the preparation catch up (the engine has the rows to
        itself while the conversation waits).  Then, or at once when the model's summary cannot be in by
        then, the fallback."""
        deadline = t0 + self.policy.max_stall_ms / 1000.0
        if not self._model_in_time(p):
            return p.use_fallback()
        while True:
            p.advance(self.ctx.seq, len(self.ctx), room=self._room_for, mode=self.policy.rebase)
            left = deadline - time.perf_counter()
            if p.state == "caught_up" or left <= 0:
                break
            waitable = p.rb if p.rb is not None else p.job.attempt
            if waitable is not None:
                waitable.wait(min(left, 0.02))
            else:
                time.sleep(min(left, 0.005))
        if p.state == "caught_up" or (p.replacement is not None and p.fallback is None):
            return p.summary  # (the model's summary is there, its context not: as costly as a fallback's)
        return p.use_fallback()

    def _swap(self, rep: Replacement, trigger: str, t0: float, *, prepared: bool, summary, rb=None,
              wait_ms: float = 0.0) -> Optional[ev.Rebased]:
        if self.swap.gain(rep) <= 0:  # the summary is not smaller than what it replaces: remember it
            if rb is not None:
                try:
                    rb.cancel()
                except Exception:  # noqa: BLE001
                    pass
            self.no_gain_until = len(self.ctx) + self.lim.min_span
            self._skip("no_gain", trigger)
            return None
        info = self.swap.run(rep, reason=f"compaction ({trigger})", rb=rb)
        self._notes_fit()
        self._history_changed()
        self.emit(ev.Offloaded(self.ledger.path, info["offloaded"]))
        stall = (time.perf_counter() - t0) * 1000.0
        self.worst_stall_ms = max(self.worst_stall_ms, stall)
        e = ev.Rebased(info.get("mode", self.policy.rebase), info["tokens_before"], info["tokens_after"], stall,
                       int(info.get("catch_up_tokens", 0)), trigger=trigger, prepared=prepared,
                       engine_stall_ms=info.get("stall_ms"), wait_ms=wait_ms, fallback=summary.fallback,
                       worst_stall_ms=self.worst_stall_ms, summary_tokens=len(rep.tokens),
                       kept_tokens=self.maker.kept_tokens(rep.msg))
        self.emit(e)
        return e

    def _history_changed(self) -> None:
        """A swap replaced the history: what was learnt about the old one (no gain, a tight summary) is void."""
        self.no_gain_until = -1
        self.last_skip, self.maker.tight = "", False

    def drop(self, need: int, reason: str) -> bool:
        """Context shift: drop the oldest turns after the system prompt (offloaded first)."""
        from .marks import cut_allowed, drop_plan
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
        self.emit(ev.Offloaded(self.ledger.path, info["offloaded"]))
        stall = (time.perf_counter() - t0) * 1000.0
        self.worst_stall_ms = max(self.worst_stall_ms, stall)
        self.emit(ev.Rebased(info.get("mode", "exact"), info["tokens_before"], info["tokens_after"], stall,
                             int(info.get("catch_up_tokens", 0)), trigger="window", worst_stall_ms=self.worst_stall_ms))
        return True

    def _notes_fit(self) -> None:
        """After a swap a note still being written holds its fork of the old sequence, whose cells the live
        one no longer shares: it is cancelled when the pool lacks the room the live context may still grow
        into (the window's rest and the session's forks), else it finishes."""
        need = self.lim.window - len(self.ctx) + (self.fork_cells or 0)
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
        self.emit(ev.SummaryStarted(m, ctx.mark_tok(m), background=False, reason="window_full"))
        try:
            summary = self.maker.start(m, None, background=False, affordable=0, trigger="window_full").wait()
            rep = self.maker.replacement(m, summary)
            while rep is not None and (m_tok - p_tok) - len(rep.tokens) < need:
                rep = rep.smaller() if rep.smaller is not None else None
        except Exception:  # noqa: BLE001 - a summary that cannot be built: the drop still makes room
            return False
        if rep is None:
            self._skip("no_gain", "window_full")
            return False
        self.emit(self.maker.ready_event(summary, (time.perf_counter() - t0) * 1000.0))
        return self._swap(rep, "window_full", t0, prepared=False, summary=summary) is not None


__all__ = ["Compactor"]
