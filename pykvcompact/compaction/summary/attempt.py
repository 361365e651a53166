"""One summary attempt on a fork (:class:`Attempt`): the summarizer prompt appended, then the model's
summary generated, synchronously or as background jobs the engine interleaves with the foreground, and
the verdict on what it wrote (:func:`validate`: usable, or the reason it failed).

Apart from ``summarizer.py``, which writes the prompt and the fallback text and starts attempts: an
attempt is what drives the fork (its jobs, its timing, its injected faults) while a summary is written.
"""
from __future__ import annotations

import time
from typing import Callable, List, Optional

from ...engine.port import grant_rows
from .tool_call_syntax import looks_like_tool_call

FAILURES = ("exception", "empty", "over_length", "timeout", "tool_call")


def looping(text: str, repeats: int = 3) -> bool:
    """The output ends with the same non-empty line ``repeats`` times (small models loop): the attempt
    is stopped early and counts as over length."""
    lines = [l.strip() for l in text.split("\n") if l.strip()]
    if len(lines) > repeats and not text.endswith("\n"):
        lines = lines[:-1]  # the last line may be incomplete
    return len(lines) >= repeats and len(set(lines[-repeats:])) == 1 and len(lines[-1]) >= 8


def validate(text: Optional[str], n_tokens: int, finish_reason: Optional[str], error, max_tokens: int,
             timed_out: bool = False) -> Optional[str]:
    """``None`` when the attempt produced a usable summary, else the failure reason."""
    if timed_out:
        return "timeout"
    if error is not None or finish_reason in ("error", "cancelled", "context_full"):
        return "exception"
    if not text or not text.strip():
        return "empty"
    if looks_like_tool_call(text):
        return "tool_call"
    if finish_reason == "length" or n_tokens > max_tokens:
        return "over_length"
    return None


