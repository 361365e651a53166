"""Conversations sharing one engine: recognised by id or by message prefix, each with its own lock;
when sessions would outgrow the engine's sequences or cells, the least recently used idle one is
offloaded (snapshot and transcript saved, then closed) and comes back from its snapshot (its KV state
loaded, no prefill), or by re-prefilling when the snapshot cannot be used."""
from __future__ import annotations

import threading
import time
import uuid
from typing import Callable, Dict, List, Optional

from .conversation import Conversation
from .errors import APIError
from .messages import is_prefix

# at most this many conversations are remembered (live or offloaded); the oldest offloaded go first
MAX_REMEMBERED = 512


def _resource_error(exc: BaseException) -> bool:
    from .. import errors as e
    if isinstance(exc, (e.SlotsExhaustedError, e.ContextFullError)):
        return True
    return isinstance(exc, ValueError) and ("does not fit" in str(exc) or "free KV cells" in str(exc))


class SessionRegistry:
    """``make_session(conversation_id, system)`` opens a ``Session``; ``capacity`` live sessions at most."""

    def __init__(self, make_session: Callable[[str, Optional[str]], object], capacity: int, offload_dir: str,
                 wait_s: float = 600.0, load_session: Optional[Callable[[str], object]] = None):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._make = make_session
        self._load = load_session
        self.capacity = capacity
        self.offload_dir = offload_dir
        self.wait_s = wait_s
        self._convs: Dict[str, Conversation] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lookup
    def checkout(self, explicit_id: Optional[str], keys: List[tuple]) -> Conversation:
        """The conversation for a request, with its lock held (release with :meth:`release`)."""
        if explicit_id is not None:
            with self._lock:
                conv = self._convs.get(explicit_id)
                if conv is None:
                    conv = self._add(Conversation(explicit_id, explicit=True))
            if not conv.lock.acquire(timeout=self.wait_s):
                raise APIError(409, f"session {explicit_id!r} is busy with another request", code="session_busy")
            return conv
        with self._lock:
            candidates = [c for c in self._convs.values()
                          if not c.explicit and c.keys and is_prefix(c.keys, keys)]
            for conv in sorted(candidates, key=lambda c: len(c.keys), reverse=True):
                if conv.lock.acquire(blocking=False):
                    return conv
            conv = self._add(Conversation("conv-" + uuid.uuid4().hex[:12], explicit=False))
            conv.lock.acquire()
            return conv

    def release(self, conv: Conversation) -> None:
        conv.last_used = time.monotonic()
        conv.lock.release()

    def get(self, conversation_id: str) -> Optional[Conversation]:
        with self._lock:
            return self._convs.get(conversation_id)

    def list(self) -> List[Conversation]:
        with self._lock:
            return list(self._convs.values())

    def delete(self, conversation_id: str) -> bool:
        with self._lock:
            conv = self._convs.pop(conversation_id, None)
        if conv is None:
            return False
        with conv.lock:
            conv.retire("deleted")
        return True

    def discard(self, conv: Conversation) -> None:
        """Forget ``conv`` (its session already retired); the caller may still hold its lock."""
        with self._lock:
            if self._convs.get(conv.id) is conv:
                del self._convs[conv.id]

    def close_all(self) -> None:
        for conv in self.list():
            if conv.lock.acquire(timeout=30):
                try:
                    conv.retire("shutdown")
                finally:
                    conv.lock.release()

    # ------------------------------------------------------------------ sessions
    def open_session(self, conv: Conversation, system: Optional[str]) -> None:
        """Give ``conv`` (locked by the caller) a new session, offloading idle ones to make room."""
        conv.retire("rebuilt")
        self._open(conv, lambda: self._make(conv.id, system))

    def restore_session(self, conv: Conversation) -> bool:
        """Bring an offloaded ``conv`` back from its snapshot; False when it cannot (the caller re-prefills)."""
        path = conv.snapshot_path
        if self._load is None or not path or conv.live:
            return False
        try:
            self._open(conv, lambda: self._load(path))
        except APIError:
            raise
        except Exception as exc:  # noqa: BLE001 - an unusable snapshot: rebuild from the client's messages
            conv.past_events.append({"event": "session_restore_failed", "t": time.time(), "path": path,
                                     "error": f"{type(exc).__name__}: {exc}"})
            return False
        conv.past_events.append({"event": "session_restored", "t": time.time(), "path": path,
                                 **getattr(conv.session, "resumed", {})})
        return True

    def _open(self, conv: Conversation, make: Callable[[], object]) -> None:
        self._reserve(conv)
        try:
            for _ in range(self.capacity + 1):
                try:
                    conv.session = make()
                    conv.history_path = conv.session.history_path
                    return
                except Exception as exc:  # noqa: BLE001 - only resource errors are retried
                    if not _resource_error(exc):
                        raise
                    with self._lock:
                        self._offload_lru(exclude=conv, error=exc)
            raise APIError(503, "the engine has no room for another session", code="engine_full")
        finally:
            conv.reserved = False

    def _reserve(self, conv: Conversation) -> None:
        """Count ``conv`` as live, offloading idle sessions first; while every session is busy, wait for
        one to finish (bounded by ``wait_s``) rather than refuse."""
        deadline = time.monotonic() + self.wait_s
        pause = threading.Event()
        while True:
            with self._lock:
                try:
                    while self._live_count() >= self.capacity:
                        self._offload_lru(exclude=conv)
                    conv.reserved = True
                    return
                except APIError:
                    if time.monotonic() >= deadline:
                        raise
            pause.wait(0.05)

    def _live_count(self) -> int:
        return sum(1 for c in self._convs.values() if c.live or c.reserved)

    def _offload_lru(self, exclude: Conversation, error: Optional[BaseException] = None) -> None:
        """Offload the least recently used idle live session (registry lock held)."""
        idle = sorted((c for c in self._convs.values() if c.live and c is not exclude),
                      key=lambda c: c.last_used)
        for conv in idle:
            if conv.lock.acquire(blocking=False):
                try:
                    conv.retire("offloaded", save_dir=self.offload_dir)
                finally:
                    conv.lock.release()
                return
        why = f" ({error})" if error is not None else ""
        raise APIError(503, f"every session is busy; no room for another one{why}", code="engine_full")

    def _add(self, conv: Conversation) -> Conversation:
        self._convs[conv.id] = conv
        if len(self._convs) > MAX_REMEMBERED:
            gone = sorted((c for c in self._convs.values() if not c.live and not c.lock.locked()),
                          key=lambda c: c.last_used)
            for old in gone[:len(self._convs) - MAX_REMEMBERED]:
                del self._convs[old.id]
        return conv
