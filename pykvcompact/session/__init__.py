"""The session layer: the Session facade (session.py) and its call loop, live context, reply turn,
transcript, write-ahead journal, history file, persistence and sizing.

``Session``, ``ContextWindowError`` and ``CHUNK_DONE`` are names the module ``pykvcompact.session`` had
before it became this package."""

from .session import ContextWindowError, Session
from .turn import CHUNK_DONE

__all__ = ["Session", "ContextWindowError", "CHUNK_DONE"]