class Attempt:
    """One summary generation on a fork: ``fork.tokens == history[:cut]``; appends ``prompt_tokens`` then
    generates at most ``max_tokens``. Background attempts use ``append_background``/``generate_background``
    (rows interleaved with the foreground), synchronous ones ``append``/``generate``."""

    def __init__(self, fork, prompt_tokens: List[int], *, max_tokens: int, background: bool, timeout: float,
                 detokenize: Callable[[List[int]], str], fault: Optional[str] = None, attempt: int = 1):
        self.fork = fork
        self.max_tokens = max_tokens
        self.background = background
        self.timeout = 0.0 if fault == "timeout" else timeout
        self.detokenize = detokenize
        self.fault = fault
        self.attempt = attempt
        self.t0 = time.perf_counter()
        self.t_done: Optional[float] = None
        self.t_first: Optional[float] = None   # when a first summary token was seen (its prompt is in by then)
        self.error = None
        self.tokens: List[int] = []
        self.finish_reason: Optional[str] = None
        self._prefill = None
        self._gen = None
        self._done = False
        self._cancelled = False
        self.looped = False
        self.rows_per_step = 0
        try:
            if fault == "exception":
                raise RuntimeError("injected summarizer fault")
            if background:
                self._prefill = fork.append_background(list(prompt_tokens))
                try:
                    # the engine queues it behind the prefill: no foreground step is needed to start it
                    self._gen = fork.generate_background(max_tokens, temperature=0.0)
                except Exception:
                    self._gen = None  # a backend without a job queue: poll() starts it after the prefill
            else:
                fork.append(list(prompt_tokens))
                stream = getattr(fork, "stream", None)
                if stream is None:
                    self.tokens = list(fork.generate(max_tokens, temperature=0.0))
                else:
                    it = stream(max_tokens, temperature=0.0)
                    try:
                        for t in it:
                            self.tokens.append(t)
                            if len(self.tokens) % 8 == 0 and looping(detokenize(self.tokens)):
                                self.looped = True
                                break
                    finally:
                        close = getattr(it, "close", None)
                        if close is not None:
                            close()
                self.finish_reason = "length" if (self.looped or len(self.tokens) >= max_tokens) else "stop"
                self._finish()
        except Exception as e:  # noqa: BLE001 - any failure is a summarizer failure
            self.error = e
            self._finish()

    def set_rows_per_step(self, n: int) -> None:
        """Give this background attempt more rows per step (its deadline is near)."""
        self.rows_per_step = n  # also for a generation job started later (see poll)
        for j in (self._prefill, self._gen):
            grant_rows(j, n)

    def _finish(self):
        self._done = True
        self.t_done = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return (self.t_done or time.perf_counter()) - self.t0

    def pace(self, written: int) -> Optional[tuple]:
        """``(seconds before the first token, tokens per second since)`` measured on this attempt (its prompt's
        prefill, then its writing), or None before a second token was seen."""
        if self.t_first is None or written < 2:
            return None
        now = self.t_done or time.perf_counter()
        return self.t_first - self.t0, (written - 1) / max(now - self.t_first, 1e-3)

    @property
    def timed_out(self) -> bool:
        return not self._done and self.elapsed > self.timeout

    def poll(self) -> bool:
        """Advance; True when finished (successfully or not)."""
        if self._done:
            return True
        try:
            if self._gen is None:
                if self._prefill is not None and not self._prefill.done():
                    return False
                if self._prefill is not None and getattr(self._prefill, "error", None):
                    raise RuntimeError(f"summary prefill failed: {self._prefill.error}")
                self._gen = self.fork.generate_background(self.max_tokens, temperature=0.0)
                if self.rows_per_step:
                    grant_rows(self._gen, self.rows_per_step)
            if not self._gen.done():
                toks = self._gen.tokens
                if toks and self.t_first is None:
                    self.t_first = time.perf_counter()
                if len(toks) >= 24 and looping(self.detokenize(toks)):  # a weak model repeating itself
                    self.looped = True
                    self._gen.cancel()
                    self.tokens = list(toks)
                    self.finish_reason = "length"
                    self._finish()
                    return True
                return False
            self.tokens = list(self._gen.result())
            self.finish_reason = getattr(self._gen, "finish_reason", None) or (
                "length" if len(self.tokens) >= self.max_tokens else "stop")
            if getattr(self._gen, "error", None):
                self.error = self._gen.error
        except Exception as e:  # noqa: BLE001
            self.error = e
        self._finish()
        return True

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until finished or ``timeout`` (default: what is left of the attempt's own timeout)."""
        if self._done:
            return True
        left = self.timeout - self.elapsed if timeout is None else timeout
        deadline = time.perf_counter() + max(0.0, left)
        while not self.poll():
            rem = deadline - time.perf_counter()
            if rem <= 0:
                return False
            job = self._gen or self._prefill
            try:
                if job is not None and hasattr(job, "result") and job is self._gen:
                    job.result(timeout=min(rem, 0.5))
                else:
                    time.sleep(min(rem, 0.005))
            except Exception:  # timeout or job error: poll() records it
                pass
        return True

    def cancel(self):
        self._cancelled = True
        for j in (self._gen, self._prefill):
            try:
                if j is not None and not j.done():
                    j.cancel()
            except Exception:
                pass

    def outcome(self):
        """``(text, failure_reason_or_None)``."""
        if self.fault in ("timeout",):
            return "", "timeout"
        if not self._done and self.timed_out:
            return "", "timeout"
        text = ""
        if self.error is None and self.tokens:
            try:
                text = self.detokenize(self.tokens)
            except Exception as e:  # noqa: BLE001
                self.error = e
        fr = self.finish_reason
        if self.fault == "empty":
            text = ""
        elif self.fault == "over_length":
            fr = "length"
        elif self.fault == "tool_call":
            text = '{"name": "compact_conversation", "arguments": {}}'
        reason = validate(text, len(self.tokens), fr, self.error, self.max_tokens)
        return text.strip(), reason


__all__ = ["Attempt", "FAILURES", "looping", "validate"]
