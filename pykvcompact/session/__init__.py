"""The session layer: the Session facade (session.py) and its call loop, live context, reply turn,
transcript ledger, write-ahead journal, history file, persistence and sizing.

``pykvcompact.session.Session`` and ``pykvcompact.session.ContextWindowError`` are the names the module
``pykvcompact.session`` had before it became this package."""

from .session import ContextWindowError, Session

__all__ = ["Session", "ContextWindowError"]
