"""The session's events: every event ever emitted in ``events`` (the caller reads them after a call), and
the ones the running call has not handed out yet in ``pending`` (a stream yields them between its text
deltas, so that a reader sees a swap where it happened in the reply)."""
from __future__ import annotations

from typing import Iterator, List

from .. import events as ev


class Outbox:
    def __init__(self):
        self.events: List[ev.Event] = []
        self.pending: List[ev.Event] = []

    def emit(self, event: ev.Event) -> None:
        self.events.append(event)
        self.pending.append(event)

    def drain(self) -> Iterator[ev.Event]:
        """The pending events, oldest first, each handed out once."""
        while self.pending:
            yield self.pending.pop(0)

    def forget_pending(self) -> None:
        """A call that yields nothing (``compact``, ``idle``, ``call_tool``): its events stay in ``events``."""
        self.pending.clear()


__all__ = ["Outbox"]
