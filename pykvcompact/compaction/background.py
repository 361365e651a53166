"""The background mode's preparation: started when the schedule says, advanced between steps with the rows
its deadline needs, restarted at a later cut when the raw tail outgrew it, marked for a commit when
COMPRESS, the tool or ``hard`` asks, and caught up at the window edge within ``max_stall_ms``.  The
:class:`~.compactor.Compactor` owns one and does the commit (the swap) when this says it is due."""
from __future__ import annotations

import time
from typing import Optional

from .. import events as ev
from .policy import needs_restart, summary_message_budget
from . import scheduler
from ..engine.port import engine_errors, free_cells
from .preparation import Preparation
from .summary.summaries import MIN_MODEL_TOKENS

# rows per step for a preparation whose deadline is near (the engine's default is 8 next to the
# conversation's decoding, 64 when it is idle): each row slows that step's decode (~3 ms a row here)
DEADLINE_ROWS = 16
# rows per step while the conversation waits at the window edge: the engine's whole background chunk (the
# session polls the engine meanwhile, which would otherwise hold background work to its small busy chunk)
EDGE_ROWS = 64
# preparations the schedule starts (not a /compact or a tool call, which wait for the model's summary)
PACED = ("soft", "schedule", "next_turns", "restart", "compress", "hard")
SCHEDULED = ("soft", "schedule", "next_turns", "restart")   # swapped in when ``hard`` comes
PACE_MARGIN = 0.7   # plan on 70% of the measured pace: the conversation may speed up
RETRY_AFTER_SKIPS = 3   # preparations without the model before it is asked again, uncapped
MAX_BACKOFF = 3         # ...doubled per abandoned retry, at most this many times (24)
IDLE_POLL_S = 0.02  # Session.idle: how often the preparation is advanced while the engine works alone


