"""Server-sent events for a streamed chat completion.

A worker thread runs the session's stream (it blocks on the engine) and hands items to the event loop
through a queue. Text becomes ``chat.completion.chunk`` deltas; a compaction event becomes an SSE event
named ``pykvcompact`` whose data is a chunk with an empty delta plus a ``pykvcompact_event`` field:
clients that dispatch on the event name see it apart, OpenAI clients see a delta with nothing in it.
Errors after the response has started arrive as ``{"error": {...}}`` data (the OpenAI clients raise)."""
from __future__ import annotations

import asyncio
import json
import threading
from typing import AsyncIterator

from .content_gate import ContentGate
from .errors import APIError, from_exception
from .turn import Turn

EVENT_NAME = "pykvcompact"
_END = object()


def _chunk(turn: Turn, delta: dict, finish_reason=None, **extra) -> dict:
    out = {"id": turn.id, "object": "chat.completion.chunk", "created": turn.created, "model": turn.model_id,
           "system_fingerprint": None,
           "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
    out.update(extra)
    return out


def _data(obj) -> dict:
    return {"data": json.dumps(obj, ensure_ascii=False)}


def _tool_call_deltas(calls) -> list:
    return [{"index": i, "id": c["id"], "type": "function",
             "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
            for i, c in enumerate(calls)]


def _start_worker(turn: Turn, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, stop: threading.Event):
    def put(item):
        loop.call_soon_threadsafe(queue.put_nowait, item)

    def work():
        try:
            for item in turn.stream(stop.is_set):
                put(item)
        except BaseException as exc:  # noqa: BLE001 - handed to the client as an error event
            put(exc)
        finally:
            put(_END)

    t = threading.Thread(target=work, name=f"pykvcompact-stream-{turn.id}", daemon=True)
    t.start()
    return t


async def open_stream(turn: Turn, include_usage: bool) -> AsyncIterator[dict]:
    """Start the stream's worker and wait for its first item, so that a request refused before anything is
    generated (bad messages, a context overflow, no capacity, a busy session) gets its own HTTP status and
    a JSON error body rather than a 200 whose first event is an error. Returns the SSE events."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stop = threading.Event()
    _start_worker(turn, loop, queue, stop)
    try:
        first = await queue.get()
    except BaseException:  # the request was cancelled (the client went away)
        stop.set()
        raise
    if isinstance(first, BaseException):
        stop.set()
        raise first if isinstance(first, APIError) else from_exception(first)
    return sse_events(turn, include_usage, queue, stop, first)


async def sse_events(turn: Turn, include_usage: bool, queue: asyncio.Queue, stop: threading.Event,
                     first) -> AsyncIterator[dict]:
    # the session's own tools (compact_conversation, search_history) count: their calls are run by the
    # session, and their text must not reach a client that sent no tools
    def new_gate() -> ContentGate:
        return ContentGate(turn.sampling.get("stop", ()), tools=bool(turn.tools or turn.own_tools),
                           json_calls=bool(turn.tools))
    gate, streamed = new_gate(), ""   # streamed: the content the client has assembled from the deltas
    pending = [first]
    try:
        yield _data(_chunk(turn, {"role": "assistant", "content": ""}))
        while True:
            item = pending.pop() if pending else await queue.get()
            if item is _END:
                break
            if isinstance(item, BaseException):
                err = item if isinstance(item, APIError) else from_exception(item)
                yield _data(err.body())
                continue
            if isinstance(item, str):
                text = gate.feed(item)
                if text:
                    streamed += text
                    yield _data(_chunk(turn, {"content": text}))
            elif isinstance(item, dict):  # the final response
                choice = item["choices"][0]
                rest = gate.finish(choice["message"].get("content"))
                if rest:
                    streamed += rest
                    yield _data(_chunk(turn, {"content": rest}))
                if streamed != (choice["message"].get("content") or ""):
                    turn.restate(streamed)  # what the client holds now, so that its next request matches
                if choice["message"].get("tool_calls"):
                    yield _data(_chunk(turn, {"tool_calls": _tool_call_deltas(choice["message"]["tool_calls"])}))
                yield _data(_chunk(turn, {}, choice["finish_reason"], session_id=item["session_id"]))
                if include_usage:
                    usage_chunk = _chunk(turn, {}, usage=item["usage"])
                    usage_chunk["choices"] = []
                    yield _data(usage_chunk)
            else:  # a compaction event
                if item.name == "reply_follows":
                    gate = new_gate()  # the session answered the model's own call: its next reply streams anew
                yield {"event": EVENT_NAME, "data": json.dumps(_chunk(turn, {}, pykvcompact_event=item.to_dict()))}
        yield {"data": "[DONE]"}
    finally:
        stop.set()  # the client went away (or we are done): the worker stops at its next item
