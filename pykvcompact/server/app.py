"""The FastAPI application: OpenAI-compatible chat completions over compacting sessions.

Routes: ``POST /v1/chat/completions`` (plain and SSE streaming), ``GET /v1/models``, ``GET /health``,
``GET /v1/sessions``, ``GET|DELETE /v1/sessions/{id}``. With an API key every route needs
``Authorization: Bearer <key>``."""
from __future__ import annotations

import asyncio
import secrets
import threading
import time
from typing import Optional

from fastapi import Depends, FastAPI, Header, Request
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from .config import ServerConfig, policy_for
from .errors import APIError, from_exception, install_handlers
from .registry import SessionRegistry
from .schemas import ChatCompletionRequest
from .streaming import open_stream
from .turn import Turn


def _auth(api_key: Optional[str]):
    async def check(authorization: Optional[str] = Header(default=None)):
        if api_key is None:
            return
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), api_key.encode()):
            raise APIError(401, "missing or invalid API key (send Authorization: Bearer <key>)",
                           code="invalid_api_key")
    return check


def _session_id(request: Request, req: ChatCompletionRequest) -> Optional[str]:
    sid = request.headers.get("x-session-id") or req.user
    if sid is not None:
        sid = sid.strip()
        # all dots: URLs cannot address it (clients resolve /v1/sessions/.. to /v1)
        if not sid or len(sid) > 128 or not all(c.isascii() and (c.isalnum() or c in "-_.:@") for c in sid) \
                or not sid.strip("."):
            raise APIError(400, "a session id must be 1-128 characters of letters, digits and -_.:@, not only dots",
                           param="X-Session-Id")
    return sid


DISCONNECT_POLL_S = 0.25


async def _run_watching(turn: Turn, request: Request):
    """``turn.run`` on a worker thread while the client is watched: when it disconnects the generation is
    told to stop (as a cut stream is), and the worker is awaited so the conversation is released."""
    stop = threading.Event()
    work = asyncio.ensure_future(run_in_threadpool(turn.run, stop.is_set))
    while True:
        done, _ = await asyncio.wait({work}, timeout=DISCONNECT_POLL_S)
        if done:
            return work.result()
        if not stop.is_set() and await request.is_disconnected():
            stop.set()


def create_app(engine, registry: SessionRegistry, config: ServerConfig) -> FastAPI:
    # FastAPI's own docs routes skip the app's dependencies: with a key they are served by routes below
    keyed = config.api_key is not None
    app = FastAPI(title="pykvcompact", version="0.1.0", dependencies=[Depends(_auth(config.api_key))],
                  **({"docs_url": None, "redoc_url": None, "openapi_url": None} if keyed else {}))
    install_handlers(app)
    if keyed:
        from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html

        @app.get("/openapi.json", include_in_schema=False)
        async def openapi_json():
            return JSONResponse(app.openapi())

        @app.get("/docs", include_in_schema=False)
        async def docs():
            return get_swagger_ui_html(openapi_url="/openapi.json", title="pykvcompact")

        @app.get("/redoc", include_in_schema=False)
        async def redoc():
            return get_redoc_html(openapi_url="/openapi.json", title="pykvcompact")

    app.state.engine, app.state.registry, app.state.config = engine, registry, config
    started = int(time.time())
    chunk_tokens = policy_for(config).chunk_tokens

    def count_tokens(text: str) -> int:
        return len(engine.tokenize(text, add_special=False, parse_special=True))

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": config.model_id, "sessions": len(registry.list()),
                "live_sessions": sum(1 for c in registry.list() if c.live),
                "used_cells": engine.used_cells(), "n_ctx": engine.n_ctx}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": config.model_id, "object": "model", "created": started,
                                            "owned_by": "pykvcompact"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        sid = _session_id(request, req)
        try:
            turn = Turn(registry, req, sid, config.model_id, config.default_max_tokens, chunk_tokens, count_tokens)
        except Exception as exc:  # noqa: BLE001 - never let client input reach the catch-all (it resets)
            raise from_exception(exc) from exc
        if req.stream:
            # the conversation is taken by the stream's worker; an implicit id arrives in the last chunk
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            headers = {"X-Session-Id": sid} if sid else None
            return EventSourceResponse(await open_stream(turn, include_usage), headers=headers, ping=15)
        body = await _run_watching(turn, request)
        if body is None:  # the client went away: the generation was stopped; nobody reads this
            return JSONResponse(APIError(499, "client closed the request", code="client_closed").body(),
                                status_code=499)
        return JSONResponse(body, headers={"X-Session-Id": turn.conversation_id})

    @app.get("/v1/sessions")
    async def sessions():
        return {"object": "list", "data": [{k: v for k, v in c.info().items() if k != "events"}
                                           for c in registry.list()]}

    @app.get("/v1/sessions/{session_id}")
    async def session_info(session_id: str):
        conv = registry.get(session_id)
        if conv is None:
            raise APIError(404, f"no session {session_id!r}", param="session_id", code="session_not_found")
        return conv.info()

    @app.delete("/v1/sessions/{session_id}")
    async def session_delete(session_id: str):
        if not await run_in_threadpool(registry.delete, session_id):
            raise APIError(404, f"no session {session_id!r}", param="session_id", code="session_not_found")
        return {"id": session_id, "object": "session", "deleted": True}

    return app
