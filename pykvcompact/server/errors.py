"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with the matching status."""
from __future__ import annotations

import logging
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("pykvcompact.server")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          409: "conflict_error", 422: "invalid_request_error", 429: "rate_limit_error", 503: "server_overloaded"}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                 type: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or _TYPES.get(status, "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: Optional[str] = None, code: Optional[str] = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def from_exception(exc: BaseException) -> APIError:
    """Map a library exception to the status a client can act on."""
    from .. import errors as e
    from ..session.session import ContextWindowError

    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ContextWindowError):
        return APIError(400, str(exc), param="messages", code="context_length_exceeded")
    if isinstance(exc, (e.SlotsExhaustedError, e.ContextFullError)):
        return APIError(503, f"the engine is out of capacity: {exc}", code="engine_full")
    if isinstance(exc, e.SequenceBusyError):
        return APIError(409, str(exc), code="session_busy")
    if isinstance(exc, e.PyKVCompactError):
        return APIError(500, f"{type(exc).__name__}: {exc}", code="engine_error")
    if isinstance(exc, (ValueError, TypeError)):
        return APIError(400, str(exc))
    log.exception("unexpected error", exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}: {exc}")


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "bytes"}


def _is_tag(part: str) -> bool:
    """A pydantic union branch or validator name in a location (``str``, ``literal['a','b']``,
    ``NamedToolChoice``, ``function-after[...]``), not a field of the request."""
    return part in _TYPE_TAGS or any(c in part for c in "[(-") or part[:1].isupper()


def openai_param(loc) -> str | None:
    """``('body', 'messages', 0, 'content', 'str')`` -> ``messages[0].content`` (OpenAI's spelling)."""
    out = ""
    parts = list(loc)
    if parts and parts[0] == "body":
        parts = parts[1:]
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _is_tag(str(part)):
            out += ("." if out else "") + str(part)
    return out or None


def _validation_message(exc: RequestValidationError) -> tuple:
    errs = exc.errors()
    if not errs:
        return "invalid request", None
    first = errs[0]
    if first.get("type") == "json_invalid":
        why = (first.get("ctx") or {}).get("error") or first.get("msg")
        return f"the request body is not valid JSON ({why})", None
    loc = tuple(first.get("loc", ()))
    if loc[:1] == ("body",) and len(loc) == 1 and first.get("type") in ("missing", "model_attributes_type",
                                                                        "dict_type"):
        return "the request body must be a JSON object", None
    param = openai_param(loc)
    msg = str(first.get("msg"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return (f"{param}: {msg}" if param else msg), param


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        msg, param = _validation_message(exc)
        return JSONResponse(APIError(400, msg, param=param).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return JSONResponse(APIError(exc.status_code, str(exc.detail)).body(), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _other(request: Request, exc: Exception):
        err = from_exception(exc)
        return JSONResponse(err.body(), status_code=err.status)
