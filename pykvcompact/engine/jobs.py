"""Python handles on native jobs: background generations and prefills (``Job``) and rebase
preparations (``Rebase``). Waits are sliced so Ctrl-C still works while the GIL is released."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from ..errors import RebaseSupersededError

_SLICE_S = 0.1


def wait_job(job, timeout: float | None = None) -> bool:
    """Wait for a native job; re-raise its error. Returns False on timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not job.wait(_SLICE_S if deadline is None else max(0.0, min(_SLICE_S, deadline - time.monotonic()))):
        if deadline is not None and time.monotonic() >= deadline:
            return False
    job.rethrow()
    return True


class Job:
    """A generation or prefill running on the engine thread.

    ``done()``, ``result(timeout=None)`` (the tokens; raises the job's error), ``cancel()``,
    ``tokens`` (so far), ``finish_reason`` ("stop", "length", "cancelled", "context_full", "done",
    "error")."""

    def __init__(self, native_job, sequence: Any = None, appended: list[int] | None = None):
        self._j = native_job
        self.sequence = sequence
        self._appended = appended

    def done(self) -> bool:
        return bool(self._j.done())

    def result(self, timeout: float | None = None) -> list[int]:
        try:
            finished = wait_job(self._j, timeout)
        except KeyboardInterrupt:
            self._j.cancel()
            raise
        if not finished:
            raise TimeoutError(f"the job did not finish within {timeout} s (it keeps running; cancel() stops it)")
        return list(self._j.tokens())

    def cancel(self) -> None:
        """Stop at the next decode step (generation, prefill, queued or running). Tokens already
        decoded stay in the sequence; ``result()`` then returns them."""
        self._j.cancel()

    def set_rows_per_step(self, n: int) -> None:
        """Background work on a deadline: let this background job take up to ``n`` rows per engine step
        even next to foreground work (0: the engine's small default chunk; the foreground slows down)."""
        _set_rows(self._j, n)

    def stream(self) -> Iterator[int]:
        have = 0
        try:
            while True:
                n = self._j.wait_tokens(have, _SLICE_S)
                if n > have:
                    # (tokens_from may hold more than n by now: the engine goes on decoding meanwhile;
                    # counting n there yielded those tokens twice, '<toool_call>' in a streamed reply)
                    got = self._j.tokens_from(have)
                    for t in got:
                        yield int(t)
                    have += len(got)
                elif self._j.done():
                    rest = self._j.tokens_from(have)
                    if rest:
                        yield from (int(t) for t in rest)
                        have += len(rest)
                        continue
                    self._j.rethrow()
                    return
        finally:
            if not self._j.done():
                self._j.cancel()
                while not self._j.wait(_SLICE_S):
                    pass

    @property
    def tokens(self) -> list[int]:
        return list(self._j.tokens())

    @property
    def finish_reason(self) -> str | None:
        return self._j.finish_reason() or None

    @property
    def error(self) -> str | None:
        return self._j.error_message() or None

    @property
    def rows_decoded(self) -> int:
        """Batch rows this job put into decode steps."""
        return int(self._j.rows_decoded())

    @property
    def mixed_steps(self) -> int:
        """Decode steps this job shared with work of the other priority (foreground/background)."""
        return int(self._j.mixed_steps())

    def __repr__(self) -> str:
        return f"Job(done={self.done()}, tokens={len(self.tokens)}, finish_reason={self.finish_reason!r})"


class Rebase:
    """A rebase being prepared in the background. ``done()`` is true while the prepared sequence is
    caught up with its source (it becomes false again when the source grows, until it catches up)."""

    def __init__(self, sequence, rid: int, native_job, keep_prefix: int, keep_from: int, replacement: list[int], mode: str):
        self.sequence = sequence
        self.id = rid
        self._j = native_job
        self.keep_prefix = keep_prefix
        self.keep_from = keep_from
        self.replacement = replacement
        self.mode = mode
        self._committed = False

    def mark_committed(self) -> None:
        """The engine committed it (Engine.commit_rebase): closing it no longer cancels anything."""
        self._committed = True

    def done(self) -> bool:
        return bool(self._j.ready()) or bool(self._j.done())

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until caught up; raise the preparation's error if it failed. False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._j.wait_ready(_SLICE_S):
                return True
            if self._j.done():
                self._j.rethrow()
                return False
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def raise_if_superseded(self) -> None:
        """Raise the preparation's ``RebaseSupersededError`` if the engine ended it for that reason."""
        if self._j.done() and self._j.finish_reason() == "error":
            try:
                self._j.rethrow()
            except RebaseSupersededError:
                raise
            except Exception:  # noqa: BLE001 - another failure: the caller's own error stands
                pass

    def set_rows_per_step(self, n: int) -> None:
        """Rows per engine step this preparation may take next to foreground work (see ``Job``)."""
        _set_rows(self._j, n)

    def cancel(self) -> None:
        """Drop the preparation and free its slot and cells (not once its commit has begun)."""
        if not self._j.done() and not self.sequence.closed and not self.sequence.engine.closed:
            self.sequence.engine.native().cancel_rebase(self.id)

    def __del__(self):
        # A dropped preparation gives its slot and cells back at the engine's next pause between steps; the
        # collecting thread does not wait for it (never raise from a finalizer).
        try:
            if not self._committed and not self._j.done() and not self.sequence.closed \
                    and not self.sequence.engine.closed:
                self.sequence.engine.native().cancel_rebase_later(self.id)
        except Exception:
            pass

    @property
    def failed(self) -> bool:
        return self._j.finish_reason() == "error"

    @property
    def error(self) -> str | None:
        return self._j.error_message() or None

    @property
    def committed(self) -> bool:
        return self._committed

    @property
    def target_len(self) -> int:
        return int(self.sequence.engine.native().rebase_target_len(self.id))

    def __repr__(self) -> str:
        return f"Rebase(mode={self.mode!r}, keep_prefix={self.keep_prefix}, keep_from={self.keep_from}, replacement={len(self.replacement)} tokens, ready={self.done()})"


def _set_rows(native_job, n) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"rows_per_step must be an int >= 0, got {n!r}")
    native_job.set_rows_per_step(min(n, 1 << 20))
