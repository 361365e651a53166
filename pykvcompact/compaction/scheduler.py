"""When to prepare, commit, wait or fall back: pure functions (no engine), tested with hypothesis.

Background mode must not stall by luck.  A preparation (summary on a fork, then the rebased context
prefilled in the background) takes time; the live context grows towards ``hard`` meanwhile.  So the
preparation starts when the *predicted* time to reach ``hard`` (recent growth in tokens per second) is
no longer than the *predicted* preparation time (summary tokens still to write at the measured
background rate, plus the rebased context to prefill), or when the next turns (the largest recent turn,
twice) would cross ``hard`` — and never later than ``soft``, never earlier than ``soft - early_start``.

At ``hard`` a preparation that is caught up is committed.  One still pending keeps going in the headroom
above ``hard``; at the window edge the session waits for it at most ``max_stall_ms`` and then swaps onto
the deterministic fallback summary.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .policy import Limits, Policy

PREP_STATES = ("none", "summarizing", "ready", "caught_up")
ACTIONS = ("none", "prepare", "commit", "wait", "fallback", "compact_now")


@dataclass(frozen=True)
class Rates:
    """Measured speeds (None: not measured yet)."""
    growth_tok_s: Optional[float] = None   # live tokens added per second, recent turns
    turn_tokens: int = 0                   # the largest recent growth in one turn
    summary_tok_s: Optional[float] = None  # background summary tokens per second
    prefill_tok_s: Optional[float] = None  # background prefill rows per second
    peak_turn_tokens: int = 0              # the largest growth in one turn over a longer memory
    summary_prompt_s: Optional[float] = None   # a background summary's time before its first token
    summary_write_tok_s: Optional[float] = None  # its writing rate once started


@dataclass(frozen=True)
class State:
    tokens: int                 # live tokens now
    tokens_after: int           # live tokens once the next step (append or chunk) is done
    prep: str = "none"          # one of PREP_STATES
    summary_left: int = 0       # summary tokens still to write (estimate; before a preparation: to be written)
    prefill_left: int = 0       # prompt + shadow rows still to prefill (estimate)
    waited_ms: float = 0.0      # time already waited at the window edge
    headroom_ok: bool = True    # the pool can hold the shadow if the session runs above hard


@dataclass(frozen=True)
class Action:
    kind: str
    reason: str = ""


def predicted_prep_s(rates: Rates, summary_left: int, prefill_left: int) -> Optional[float]:
    """Seconds until a preparation is caught up, or None when a rate is still unknown.  ``summary_left``
    0: no model summary to write (the deterministic one serves: only the prefill counts)."""
    if (summary_left > 0 and rates.summary_tok_s is None) or rates.prefill_tok_s is None:
        return None
    if (summary_left > 0 and rates.summary_tok_s <= 0) or rates.prefill_tok_s <= 0:
        return float("inf")
    return (summary_left / rates.summary_tok_s if summary_left > 0 else 0.0) + prefill_left / rates.prefill_tok_s


def time_to_hard_s(limits: Limits, tokens: int, rates: Rates) -> Optional[float]:
    """Seconds until the live context reaches ``hard`` at the recent growth rate (None: unknown)."""
    if tokens >= limits.hard:
        return 0.0
    if not rates.growth_tok_s or rates.growth_tok_s <= 0:
        return None
    return (limits.hard - tokens) / rates.growth_tok_s


def start_reason(p: Policy, limits: Limits, st: State, rates: Rates) -> str:
    """Why a preparation should start now ("" when it should not).  Background mode only."""
    if p.mode != "background" or st.prep != "none":
        return ""
    if st.tokens >= limits.soft:
        return "soft"
    if st.tokens < limits.earliest:
        return ""
    if rates.turn_tokens and st.tokens + 2 * rates.turn_tokens >= limits.hard:
        return "next_turns"
    need = predicted_prep_s(rates, st.summary_left, st.prefill_left)
    left = time_to_hard_s(limits, st.tokens, rates)
    if need is not None and left is not None and left <= need:
        return "schedule"
    return ""


def edge_action(p: Policy, limits: Limits, st: State, margin: int) -> Action:
    """What to do when the next step would reach ``tokens_after`` with a preparation in ``st.prep``."""
    if st.tokens_after < limits.hard:
        return Action("none")
    if st.prep == "none":
        return Action("compact_now", "no_preparation")
    if st.prep == "caught_up":
        return Action("commit", "ready")
    if st.tokens_after <= limits.window - margin and st.headroom_ok:
        return Action("none", "headroom")  # keep going above hard while it finishes
    if st.waited_ms < p.max_stall_ms:
        return Action("wait", st.prep)
    return Action("fallback", "max_stall" if st.prep == "summarizing" else "rebase_late")


def decide(p: Policy, limits: Limits, st: State, rates: Rates, margin: int = 24) -> Action:
    """The one background decision for the next step: prepare, commit, wait, fall back, or nothing."""
    if p.mode != "background":
        return Action("compact_now", "trigger") if st.tokens_after >= limits.trigger else Action("none")
    act = edge_action(p, limits, st, margin)
    if act.kind != "none":
        return act
    why = start_reason(p, limits, st, rates)
    return Action("prepare", why) if why else act


class RateMeter:
    """Running estimates of the rates the schedule needs (exponentially weighted, recent turns first)."""

    def __init__(self, alpha: float = 0.5, turns: int = 4, peak_turns: int = 16):
        # ``turns``: what the start schedule extrapolates (recent pace); ``peak_turns``: the room a swap must
        # leave (an agent's large tool results come back every few tasks, e.g. a file read every 6 turns)
        self.alpha, self.turns, self.peak_turns = alpha, turns, peak_turns
        self._growth: Optional[float] = None
        self._summary: Optional[float] = None
        self._prefill: Optional[float] = None
        self._paced: list = []                    # (tokens, seconds) of the recent steps
        self._prompt_s: Optional[float] = None
        self._write: Optional[float] = None
        self._recent = []

    def _mix(self, old, new):
        return new if old is None else self.alpha * new + (1 - self.alpha) * old

    def turn(self, tokens: int, seconds: float):
        """A step of the conversation added ``tokens`` live tokens in ``seconds`` (wall time since the previous
        step: a caller's own time between calls counts, as it does for the window edge)."""
        if tokens <= 0:
            return
        self._recent = (self._recent + [tokens])[-max(self.turns, self.peak_turns):]
        if seconds > 0:
            # tokens over time across the recent steps, not a mean of per-step rates: an agent that adds a
            # tool result (many tokens, quickly) then asks for a reply (few tokens, slowly) grows at the pace
            # of the two together
            self._paced = (self._paced + [(tokens, seconds)])[-self.turns:]
            self._growth = sum(t for t, _ in self._paced) / sum(x for _, x in self._paced)

    def summary(self, tokens: int, seconds: float):
        if tokens > 0 and seconds > 0:
            self._summary = self._mix(self._summary, tokens / seconds)

    def summary_pace(self, prompt_s: float, write_tok_s: Optional[float] = None):
        """A background summary took ``prompt_s`` before its first token, then wrote ``write_tok_s`` (None:
        it had not started writing, and ``prompt_s`` is a lower bound)."""
        if prompt_s >= 0:
            self._prompt_s = self._mix(self._prompt_s, prompt_s)
        if write_tok_s is not None and write_tok_s > 0:
            self._write = self._mix(self._write, write_tok_s)

    def prefill(self, tokens: int, seconds: float):
        if tokens > 0 and seconds > 0:
            self._prefill = self._mix(self._prefill, tokens / seconds)

    def rates(self) -> Rates:
        return Rates(self._growth, max(self._recent[-self.turns:], default=0), self._summary, self._prefill,
                     peak_turn_tokens=max(self._recent, default=0), summary_prompt_s=self._prompt_s,
                     summary_write_tok_s=self._write)


__all__ = ["Rates", "State", "Action", "ACTIONS", "PREP_STATES", "decide", "edge_action", "start_reason",
           "predicted_prep_s", "time_to_hard_s", "RateMeter"]
