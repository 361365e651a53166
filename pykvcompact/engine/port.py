"""The engine as the session sees it: a small protocol, so another backend (a remote one) can stand in.

The session uses nothing else of the engine: tokenizing, one live sequence per session, forks for the
probe and the summary, background jobs, and a prepared replacement with its swap.  ``pykvcompact.Engine``
and ``tests/fake_engine.FakeEngine`` both implement it.
"""
from __future__ import annotations

from typing import Dict, Iterable, Iterator, List, Protocol, runtime_checkable



def grant_rows(work, n: int) -> None:
    """Rows per engine step for background work on a deadline (``set_rows_per_step`` of a job or a
    prepared rebase); nothing for a backend without row budgets, or work that has already finished."""
    f = getattr(work, "set_rows_per_step", None)
    if f is not None:
        try:
            f(n)
        except Exception:  # noqa: BLE001 - finished, or cancelled meanwhile
            pass


def rebuilds_in_place(engine) -> bool:
    """Is a swap nobody prepared cheaper rebuilt in place (truncate, then append) than prepared beside the
    old history?  True for the local engine, whose attention spans every live cell; a backend without
    the attribute (a remote one, whose prepared rebase is a warm-up request) prepares it."""
    return bool(getattr(engine, "rebuilds_in_place", False))


@runtime_checkable
class JobPort(Protocol):
    def done(self) -> bool: ...
    def result(self, timeout=None): ...
    def cancel(self) -> None: ...


@runtime_checkable
class RebasePort(Protocol):
    def done(self) -> bool: ...
    def wait(self, timeout=None) -> bool: ...
    def cancel(self) -> None: ...


@runtime_checkable
class SequencePort(Protocol):
    closed: bool

    @property
    def tokens(self) -> List[int]: ...
    def __len__(self) -> int: ...
    def append(self, tokens: Iterable[int]) -> None: ...
    def append_background(self, tokens: Iterable[int]) -> JobPort: ...
    def generate(self, max_tokens: int, **sampling) -> List[int]: ...
    def stream(self, max_tokens: int, **sampling) -> Iterator[int]: ...
    def generate_background(self, max_tokens: int, **sampling) -> JobPort: ...
    def fork(self) -> "SequencePort": ...
    def truncate(self, n: int) -> None: ...
    def probe(self, tokens: Iterable[int], labels=("COMPRESS", "CONTINUE")) -> Dict[str, float]: ...
    def prepare_rebase(self, keep_prefix: int, replacement: Iterable[int], keep_from: int,
                       mode: str = "exact") -> RebasePort: ...
    def commit_rebase(self, rebase: RebasePort) -> dict: ...
    def close(self) -> None: ...


@runtime_checkable
class EnginePort(Protocol):
    n_ctx: int
    capabilities: dict

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> List[int]: ...
    def detokenize(self, tokens: Iterable[int]) -> str: ...
    def sequence(self, tokens: Iterable[int] = ()) -> SequencePort: ...
    def used_cells(self) -> int: ...


REQUIRED = ("tokenize", "detokenize", "sequence", "used_cells", "n_ctx")


def check_engine(engine) -> None:
    """A clear error when ``engine`` lacks what the session uses."""
    missing = [n for n in REQUIRED if not hasattr(engine, n)]
    if missing:
        raise TypeError(f"Session needs an engine with {', '.join(REQUIRED)} (see pykvcompact.engine.port); "
                        f"{type(engine).__name__} lacks {', '.join(missing)}")


def free_cells(engine) -> int:
    f = getattr(engine, "free_cells", None)
    return f() if callable(f) else engine.n_ctx - engine.used_cells()


def engine_errors() -> tuple:
    """The engine's recoverable error types (a failed engine operation, not a bug)."""
    from .. import errors as e
    return tuple(getattr(e, n) for n in ("EngineError", "ContextFullError", "SlotsExhaustedError",
                                         "UnsupportedOperationError", "SequenceBusyError") if hasattr(e, n))


__all__ = ["EnginePort", "SequencePort", "JobPort", "RebasePort", "check_engine", "free_cells", "engine_errors"]
