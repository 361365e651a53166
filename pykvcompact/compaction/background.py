"""The background mode's half of the :class:`~.compactor.Compactor`: start a preparation when the schedule
says, advance it between steps with the rows its deadline needs, restart it at a later cut when the raw
tail outgrew it, and commit it once caught up when COMPRESS, the tool or ``hard`` asked.  A mixin: it
works on the compactor's state (``ctx``, ``prep``, ``meter``, ``lim``) and calls its ``_commit``."""
from __future__ import annotations

import time
from typing import Optional

from .. import events as ev
from .policy import needs_restart, summary_message_budget
from . import scheduler as sch
from ..engine.port import engine_errors
from .preparation import Preparation
from .summary.summaries import MIN_MODEL_TOKENS

# rows per step for a preparation whose deadline is near (the engine's default is 8 next to the
# conversation's decoding, 64 when it is idle): each row slows that step's decode (~3 ms a row here)
DEADLINE_ROWS = 16
# preparations the schedule starts (not a /compact or a tool call, which wait for the model's summary)
PACED = ("soft", "schedule", "next_turns", "restart", "compress", "hard")
SCHEDULED = ("soft", "schedule", "next_turns", "restart")   # swapped in when ``hard`` comes
PACE_MARGIN = 0.7   # plan on 70% of the measured pace: the conversation may speed up
RETRY_AFTER_SKIPS = 3   # preparations without the model before it is asked again, uncapped
MAX_BACKOFF = 3         # ...doubled per abandoned retry, at most this many times (24)
IDLE_POLL_S = 0.02  # Session.idle: how often the preparation is advanced while the engine works alone


