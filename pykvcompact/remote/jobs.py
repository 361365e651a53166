"""Background work of the remote backend: a request running in a thread of its own (``RemoteJob``), work
that had nothing to send (``DoneJob``: an append costs nothing until a request), and a prepared rebase
(``RemoteRebase``: a warm-up request that puts ``[prefix][summary][recent turns]`` in the server's cache).

The verbs are those of :class:`pykvcompact.Job` / :class:`pykvcompact.Rebase`: ``done()``,
``result(timeout)`` (raises the job's error, ``TimeoutError`` when not finished in time), ``cancel()``
(the open request is closed; what was generated stays), ``tokens``, ``finish_reason``, ``error``,
``set_rows_per_step`` (no row budget on a server: accepted, ignored).
"""
from __future__ import annotations

import threading
import time
from typing import Callable, List, Optional

from .. import errors


class DoneJob:
    """A job with nothing to wait for (``append_background``: the tokens are held client-side)."""

    def __init__(self, tokens):
        self.tokens = list(tokens)
        self.finish_reason = "done"
        self.error = None

    def done(self) -> bool:
        return True

    def result(self, timeout=None) -> List[int]:
        return list(self.tokens)

    def cancel(self) -> None:
        pass

    def set_rows_per_step(self, n: int) -> None:
        pass


class RemoteJob:
    """``work()`` runs in a daemon thread; ``gen`` (a :class:`.generation.Generation`) gives the progress and
    is what ``cancel()`` stops; ``on_done(job)`` runs in that thread when it ends (appending the tokens)."""

    def __init__(self, gen, on_done: Optional[Callable[["RemoteJob"], None]] = None, name: str = "pykvcompact-remote"):
        self._gen = gen
        self._on_done = on_done
        self._exc: Optional[BaseException] = None
        self._done = threading.Event()
        self._result: Optional[List[int]] = None
        self.t0 = time.perf_counter()
        self.t_done: Optional[float] = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._gen.run()
        except BaseException as e:  # noqa: BLE001 - reported by result()/error
            self._exc = e
        finally:
            try:
                if self._on_done is not None:
                    self._on_done(self)
            except BaseException as e:  # noqa: BLE001
                self._exc = self._exc or e
            self.t_done = time.perf_counter()
            self._done.set()

    # ------------------------------------------------------------------ verbs
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout=None) -> bool:
        return self._done.wait(timeout)

    def result(self, timeout=None) -> List[int]:
        if not self._done.wait(timeout):
            raise TimeoutError(f"the job did not finish within {timeout} s (it keeps running; cancel() stops it)")
        if self._exc is not None:
            raise self._exc
        return list(self._gen.tokens)

    def cancel(self) -> None:
        self._gen.cancel()

    def set_rows_per_step(self, n: int) -> None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"rows_per_step must be an int >= 0, got {n!r}")

    @property
    def tokens(self) -> List[int]:
        if self._done.is_set():
            return list(self._gen.tokens)
        return self._gen.partial_tokens()

    @property
    def finish_reason(self) -> Optional[str]:
        if not self._done.is_set():
            return None
        return "error" if self._exc is not None else self._gen.finish_reason

    @property
    def error(self) -> Optional[str]:
        return None if self._exc is None else f"{type(self._exc).__name__}: {self._exc}"

    @property
    def generation(self):
        return self._gen

    def __repr__(self) -> str:
        return f"RemoteJob(done={self.done()}, tokens={self._gen.count}, finish_reason={self.finish_reason!r})"


class RemoteRebase:
    """A prepared rebase: the target ``tokens[:keep_prefix] + replacement + tokens[keep_from:]`` as it was
    when prepared, and the warm-up request (``max_tokens=1``) that made the server prefill and cache it.
    ``done()`` once the warm-up answered (or failed: a failed warm-up only means the swap's first request
    pays the prefill).  Tokens appended to the sequence afterwards are the commit's catch-up."""

    def __init__(self, sequence, keep_prefix: int, replacement: List[int], keep_from: int, mode: str,
                 target_len: int, warmup: Optional[RemoteJob]):
        self.sequence = sequence
        self.keep_prefix, self.replacement, self.keep_from, self.mode = keep_prefix, list(replacement), keep_from, mode
        self.target_len = target_len
        self.warmup = warmup
        self.committed = False
        self.cancelled = False
        self.t0 = time.perf_counter()

    def done(self) -> bool:
        return self.warmup is None or self.warmup.done()

    def wait(self, timeout=None) -> bool:
        """Wait for the warm-up; True once it ended (a failed warm-up is not an error here: the swap still
        works, its first request pays the prefill)."""
        if self.cancelled:
            raise errors.CancelledError("the rebase preparation was cancelled")
        return self.warmup is None or self.warmup.wait(timeout)

    @property
    def warmed(self) -> bool:
        """The warm-up request succeeded: the server had the rebased context in its cache then."""
        return self.warmup is not None and self.warmup.done() and self.warmup.error is None

    @property
    def warmup_ms(self) -> Optional[float]:
        w = self.warmup
        return None if w is None or w.t_done is None else (w.t_done - w.t0) * 1000.0

    @property
    def error(self) -> Optional[str]:
        return self.warmup.error if self.warmup is not None else None

    @property
    def failed(self) -> bool:
        return False

    def set_rows_per_step(self, n: int) -> None:
        pass

    def cancel(self) -> None:
        self.cancelled = True
        if self.warmup is not None and not self.warmup.done():
            self.warmup.cancel()

    def __repr__(self) -> str:
        return (f"RemoteRebase(keep_prefix={self.keep_prefix}, keep_from={self.keep_from}, "
                f"replacement={len(self.replacement)} tokens, warmed={self.warmed})")


__all__ = ["DoneJob", "RemoteJob", "RemoteRebase"]
