"""A record of a session over time, for plots and status lines: the KV fill after each streamed piece,
when each piece arrived (inter-token latency), turn boundaries, and the session's compaction events.

``Timeline.attach(session)`` wraps that session's ``stream`` (and ``chat``, which then streams), so any
code that drives the session (the agent demo, the chat) is recorded without knowing it."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple


@dataclass
class Timeline:
    t0: float = field(default_factory=time.time)
    samples: List[Tuple[float, float]] = field(default_factory=list)      # (t, fill = tokens / window)
    pieces: List[Tuple[float, int]] = field(default_factory=list)         # (t, turn index): streamed text
    turns: List[Tuple[float, float]] = field(default_factory=list)        # (start, end)
    events: List[dict] = field(default_factory=list)
    soft: Optional[float] = None
    hard: Optional[float] = None
    label: str = ""
    _sessions: list = field(default_factory=list, repr=False)

    # ------------------------------------------------------------------ recording
    def attach(self, session):
        """Record every turn of ``session`` from now on; returns the session."""
        self._sessions.append(session)
        pol = getattr(session, "policy", None)
        if pol is not None:
            self.soft = getattr(pol, "soft", None) if pol.mode == "background" else None
            self.hard = getattr(pol, "hard", None)
            self.label = self.label or f"mode={pol.mode}"
        inner_stream = session.stream

        def stream(*args, **kwargs):
            return self.record(session, inner_stream(*args, **kwargs))

        def chat(*args, **kwargs):
            for _ in stream(*args, **kwargs):
                pass
            return session.last_response

        session.stream, session.chat = stream, chat
        self._sample(session)
        return session

    def record(self, session, items):
        """Pass ``items`` (a session stream) through, recording each piece."""
        turn = len(self.turns)
        start = time.time()
        try:
            for x in items:
                if isinstance(x, str):
                    now = time.time()
                    self.pieces.append((now, turn))
                    self._sample(session, now)
                yield x
        finally:
            self.turns.append((start, time.time()))
            self._sample(session)

    def capture_new_sessions(self):
        """A context manager under which every ``pykvcompact.Session(...)`` created is attached (to record
        code that makes its own session, e.g. the agent demo)."""
        import contextlib

        import pykvcompact

        @contextlib.contextmanager
        def patched():
            real = pykvcompact.Session
            pykvcompact.Session = lambda *a, **k: self.attach(real(*a, **k))
            try:
                yield self
            finally:
                pykvcompact.Session = real
        return patched()

    def _sample(self, session, now: Optional[float] = None) -> None:
        try:
            self.samples.append((now or time.time(), float(session.fill)))
        except Exception:  # noqa: BLE001 - a closed session has no fill to sample
            pass

    def finish(self) -> "Timeline":
        """Copy the attached sessions' events (call before they are closed or after; events stay)."""
        seen = {id(e) for e in self.events}
        for s in self._sessions:
            self.events.extend(e.to_dict() for e in getattr(s, "events", []) if id(e) not in seen)
        self.events.sort(key=lambda e: e.get("t", 0.0))
        return self

    # ------------------------------------------------------------------ derived
    def inter_token_ms(self) -> List[Tuple[float, float]]:
        """(t, ms since the previous piece of the same turn)."""
        out = []
        for (t1, k1), (t2, k2) in zip(self.pieces, self.pieces[1:]):
            if k1 == k2:
                out.append((t2, (t2 - t1) * 1000.0))
        return out

    def first_token_ms(self) -> List[Tuple[float, float]]:
        """(t, ms from the start of a turn to its first streamed piece): prefill, plus any compaction that
        ran before the reply (a swap at the hard limit shows here, not between tokens)."""
        first = {}
        for t, k in self.pieces:
            first.setdefault(k, t)
        return [(first[k], (first[k] - start) * 1000.0) for k, (start, _) in enumerate(self.turns) if k in first]

    def tokens_per_s(self) -> Optional[float]:
        """Pieces per second of generation, over the turns recorded (prefill and waits included)."""
        busy = sum(e - s for s, e in self.turns)
        return len(self.pieces) / busy if busy > 0 and self.pieces else None

    def to_dict(self) -> dict:
        return {"t0": self.t0, "samples": self.samples, "pieces": self.pieces, "turns": self.turns,
                "events": self.events, "soft": self.soft, "hard": self.hard, "label": self.label}