class BackgroundPreparation:
    def start(self, reason: str, instructions: Optional[str] = None, loose: bool = False,
              keep_recent: Optional[int] = None, floor: bool = True) -> bool:
        if keep_recent is None and self.policy.mode == "background":
            keep_recent = self._keep_at_start(reason)
        mark = self._mark(loose, keep_recent, floor)
        if mark is None or (not loose and len(self.ctx) < self.no_gain_until):
            return False
        ctx = self.ctx
        bg = self.policy.mode == "background"
        # after a few summaries without the model, ask it again uncapped: its pace is measured anew (the
        # machine may have quietened, the agent's tools may now leave the engine idle)
        paced = bg and reason in PACED and self.skips < self._retry_after()
        try:
            job = self.maker.start(mark, instructions, background=bg, trigger=reason,
                                   affordable=self._affordable() if paced else None)
        except engine_errors():
            return False
        skipped = job.summary is not None and job.summary.reason == "no_time"
        self.skips = self.skips + 1 if skipped else 0
        self.prep = Preparation(job, mark=mark, mark_tok=ctx.mark_tok(mark), prefix_tok=ctx.prefix_tok(),
                                instructions=instructions, build=lambda s: self.maker.replacement(mark, s),
                                reason=reason)
        self.emit(ev.SummaryStarted(mark, ctx.mark_tok(mark), background=True, reason=reason))
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
            return max(0, self.lim.keep_recent - max(0, self.lim.hard - len(self.ctx)))
        return None

    def covers_unanswered(self, p: Preparation) -> bool:
        """Does ``p``'s cut summarize a message no finished reply has followed yet (a tool result just in,
        the question a reply is being written to)?  Such a preparation is not swapped in before that reply
        unless the window's edge leaves no choice: the model answers what it has read in full."""
        return p.mark_tok > len(self.ctx) - self._unanswered_tail()

    def _unanswered_tail(self) -> int:
        """Live tokens from the first message after the last finished assistant reply (0: none)."""
        ents, first = self.ctx.entries, self.ctx.n_prefix
        for i in range(len(ents) - 1, self.ctx.n_prefix - 1, -1):
            if ents[i].summary or ents[i].msg.get("role") == "assistant":
                first = i + 1
                break
        # what an agent waits on: a tool result, or the messages a reply is being written to (an agent
        # that only adds messages, never asking for a reply, would otherwise hold every swap to the edge)
        if first >= len(ents) or (self.ctx.partial is None and
                                  not any(e.msg.get("role") == "tool" for e in ents[first:])):
            return 0
        return self._tokens_from(first)

    def recut_for(self, trigger: str) -> None:
        """``/compact`` and the tool leave ``keep_recent`` raw: a pending preparation cut later than that
        (for ``hard``, where more arrives first, or for a COMPRESS verdict) is cut again."""
        p = self.prep
        if p is None or trigger not in ("manual", "tool") or len(self.ctx) - p.mark_tok >= self.lim.keep_recent:
            return
        m = self._mark(True)
        if m is not None and m < p.mark:
            self.cancel("keep_recent")

    def _affordable(self) -> Optional[int]:
        """Summary tokens the model can write before the window edge at the paces measured in this session
        — the conversation's growth, the summary prompt's time before its first token, the writing rate
        after it, the rebased context's prefill — with a margin; None until a model summary has missed the
        edge once (``paced``) or while a pace is unknown.  On a slow machine a full-size summary started at
        ``soft`` is never in by the edge (measured: 10 of 11 on Qwen2.5-Coder-1.5B, 2 cores, each abandoned
        for the fallback after taking its rows): it is sized to what fits instead, or not asked for."""
        r = self.meter.rates()
        if not self.paced or not r.growth_tok_s or r.summary_prompt_s is None:
            return None
        seconds = (self.lim.window - self.margin - len(self.ctx)) / r.growth_tok_s - r.summary_prompt_s
        if r.prefill_tok_s:
            rows = summary_message_budget(self.policy, self.lim.window) + max(self.lim.keep_recent, r.turn_tokens)
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
        a = self._affordable() if self.skips < self._retry_after() else None
        if a is None:
            return self.lim.summary
        return min(self.lim.summary, a) if a >= MIN_MODEL_TOKENS else 0

    def cancel(self, reason: Optional[str]) -> None:
        p, self.prep = self.prep, None
        if p is None:
            return
        p.cancel()
        if reason is not None:
            self.emit(ev.PreparationRestarted(reason, p.mark, len(self.ctx) - p.mark_tok))

    def tick(self, turn_end: bool = False) -> None:
        """Between steps (background mode): advance the preparation, start one when the schedule says,
        restart one the raw tail has outgrown, commit one a COMPRESS verdict (or the tool) asked for once
        caught up.  ``turn_end``: a call's messages are all in, or a reply is being written or just
        closed: what comes next will be the raw tail."""
        if self.policy.mode != "background":
            return
        self.maker.notes.poll()
        if self.prep is not None:
            self._advance()
            self._restart_if_needed()
        if self.prep is None:
            rates = self.meter.rates()
            why = sch.start_reason(self.policy, self.lim, self._state(len(self.ctx)), rates)
            # turns as large as keep_recent: the next turn will be the raw tail, so at a turn's end the
            # whole history may be summarized now, while the conversation waits for its next message
            if why and not self.start(why) and turn_end and rates.turn_tokens >= self.lim.keep_recent:
                self.start(why, keep_recent=0)
        if self.prep is not None and self.prep.fallback is None:
            self._advance()  # a preparation started or restarted now: its fallback context starts at once
        p = self.prep
        if p is not None and p.commit_trigger and p.state == "caught_up" and not self.covers_unanswered(p):
            self._commit(p.commit_trigger, None, edge=False)

    def _deadline_rows(self) -> int:
        """Rows per step the preparation gets next to the conversation's decoding: the engine's small
        default far from the edge; more as the edge nears (the next turn, by the largest recent one,
        would cross ``hard``, or the window edge) — the same rows the edge would otherwise spend as a
        stall, taken earlier while the conversation runs (its decoding slows meanwhile)."""
        n, turn = len(self.ctx), self.meter.rates().turn_tokens
        if n + turn >= self.lim.window - self.margin:
            return 2 * DEADLINE_ROWS
        if n + turn >= self.lim.hard:
            return DEADLINE_ROWS
        return 0

    def _advance(self) -> None:
        p = self.prep
        p.set_rows(self._deadline_rows())
        if p.advance(self.ctx.seq, len(self.ctx), room=self._room_for, mode=self.policy.rebase):
            self.meter.summary(p.summary.tokens if not p.summary.fallback else 0, p.elapsed_ms / 1000.0)
            self.emit(self.maker.ready_event(p.summary, p.elapsed_ms))
        if p.state == "summarizing" and p.fallback is None:  # the edge may come first: prefill the fallback
            p.prepare_fallback(self.ctx.seq, len(self.ctx), p.job.fallback_summary(), room=self._room_for,
                               mode=self.policy.rebase)
        if p.rb is not None and p.rb.done() and p.rb_t0:
            self.meter.prefill(p.rb_rows, time.perf_counter() - p.rb_t0)
            p.rb_t0 = 0.0
        if p.fallback_rb is not None and p.fallback_rb.done() and p.fallback_t0:
            self.meter.prefill(p.fallback_rows, time.perf_counter() - p.fallback_t0)
            p.fallback_t0 = 0.0

    def _restart_if_needed(self) -> None:
        p = self.prep
        if p.replacement is not None:
            summary = len(p.replacement.tokens)
        elif p.fallback is not None:  # what the edge commits if the model's summary is late: restarting
            summary = len(p.fallback.tokens)  # would throw away its prefilled context for nothing
        else:
            summary = summary_message_budget(self.policy, self.lim.window)
        tail, edge = len(self.ctx) - p.mark_tok, self.lim.window - self.margin
        why = needs_restart(self.policy, self.lim.window, summary_tokens=summary, prefix_tokens=p.prefix_tok,
                            tail_tokens=tail, overhead=0)
        # the largest turn of a longer memory (one swap must make room for it), up to a third of the
        # window: room for a larger one would mean summarizing everything, restarting after every message
        turn = min(self.meter.rates().peak_turn_tokens, self.lim.window // 3)
        if not why and turn and p.prefix_tok + summary + tail + turn > edge:
            why = "tail_outgrew_window"  # committing it would not leave room for the next turn
        # (no room for the next turn otherwise: the newest cut, even if nothing stays raw)
        m = self._mark(keep_recent=0) if why == "tail_outgrew_window" else self._mark()
        if not why or m is None or m <= p.mark:
            return
        new_tail = len(self.ctx) - self.ctx.mark_tok(m)
        if why == "tail_outgrew_window":
            if p.prefix_tok + summary + new_tail + turn > edge:
                return  # a later cut would not leave room either

        elif needs_restart(self.policy, self.lim.window, summary_tokens=summary_message_budget(self.policy, self.lim.window),
                           prefix_tokens=p.prefix_tok, tail_tokens=new_tail, overhead=0):
            return
        trig = p.commit_trigger
        self.cancel(why)
        if self.start("restart", keep_recent=0 if why == "tail_outgrew_window" else None) and trig:
            self.prep.commit_trigger = trig

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
        if self.policy.mode != "background":
            return False
        self.ask_model_again()
        self.recut_for(trigger)
        if self.prep is None and not self.start(trigger, loose=True):
            return False
        self.prep.commit_trigger = trigger
        self.tick()
        return True

    def ask_model_again(self) -> None:
        """``/compact``, the tool and instructions always ask the model: a pending preparation written
        without it on purpose (no time, or its summaries said nothing new) is dropped for a new one."""
        p = self.prep
        if p is not None and p.job.summary is not None and p.job.summary.skipped:
            self.cancel("asks_model")

    def compress(self) -> None:
        """A COMPRESS verdict: synchronous modes compact now; background commits once caught up."""
        if self.policy.mode != "background":
            if self._mark() is not None:
                self.compact("compress")
            return
        if self.prep is None:
            self.start("compress")  # a cut worth summarizing (min_span), or nothing
        if self.prep is not None:
            self.prep.commit_trigger = "compress"
            self.tick()


__all__ = ["BackgroundPreparation", "DEADLINE_ROWS"]
