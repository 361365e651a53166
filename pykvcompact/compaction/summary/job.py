"""One summary of the history up to a cut: fork, attempts, retry, fallback — the same code whether it
runs synchronously (``fixed``/``hard``/``rubric``/``tool``) or in the background.

``wait()`` always returns a :class:`Summary` — the model's, or the deterministic fallback when the
attempts failed or the caller's deadline passed — never a half state.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, List, Optional

from ... import events as ev
from .summarizer import SKIPS
from .novelty import informative
from ...engine.port import engine_errors


@dataclass
class Summary:
    text: str
    tokens: int           # summary tokens generated (or of the fallback text)
    fallback: bool
    attempts: int
    reason: str = ""      # why the fallback was used; "trimmed" or "uninformative" for the model's own

    @property
    def skipped(self) -> bool:
        """Written without the model on purpose (no attempt made): one of ``summarizer.SKIPS``."""
        return self.fallback and self.attempts == 0 and self.reason in SKIPS


class SummaryJob:
    """``fork_at(cut_token)`` gives a fork of the live sequence up to the cut; ``prompt(shorter)`` the summarizer prompt tokens
    (ending with the generation prompt and the prefilled first heading); ``fallback(reason)`` the
    deterministic text; ``emit`` receives ``SummaryFailed`` events.  ``skip``: why the model is not asked at
    all (``skip_reason``: ``no_time`` before the window edge, or ``uninformative``: its last summaries said
    nothing): the fallback is the summary from the start."""

    def __init__(self, *, summarizer, fork_at: Callable[[], object], prompt: Callable[[bool], List[int]],
                 fallback: Callable[[str], str], detok: Callable[[List[int]], str], max_tokens: int,
                 timeout: float, retries: int, background: bool, emit: Callable[[ev.Event], None],
                 head: str = "", count: Callable[[str], int] = len, room: Callable[[int], bool] = lambda n: True,
                 skip: str = "", skip_reason: str = "no_time"):
        self._summarizer, self._fork_at, self._prompt, self._fallback = summarizer, fork_at, prompt, fallback
        self._detok, self.max_tokens, self.timeout, self.retries = detok, max_tokens, timeout, retries
        self.background, self._emit, self.head, self._count, self._room = background, emit, head, count, room
        self.t0 = time.perf_counter()
        self.attempts = 0
        self.summary: Optional[Summary] = None
        self.fork = None
        self.attempt = None
        self.prompt_tokens = 0
        if skip:  # the model is not asked (skip_reason): the deterministic (extractive) summary at once
            self._emit(ev.SummaryFailed(skip_reason, 0, skip))
            text = self._fallback(skip_reason)
            self.summary = Summary(text, self._count(text), True, 0, skip_reason)
        else:
            self._start(shorter=False)

    # ------------------------------------------------------------------ attempts
    def _start(self, shorter: bool) -> None:
        self.attempts += 1
        try:
            toks = self._prompt(shorter)
            self.prompt_tokens = len(toks)
            if not self._room(len(toks) + self.max_tokens):  # the pool cannot hold the fork: no model attempt
                self.attempts = self.retries + 1
                self._failed("no_room", f"{len(toks) + self.max_tokens} cells needed for the summary fork")
                return
            self.fork = self._fork_at()
            self.attempt = self._summarizer.start(self.fork, toks, max_tokens=self.max_tokens,
                                                  background=self.background, timeout=self.timeout,
                                                  detokenize=self._detok, attempt=self.attempts)
        except engine_errors() + (RuntimeError, ValueError) as e:
            self._close_fork()
            self.attempt = None
            self._failed("exception", f"{type(e).__name__}: {e}")

    def _close_fork(self) -> None:
        if self.fork is not None:
            try:
                self.fork.close()
            except Exception:  # noqa: BLE001
                pass
            self.fork = None

    def _failed(self, reason: str, detail: str) -> None:
        self._emit(ev.SummaryFailed(reason, self.attempts, detail))
        if self.attempts <= self.retries:
            self._start(shorter=reason == "over_length")
        else:
            text = self._fallback(reason)
            self.summary = Summary(text, self._count(text), True, self.attempts, reason)

    def _settle(self) -> None:
        """The current attempt finished: keep its summary or retry / fall back."""
        a = self.attempt
        text, reason = a.outcome()
        if reason == "timeout":
            a.cancel()
        self._close_fork()
        self.attempt = None
        # (the model's text comes back stripped: a prefilled bullet gets its space back)
        if self.head.endswith("-") and text:   # (and no second bullet when the model began with its own)
            text = " " + (text[1:].lstrip() if text[0] in "-*•" else text)
        full = (self.head + text).strip()
        kept = full.rsplit("\n", 1)[0] if reason == "over_length" and "\n" in full else ""
        if kept and not _repeats(kept) and self._count(kept) * 2 >= len(a.tokens):
            # the budget ran out mid-summary: keep its complete lines (the most important come first)
            # rather than write a whole second summary, which costs as much again and is cut the same way
            self._written(kept, self._count(kept), "trimmed")
        elif reason is None:
            self._written(full, len(a.tokens), "")
        else:
            self._failed(reason, str(a.error) if a.error is not None else "")

    def _written(self, text: str, tokens: int, reason: str) -> None:
        """The model's summary, less what says nothing; "uninformative" when nothing is left (a second
        attempt would cost as much again: the extractive parts of the summary message still carry it)."""
        said = informative(text)
        if not said:
            self._emit(ev.SummaryFailed("uninformative", self.attempts, "every heading of the summary was empty"))
            reason = "uninformative"
        self.summary = Summary(said, tokens, False, self.attempts, reason)

    # ------------------------------------------------------------------ verbs
    @property
    def done(self) -> bool:
        return self.summary is not None

    @property
    def generated(self) -> int:
        """Summary tokens written so far by the current attempt (for the rate estimate)."""
        a = self.attempt
        if a is None:
            return self.summary.tokens if self.summary else 0
        gen = getattr(a, "_gen", None)
        try:
            return len(gen.tokens) if gen is not None else len(a.tokens)
        except Exception:  # noqa: BLE001
            return 0

    def seconds_left(self, gen_rate: Optional[float] = None) -> Optional[float]:
        """An estimate of the time until this summary is written (None: nothing measured yet): the tokens
        still to write at ``gen_rate`` (measured on earlier summaries) or at this attempt's own pace; while
        its prompt is being prefilled, the prompt rows still to go at their own pace (a low estimate)."""
        a = self.attempt
        if self.done or a is None:
            return 0.0 if self.done else None
        elapsed = max(time.perf_counter() - a.t0, 1e-3)
        if gen_rate is None and self.generated > 0:
            gen_rate = self.generated / elapsed  # the prompt's prefill counted in: a slow pace
        if gen_rate:
            return max(0, self.max_tokens - self.generated) / gen_rate
        rows = getattr(getattr(a, "_prefill", None), "rows_decoded", 0) or 0
        if 0 < rows < self.prompt_tokens:
            return (self.prompt_tokens - rows) / (rows / elapsed)
        return None

    def poll(self) -> bool:
        """Advance without blocking; True when a summary is there."""
        while self.summary is None and self.attempt is not None:
            a = self.attempt
            if not (a.poll() or a.timed_out):
                return False
            self._settle()
        return self.summary is not None

    def wait(self, timeout_s: Optional[float] = None) -> Summary:
        """Block until a summary is there, at most ``timeout_s`` (None: the attempts' own timeouts); past
        that deadline the attempt is cancelled and the fallback is the summary."""
        deadline = None if timeout_s is None else time.perf_counter() + max(0.0, timeout_s)
        while not self.poll():
            a = self.attempt
            left = None if deadline is None else deadline - time.perf_counter()
            if left is not None and left <= 0:
                self.cancel()
                self.summary = self.fallback_summary("max_stall")
                break
            a.wait(min(left, 0.05) if left is not None else None)
        return self.summary

    def fallback_summary(self, reason: str = "max_stall") -> Summary:
        """What :meth:`wait` returns if its deadline passes (the job keeps running)."""
        text = self._fallback(reason)
        return Summary(text, self._count(text), True, self.attempts, reason)

    def cancel(self) -> None:
        if self.attempt is not None:
            try:
                self.attempt.cancel()
            except Exception:  # noqa: BLE001
                pass
            self.attempt = None
        self._close_fork()

    @property
    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1000.0


def _repeats(text: str) -> bool:
    """A line written twice: the model looped (its cut-off output is no summary to keep)."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return len(lines) != len(set(lines))


__all__ = ["SummaryJob", "Summary"]
