"""OpenAI-compatible HTTP server (``pykvcompact serve``): FastAPI + uvicorn + sse-starlette.

Needs the ``server`` extra: ``pip install "pykvcompact[server]"``."""
from __future__ import annotations

from .config import ServerConfig
from .runner import ServerThread, build, serve

__all__ = ["ServerConfig", "ServerThread", "build", "serve"]