class Background:
    def __init__(self, ctx, maker, policy, limits, emit, cuts, meter: scheduler.RateMeter, margin: int,
                 fork_cells: Optional[int]):
        """``cuts``: where the live context may be cut (cuts.py); ``meter``: the paces measured in this
        session; ``margin``: tokens below the window the edge comes at; ``fork_cells``: cells this session
        reserved beyond its window for forks (None: no limit but the pool)."""
        self.ctx, self.maker, self.policy, self.limits, self.emit = ctx, maker, policy, limits, emit
        self.cuts, self.meter, self.margin, self.fork_cells = cuts, meter, margin, fork_cells
        self.prep: Optional[Preparation] = None
        self.paced = False               # a model summary missed the window edge: size the next ones to the pace
        self.skips = 0                   # preparations in a row that did not ask the model (no time)
        self.missed = 0                  # model summaries in a row abandoned at the window edge (max_stall)

    def start(self, reason: str, instructions: Optional[str] = None, loose: bool = False,
              keep_recent: Optional[int] = None, floor: bool = True, edge: bool = False) -> bool:
        """Start a preparation at the cut ``reason`` calls for; False when there is none worth it.  ``edge``:
        the conversation waits for it now, so the model is asked only for what its measured pace writes
        within ``max_stall_ms`` (an uncapped summary would be abandoned at that deadline, its attempt having
        slowed the steps the swap waits on)."""
        if keep_recent is None and self.policy.mode == "background":
            keep_recent = self._keep_at_start(reason)
        cut = self.cuts.choose(loose, keep_recent, floor)
        if cut is None or (not loose and self.cuts.gains_nothing()):
            return False
        ctx = self.ctx
        bg = self.policy.mode == "background"
        # after a few summaries without the model, ask it again uncapped: its pace is measured anew (the
        # machine may have quietened, the agent's tools may now leave the engine idle)
        paced = bg and reason in PACED and self.skips < self._retry_after()
        at_edge = bg and edge and not instructions
        if at_edge:
            affordable = self.affordable(self.policy.max_stall_ms / 1000.0)
        else:
            affordable = self.affordable() if paced else None
        try:
            job = self.maker.start(cut, instructions, background=bg, trigger=reason, affordable=affordable)
        except engine_errors():
            return False
        skipped = job.summary is not None and job.summary.reason == "no_time"
        if not (at_edge and skipped):   # (the schedule's retries count the preparations it started)
            self.skips = self.skips + 1 if skipped else 0
        self.prep = Preparation(job, cut=cut, cut_token=ctx.cut_token(cut), prefix_tok=ctx.prefix_tok(),
                                instructions=instructions, build=lambda s: self.maker.replacement(cut, s),
                                reason=reason)
        self.emit(ev.SummaryStarted(cut, ctx.cut_token(cut), background=True, reason=reason))
        return True

    def _keep_at_start(self, reason: str) -> Optional[int]:
        """The raw tail a preparation's cut leaves now.  ``keep_recent`` is what the swap must leave raw, and
        a preparation the schedule starts is swapped in at ``hard``: what arrives before counts toward it
        (measured: a cut that left all of ``keep_recent`` at the start left 0.25-0.35 of the window raw
        at the swap, the rebased context filled 0.70 and ``hard`` came back two steps later).  A COMPRESS
        verdict says the last message closed the sub-task: the cut follows it.  None: ``keep_recent``."""
        if reason == "compress":
            return 0
        if reason in SCHEDULED:
            return max(0, self.limits.keep_recent - max(0, self.limits.hard - len(self.ctx)))
        return None

    def covers_unanswered(self, p: Preparation) -> bool:
        """Does ``p``'s cut summarize a message no finished reply has followed yet (a tool result just in,
        the question a reply is being written to)?  Such a preparation is not swapped in before that reply
        unless the window's edge leaves no choice: the model answers what it has read in full."""
        return p.cut_token > len(self.ctx) - self.cuts.unanswered_tail()

    def recut_for(self, trigger: str) -> None:
        """``/compact`` and the tool leave ``keep_recent`` raw: a pending preparation cut later than that
        (for ``hard``, where more arrives first, or for a COMPRESS verdict) is cut again."""
        p = self.prep
        if p is None or trigger not in ("manual", "tool") or len(self.ctx) - p.cut_token >= self.limits.keep_recent:
            return
        m = self.cuts.choose(True)
        if m is not None and m < p.cut:
            self.cancel("keep_recent")

    def affordable(self, seconds: Optional[float] = None) -> Optional[int]:
        """Summary tokens the model can write before the window edge at the paces measured in this session
        — the conversation's growth, the summary prompt's time before its first token, the writing rate
        after it, the rebased context's prefill — with a margin; None until a model summary has missed the
        edge once (``paced``) or while a pace is unknown.  On a slow machine a full-size summary started at
        ``soft`` is never in by the edge (measured: 10 of 11 on Qwen2.5-Coder-1.5B, 2 cores, each abandoned
        for the fallback after taking its rows): it is sized to what fits instead, or not asked for.
        ``seconds``: the time there is, when the edge is here (``max_stall_ms``)."""
        r = self.meter.rates()
        if not self.paced or r.summary_prompt_s is None:
            return None
        if seconds is None:
            if not r.growth_tok_s:
                return None
            seconds = (self.limits.window - self.margin - len(self.ctx)) / r.growth_tok_s
        seconds -= r.summary_prompt_s
        if r.prefill_tok_s:
            rows = summary_message_budget(self.policy, self.limits.window) + max(self.limits.keep_recent, r.turn_tokens)
            seconds -= rows / r.prefill_tok_s
        if seconds <= 0:
            return 0      # its prompt alone (and the rebased prefill) take longer than the time left
        if not r.summary_write_tok_s:
            return None   # the writing pace is unknown yet: try
        return int(seconds * r.summary_write_tok_s * PACE_MARGIN)

    def _retry_after(self) -> int:
        """Preparations without the model before it is asked again uncapped: RETRY_AFTER_SKIPS, doubled for
        each model summary in a row abandoned at the edge (measured on Qwen2.5-Coder-1.5B, 2 cores: every
        retry missed the edge again, and each slowed two to three steps about twofold for nothing)."""
        return RETRY_AFTER_SKIPS << min(max(0, self.missed - 1), MAX_BACKOFF)

    def _next_writes(self) -> int:
        """Summary tokens the model would be asked for if a preparation started now (0: none: no time, or
        its last summaries said nothing)."""
        if not self.maker.asks_model():
            return 0
        a = self.affordable() if self.skips < self._retry_after() else None
        if a is None:
            return self.limits.summary
        return min(self.limits.summary, a) if a >= MIN_MODEL_TOKENS else 0

    def cancel(self, reason: Optional[str]) -> None:
        p, self.prep = self.prep, None
        if p is None:
            return
        p.cancel()
        if reason is not None:
            self.emit(ev.PreparationRestarted(reason, p.cut, len(self.ctx) - p.cut_token))

    def step(self, turn_end: bool = False) -> None:
        """Between steps: advance the preparation, start one when the schedule says, restart one the raw
        tail has outgrown.  ``turn_end``: a call's messages are all in, or a reply is being written or just
        closed: what comes next will be the raw tail."""
        self.maker.notes.poll()
        if self.prep is not None:
            self._advance()
            self._restart_if_needed()
        if self.prep is None:
            rates = self.meter.rates()
            why = scheduler.start_reason(self.policy, self.limits, self.state(len(self.ctx)), rates)
            # turns as large as keep_recent: the next turn will be the raw tail, so at a turn's end the
            # whole history may be summarized now, while the conversation waits for its next message
            if why and not self.start(why) and turn_end and rates.turn_tokens >= self.limits.keep_recent:
                self.start(why, keep_recent=0)
        if self.prep is not None and self.prep.fallback is None:
            self._advance()  # a preparation started or restarted now: its fallback context starts at once

    def commit_due(self) -> Optional[Preparation]:
        """The preparation to swap in now: one a COMPRESS verdict (or the tool) asked for, caught up, whose
        cut leaves every unanswered message raw (None: none)."""
        p = self.prep
        if p is not None and p.commit_trigger and p.state == "caught_up" and not self.covers_unanswered(p):
            return p
        return None

    def state(self, after: int, waited_ms: float = 0.0) -> scheduler.State:
        """What the schedule needs to know (scheduler.py) when the live context would grow to ``after``."""
        p, n = self.prep, len(self.ctx)
        shadow = summary_message_budget(self.policy, self.limits.window) + max(0, after - (p.cut_token if p else n))
        # the pool is asked only above hard (an engine query waits for the engine's next step)
        headroom = after < self.limits.hard or free_cells(self.ctx.engine) - (after - n) >= shadow
        state = p.state if p else "none"
        if state == "caught_up" and self.covers_unanswered(p):
            state = "ready"   # swapped in once the reply is written (the headroom above hard), or at the edge
        return scheduler.State(tokens=n, tokens_after=after, prep=state,
                         summary_left=p.summary_left() if p else self._next_writes(),
                         prefill_left=self.limits.summary + (n - p.cut_token if p else self.limits.keep_recent),
                         waited_ms=waited_ms, headroom_ok=headroom)

    def room_for(self, n: int) -> bool:
        """Room for ``n`` more cells: in the pool, and within the cells this session reserved for forks
        (other sessions on the engine count on theirs)."""
        held = self.prep.cells(len(self.ctx)) if self.prep is not None else 0
        if self.fork_cells is not None and held + n > self.fork_cells:
            return False
        return free_cells(self.ctx.engine) >= n + 8

    def _deadline_rows(self) -> int:
        """Rows per step the preparation gets next to the conversation's decoding: the engine's small
        default far from the edge; more as the edge nears (the next turn, by the largest recent one,
        would cross ``hard``, or the window edge) — the same rows the edge would otherwise spend as a
        stall, taken earlier while the conversation runs (its decoding slows meanwhile)."""
        n, turn = len(self.ctx), self.meter.rates().turn_tokens
        if n + turn >= self.limits.window - self.margin:
            return 2 * DEADLINE_ROWS
        if n + turn >= self.limits.hard:
            return DEADLINE_ROWS
        return 0

    def _advance(self) -> None:
        p = self.prep
        p.set_rows(self._deadline_rows())
        if p.advance(self.ctx.seq, len(self.ctx), room=self.room_for, mode=self.policy.rebase):
            self.meter.summary(p.summary.tokens if not p.summary.fallback else 0, p.elapsed_ms / 1000.0)
            self.emit(self.maker.ready_event(p.summary, p.elapsed_ms))
        if p.state == "summarizing" and p.fallback is None:  # the edge may come first: prefill the fallback
            p.prepare_fallback(self.ctx.seq, len(self.ctx), p.job.fallback_summary(), room=self.room_for,
                               mode=self.policy.rebase)
        if p.rebase is not None and p.rebase.done() and p.rebase_t0:
            self.meter.prefill(p.rebase_rows, time.perf_counter() - p.rebase_t0)
            p.rebase_t0 = 0.0
        if p.fallback_rebase is not None and p.fallback_rebase.done() and p.fallback_t0:
            self.meter.prefill(p.fallback_rows, time.perf_counter() - p.fallback_t0)
            p.fallback_t0 = 0.0

    def _restart_if_needed(self) -> None:
        p = self.prep
        if p.replacement is not None:
            summary = len(p.replacement.tokens)
        elif p.fallback is not None:  # what the edge commits if the model's summary is late: restarting
            summary = len(p.fallback.tokens)  # would throw away its prefilled context for nothing
        else:
            summary = summary_message_budget(self.policy, self.limits.window)
        tail, edge = len(self.ctx) - p.cut_token, self.limits.window - self.margin
        why = needs_restart(self.policy, self.limits.window, summary_tokens=summary, prefix_tokens=p.prefix_tok,
                            tail_tokens=tail, overhead=0)
        # the largest turn of a longer memory (one swap must make room for it), up to a third of the
        # window: room for a larger one would mean summarizing everything, restarting after every message
        turn = min(self.meter.rates().peak_turn_tokens, self.limits.window // 3)
        if not why and turn and p.prefix_tok + summary + tail + turn > edge:
            why = "tail_outgrew_window"  # committing it would not leave room for the next turn
        # (no room for the next turn otherwise: the newest cut, even if nothing stays raw)
        m = self.cuts.choose(keep_recent=0) if why == "tail_outgrew_window" else self.cuts.choose()
        if not why or m is None or m <= p.cut:
            return
        new_tail = len(self.ctx) - self.ctx.cut_token(m)
        if why == "tail_outgrew_window":
            if p.prefix_tok + summary + new_tail + turn > edge:
                return  # a later cut would not leave room either

        elif needs_restart(self.policy, self.limits.window, summary_tokens=summary_message_budget(self.policy, self.limits.window),
                           prefix_tokens=p.prefix_tok, tail_tokens=new_tail, overhead=0):
            return
        trigger = p.commit_trigger
        self.cancel(why)
        if self.start("restart", keep_recent=0 if why == "tail_outgrew_window" else None) and trigger:
            self.prep.commit_trigger = trigger

    def defer(self, trigger: str) -> bool:
        """Mark a preparation (started now if needed) for a commit once it is caught up, instead of
        waiting for it.  True when a commit is scheduled."""
        self.ask_model_again()
        self.recut_for(trigger)
        if self.prep is None and not self.start(trigger, loose=True):
            return False
        self.prep.commit_trigger = trigger
        return True

    def ask_model_again(self) -> None:
        """``/compact``, the tool and instructions always ask the model: a pending preparation written
        without it on purpose (no time, or its summaries said nothing new) is dropped for a new one."""
        p = self.prep
        if p is not None and p.job.summary is not None and p.job.summary.skipped:
            self.cancel("asks_model")

    def compress(self) -> bool:
        """A COMPRESS verdict: mark the preparation (started now, at a cut worth summarizing, if there is
        none) for a commit once caught up.  False when there is nothing to summarize."""
        if self.prep is None:
            self.start("compress")  # a cut worth summarizing (min_span), or nothing
        if self.prep is None:
            return False
        self.prep.commit_trigger = "compress"
        return True

    def missed_edge(self, p: Preparation, attempts: int, wait_ms: float) -> None:
        """The model's summary was not in by the window edge: the pace it managed sizes the next ones (at
        least a token: an attempt still in its prompt wrote none), so the next preparation asks the model
        for what it can write in time (:meth:`affordable`)."""
        self.meter.summary(max(1, p.written), p.elapsed_ms / 1000.0)
        self.meter.summary_pace(*(p.pace or (p.elapsed_ms / 1000.0,)))  # no token yet: all of it was prompt
        self.paced = True
        self.missed += 1
        self.emit(ev.SummaryFailed("max_stall", attempts,
                                   f"not ready at the window edge (waited {wait_ms:.0f} ms; max_stall_ms="
                                   f"{self.policy.max_stall_ms}; a wait stops early when the summary's "
                                   "measured progress says it cannot be in by then)"))

    def wait_at_edge(self, p: Preparation, t0: float):
        """Until ``max_stall_ms`` after ``t0``: let the preparation catch up (the engine has the rows to
        itself while the conversation waits).  Then, or at once when the model's summary cannot be in by
        then, the fallback."""
        deadline = t0 + self.policy.max_stall_ms / 1000.0
        p.set_rows(EDGE_ROWS)
        p.advance(self.ctx.seq, len(self.ctx), room=self.room_for, mode=self.policy.rebase)
        if p.state == "summarizing" and p.fallback is None:
            # the model may miss the deadline: the fallback's context prefills beside it, so that missing
            # it costs the rest of that prefill, not all of it after the wait
            p.prepare_fallback(self.ctx.seq, len(self.ctx), p.job.fallback_summary(), room=self.room_for,
                               mode=self.policy.rebase)
        if not self._model_in_time(p):
            return p.use_fallback()
        while True:
            p.advance(self.ctx.seq, len(self.ctx), room=self.room_for, mode=self.policy.rebase)
            left = deadline - time.perf_counter()
            if p.state == "caught_up" or left <= 0:
                break
            waitable = p.rebase if p.rebase is not None else p.job.attempt
            if waitable is not None:
                waitable.wait(min(left, 0.02))
            else:
                time.sleep(min(left, 0.005))
        # the model's summary is there, its context not: as costly as a fallback whose context is not
        # caught up either (one prepared at this edge), and better; a caught-up fallback is cheaper
        fallback_ready = p.fallback_rebase is not None and p.fallback_rebase.done()
        if p.state == "caught_up" or (p.replacement is not None and not fallback_ready):
            return p.summary
        return p.use_fallback()

    def _model_in_time(self, p: Preparation) -> bool:
        """Can the model's summary still be written within ``max_stall_ms``?  By the measured background
        summary rate, else by this job's own progress (its prompt's prefill counted in: a low estimate).
        When it cannot and the fallback's context is prefilled, waiting would only add to the stall."""
        if p.state != "summarizing" or p.fallback_rebase is None:
            return True
        need = p.job.seconds_left(self.meter.rates().summary_tok_s)
        return need is None or need <= self.policy.max_stall_ms / 1000.0  # unknown: wait and see


__all__ = ["Background", "DEADLINE_ROWS", "EDGE_ROWS", "IDLE_POLL_S"]
