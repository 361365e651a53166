"""Errors of the remote backend: each names the URL and, for an HTTP error, the status and the body.

They derive from :class:`pykvcompact.EngineError`, so the session treats a failed remote probe or
summary like a failed local one (CONTINUE, the fallback summary) and a failed reply reaches the caller.
"""
from __future__ import annotations

from typing import Optional

from ..errors import EngineError

BODY_CHARS = 500  # of a response body quoted in a message


class RemoteError(EngineError):
    """A request to the OpenAI-compatible server failed. ``url`` is the endpoint asked."""

    def __init__(self, message: str, *, url: str = ""):
        super().__init__(message)
        self.url = url


class RemoteConnectionError(RemoteError):
    """The server could not be reached (refused, reset, DNS, TLS)."""

    def __init__(self, url: str, reason: str, message: Optional[str] = None):
        super().__init__(message or f"cannot reach the server at {url}: {reason} (is it running? check base_url)",
                         url=url)
        self.reason = reason


class RemoteDisconnectedError(RemoteConnectionError):
    """The server accepted the request, then closed the connection before its answer was complete.
    ``alive``: whether the server answered a check right after (False: it most likely crashed)."""

    def __init__(self, url: str, reason: str, alive: bool):
        if alive:
            what = ("the server at {url} closed the connection before its answer was complete, and still "
                    "answers: the request may have killed one of its workers or hit a proxy's limit (see the "
                    "server's log): {reason}")
        else:
            what = ("the server at {url} closed the connection before its answer was complete, and no longer "
                    "answers: it may have crashed (see its log; on a CPU with AMX, start llama-cpp-python's "
                    "server with python -m pykvcompact.remote.llama_cpp_peer): {reason}")
        super().__init__(url, reason, what.format(url=url, reason=reason))
        self.alive = alive


class RemoteTimeoutError(RemoteError, TimeoutError):
    """No answer (or no next chunk of a stream) within the timeout."""

    def __init__(self, url: str, timeout: Optional[float], what: str = "answer"):
        super().__init__(f"no {what} from {url} within {timeout} s (raise timeout= of RemoteEngine, or check the "
                         "server's load)", url=url)
        self.timeout = timeout


class RemoteHTTPError(RemoteError):
    """The server answered with an HTTP error status (4xx, 5xx)."""

    def __init__(self, url: str, status: int, body: str):
        short = body if len(body) <= BODY_CHARS else body[:BODY_CHARS] + "..."
        hint = {401: " (wrong or missing api_key)", 403: " (forbidden: check api_key)",
                404: " (no such endpoint or model: check base_url and model)",
                422: " (the server rejected the request's fields)"}.get(status, "")
        super().__init__(f"HTTP {status} from {url}{hint}: {short}", url=url)
        self.status = status
        self.body = body


class RemoteProtocolError(RemoteError):
    """The server's answer is not what the OpenAI-compatible API returns (bad JSON, missing fields)."""


__all__ = ["RemoteError", "RemoteConnectionError", "RemoteDisconnectedError", "RemoteTimeoutError", "RemoteHTTPError", "RemoteProtocolError"]
