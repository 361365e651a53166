"""One chat-completion request run on its conversation's session: plain or streamed.

The conversation is checked out (locked) for the whole request. Only the messages the session has
not seen are sent to it; when the client's history no longer extends what the session holds (edited,
offloaded, or new), a new session is opened and the whole conversation is prefilled."""
from __future__ import annotations

import time
import uuid
from typing import Iterator, List, Optional, Union

from ..session.turn import CHUNK_DONE
from .conversation import Conversation
from .errors import APIError, bad_request, from_exception
from .messages import is_prefix, keys_of, to_session_message
from .registry import SessionRegistry
from .schemas import ChatCompletionRequest
from .tool_grammar import CallTooLong, forced_call_grammar


class Turn:
    def __init__(self, registry: SessionRegistry, req: ChatCompletionRequest, explicit_id: Optional[str],
                 model_id: str, default_max_tokens: int, chunk_tokens: Optional[int] = None,
                 count_tokens=None):
        """``chunk_tokens`` and ``count_tokens`` (text -> tokens) bound a forced call to one generation chunk
        (a grammar restarts at each chunk of the session)."""
        self.registry = registry
        self.req = req
        self.model_id = model_id
        self.messages = [to_session_message(m) for m in req.messages]
        self.keys = keys_of(self.messages)
        self.max_tokens = req.token_budget(default_max_tokens)
        self.tools = req.tool_dicts()
        forced = req.forced_tool()
        self.sampling = {"temperature": req.temperature, "top_p": req.top_p}
        if req.top_k:
            self.sampling["top_k"] = req.top_k
        if req.min_p:
            self.sampling["min_p"] = req.min_p
        if req.seed is not None:
            self.sampling["seed"] = req.seed
        if req.stop_list():
            self.sampling["stop"] = req.stop_list()
        if forced is not None:
            try:
                self.sampling["grammar"] = forced_call_grammar(self.tools, forced, chunk_tokens, count_tokens)
            except APIError:
                raise
            except CallTooLong as exc:
                raise bad_request(str(exc), param="tool_choice", code="forced_call_too_long") from exc
            except Exception as exc:  # noqa: BLE001 - a schema the grammar cannot take is the client's input
                raise bad_request(f"cannot force a call with these tools: {exc}", param="tools") from exc
        self.id = "chatcmpl-" + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.explicit_id = explicit_id
        self.conversation_id: Optional[str] = explicit_id
        self.conv: Optional[Conversation] = None
        self.events: List = []
        self._t0 = 0.0
        self.fresh = False      # the session was opened for this request (nothing was cached)
        self.own_tools = False  # the session offers its own tools (their calls' text is never content)
        self.finished_conv: Optional[Conversation] = None  # the conversation this turn answered
        self.n_before = 0       # the session's tokens before this request's messages

    # ------------------------------------------------------------------ lifecycle
    def checkout(self) -> None:
        """Take the conversation (its lock) on the thread that does the work, so that a response that is
        never sent cannot keep it locked."""
        self.conv = self.registry.checkout(self.explicit_id, self.keys)
        self.conversation_id = self.conv.id

    def release(self) -> None:
        if self.conv is not None:
            self.registry.release(self.conv)
            self.conv = None

    def _new_messages(self) -> List[dict]:
        """Open a session if needed; the messages the session has not seen yet."""
        conv = self.conv
        if conv.keys and is_prefix(conv.keys, self.keys) and (conv.live or self.registry.restore_session(conv)):
            return self.messages[len(conv.seen):]
        system = self.messages[0]["content"] if self.messages[0]["role"] == "system" else None
        self.registry.open_session(conv, system)
        self.fresh = True
        return self.messages[1:] if system is not None else list(self.messages)

    def _kwargs(self) -> dict:
        return dict(max_tokens=self.max_tokens, tools=self.tools, **self.sampling)

    def restate(self, content: str) -> None:
        """The client assembled ``content`` from the stream, not the final reply's content (a reply that
        searched the history streamed its first part too): remember that, so that its next request matches
        this conversation instead of rebuilding it."""
        conv = self.finished_conv  # the stream is read after the worker released the conversation
        if conv is None or not conv.seen or conv.seen[-1].get("role") != "assistant":
            return
        last = dict(conv.seen[-1], content=content or None)
        conv.remember(conv.seen[:-1] + [last], conv.keys[:-1] + keys_of([last]))

    def _finish(self, response: dict) -> dict:
        """Remember the exchange on the conversation and shape the OpenAI response."""
        conv = self.conv
        choice = response["choices"][0]
        message = {"role": "assistant", "content": choice["message"].get("content")}
        if choice["message"].get("tool_calls"):
            message["tool_calls"] = choice["message"]["tool_calls"]
        conv.remember(self.messages + [message], self.keys + keys_of([message]))
        self.finished_conv = conv
        usage = self._usage(response["usage"])
        conv.generated_tokens += usage["completion_tokens"]
        conv.generating_s += time.perf_counter() - self._t0
        return {
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model_id,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": choice["finish_reason"]}],
            "usage": usage,
            "system_fingerprint": None,
            "session_id": conv.id,
            "pykvcompact": {"session_id": conv.id, "fill": round(conv.session.fill, 4),
                            "events": [e.to_dict() for e in self.events]},
        }

    def _usage(self, session_usage: dict) -> dict:
        """OpenAI's usage: ``prompt_tokens`` is the whole prompt the reply was generated from, the tokens
        the session held before this request (``cached_tokens``, 0 for a session opened by it) plus what
        this request prefilled (the session's own ``prompt_tokens``)."""
        prefilled, completion = session_usage["prompt_tokens"], session_usage["completion_tokens"]
        prompt = self.n_before + prefilled
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": 0 if self.fresh else self.n_before}}

    # ------------------------------------------------------------------ plain
    def run(self, cancelled=None) -> Optional[dict]:
        """The whole reply; releases the conversation. ``cancelled()`` (the client went away) is checked
        between the session's items: the generation stops there and ``None`` is returned."""
        last = None
        for last in self._reply(self._plain_items, cancelled):
            pass
        # a reply stopped for the client ends before its final response (the only dict it yields)
        return last if isinstance(last, dict) else None

    def _plain_items(self, new: List[dict]):
        """The session's items for a plain reply (``Session.steps``): generated as ``Session.chat`` does
        (whole chunks, not token by token: streamed generation under concurrency does not reproduce the
        solo tokens on the float model), so that the reply can be stopped after any chunk (``CHUNK_DONE``)
        or event."""
        kw = self._kwargs()
        return self.conv.session.steps(new, **kw)

    def _abandon(self) -> None:
        """The client's view of the conversation is unknown (cut, cancelled, failed): forget it and
        release its session now (it could only be rebuilt); an implicit-id conversation, which no request
        can match any more, is dropped."""
        conv = self.conv
        if conv is None:
            return
        conv.forget()
        try:
            conv.retire("abandoned")
        finally:
            if not conv.explicit:
                self.registry.discard(conv)

    # ------------------------------------------------------------------ streamed
    def stream(self, cancelled) -> Iterator[Union[str, object, dict]]:
        """Text deltas and events as the session yields them, then the final response dict.
        ``cancelled()`` is checked between items; the conversation is released at the end."""
        yield from self._reply(self._streamed_items, cancelled)

    def _streamed_items(self, new: List[dict]):
        return self.conv.session.stream(new, **self._kwargs())

    # ------------------------------------------------------------------ both
    def _reply(self, items_for, cancelled=None) -> Iterator[object]:
        """Check out the conversation, then yield the session's items from ``items_for(new_messages)`` and
        the final response dict; ``cancelled()`` is checked after each item and ends the reply there,
        without a response. A reply that does not reach its response abandons the conversation (the
        client's view of it is unknown); the conversation is released in every case."""
        self.checkout()
        finished = False
        try:
            new = self._new_messages()
            self.own_tools = bool(self.conv.session.tools_in_effect)
            self.n_before = self.conv.session.n_tokens
            self._t0 = time.perf_counter()
            items = items_for(new)
            try:
                for item in items:
                    if not isinstance(item, str) and item is not CHUNK_DONE:
                        self.events.append(item)
                    yield item
                    if cancelled is not None and cancelled():
                        return
            finally:
                items.close()
            finished = True
            yield self._finish(self.conv.session.last_response)
        except Exception as exc:
            raise from_exception(exc) from exc
        finally:
            if not finished:
                self._abandon()
            self.release()
