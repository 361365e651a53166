"""The session's call loop: one ``chat``/``stream``/``add`` call, from its messages to its reply — the messages
appended (room made first, tool results counted, compaction-tool calls run), the schedule ticked between
them, the due probe, the recall of offloaded lines the new messages name (``recall.py``), then up to four
replies (a reply that only calls ``compact_conversation`` is followed by another, as is one that only
searches the history), the rates measured and the OpenAI-shaped response built.

The session builds it once, handing it the parts it works on (:class:`CallParts`); it holds what lives
from one call to the next: the one-call guard, the count of answered calls, the last response."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable, List, Optional

from .. import events as ev
from ..chat.messages import check_sampling, check_tool_results, completion, normalize_messages
from ..compaction.tools import history_search
from .turn import Turn, TurnParts


@dataclass
class CallParts:
    """The session's parts a call works on."""
    ctx: object            # the live context (session/context.py)
    transcript: object         # every message, and the write-ahead log (session/transcript.py)
    compactor: object      # room, the schedule, preparations (compaction/compactor.py)
    prober: object         # the rubric probe (compaction/prober.py)
    room: object           # makes room before a step (compaction/room.py)
    recall: object         # offloaded lines the new messages name (compaction/recall.py)
    notes: object          # the model's notes of tool results (compaction/summary/notes.py)
    tools: object          # which tools are shown and whose calls are whose (session/tools.py)
    compact_tool: object   # runs ``compact_conversation`` (compaction/tools/compact.py)
    search_tool: object    # runs ``search_history`` (compaction/tools/search.py)
    outbox: object         # the session's events (session/outbox.py)
    append: Callable[..., object]          # a message into the transcript and the live context
    check_open: Callable[[], None]         # raises when the session is closed
    window: int
    keep_recent: int
    min_span: int
    chunk_tokens: int


class CallLoop:
    def __init__(self, parts: CallParts, response_id: str, model_name: str, fill: Callable[[], float]):
        """``response_id``: the prefix of each chat-completion id; ``fill``: the session's live fill."""
        self.parts = parts
        self.response_id, self.model_name, self.fill = response_id, model_name, fill
        self.busy = False                    # a call is running (one at a time)
        self.n_calls = 0                     # answered calls (each left an assistant message)
        self.last_response: Optional[dict] = None
        self._turn_end = time.perf_counter()  # when the last call that grew the conversation ended (its pace)

    # ------------------------------------------------------------------ what the session calls
    @contextlib.contextmanager
    def one_call(self):
        """One call at a time: a second call while a stream is open would interleave two replies."""
        self.parts.check_open()
        if self.busy:
            from ..errors import SequenceBusyError
            raise SequenceBusyError("this session is still producing a reply (a stream is open): exhaust or "
                                    "close() that stream before the next chat/stream/add/compact call")
        self.busy = True
        try:
            self.parts.ctx.heal()   # (a failed in-place swap the engine could not undo at the time)
            yield
        finally:
            self.busy = False
            self.parts.compactor.call_tidx = None

    def run(self, messages, max_tokens, tools, sampling, streaming):
        """One ``chat``/``stream`` call: a generator of text deltas (``streaming``) or ``CHUNK_DONE`` marks,
        and events; the chat-completion dict is in :attr:`last_response` at its end."""
        with self.one_call():
            yield from self._run_call(messages, max_tokens, tools, sampling, streaming)

    def add(self, msgs: List[dict]) -> None:
        """Messages without a reply."""
        with self.one_call():
            self.parts.ctx.prefilled = 0
            for _ in self._add_messages(msgs):
                pass
            self._metered(self.parts.ctx.prefilled)

    def run_tool(self, call: dict) -> dict:
        """Run a session tool's call; its result message joins the conversation and is returned."""
        parts = self.parts
        runner = parts.search_tool if history_search.is_search_call(call) else parts.compact_tool
        msg = runner.run(call)
        parts.append(msg)
        return msg

    # ------------------------------------------------------------------ one call
    def _keep_question_raw(self, first: int) -> None:
        """A background preparation planned while the model wrote its search call may summarize the
        call's own messages (the question the search serves): restart it at a cut before them."""
        compactor, ctx = self.parts.compactor, self.parts.ctx
        p = compactor.prep
        if p is not None and any(e.tidx >= first for e in ctx.entries[:p.cut] if not e.summary):
            compactor.cancel("question_in_use")

    def _probe_if_due(self):
        parts = self.parts
        trigger = parts.prober.due()
        if trigger is None:
            return
        compactor = parts.compactor
        verdict = parts.prober.run(trigger, has_cut=parts.ctx.choose_cut(parts.keep_recent, parts.min_span) is not None,
                                   committing=compactor.prep is not None and compactor.prep.commit_trigger is not None)
        yield from parts.outbox.drain()
        if verdict == "COMPRESS":
            compactor.compress()
            yield from parts.outbox.drain()

    def _add_messages(self, msgs: List[dict]):
        parts = self.parts
        drain, runs = parts.outbox.drain, parts.tools.runs
        parts.check_open()
        check_tool_results(msgs, [e.msg for e in parts.ctx.entries])
        parts.room.for_batch(msgs)
        yield from drain()
        for i, m in enumerate(msgs):
            if m["role"] == "user":
                # what a user message names that only the offloaded history holds goes before it, so that
                # the question stays the last thing the model reads before it answers (after it, the model
                # answered by describing the lookup: "search_history returned").  Only if the rest of the
                # batch fits after it; no events are drained in between (a stream closed there would keep
                # the lookup without its question).
                parts.recall.note([m])
                parts.recall.run(then=msgs[i:])
            parts.append(m)
            yield from drain()
            if m["role"] == "tool":
                parts.prober.tool_results(1)
                parts.notes.tool_result(len(parts.transcript.messages) - 1, m)
            if m["role"] == "assistant" and m.get("tool_calls"):
                answered = {x.get("tool_call_id") for x in msgs[i + 1:] if x["role"] == "tool"}
                for c in m["tool_calls"]:
                    if runs(c) and c.get("id") not in answered:
                        self.run_tool(c)
                        yield from drain()
            # after the call's last message the reply is the raw tail to come: a preparation may start
            parts.compactor.tick(turn_end=i == len(msgs) - 1)
            yield from drain()
        parts.recall.note([m for m in msgs if m["role"] != "user"], skip_calls=runs)
        yield from self._probe_if_due()
        # what the new messages name that only the offloaded history holds, placed before the reply
        parts.recall.run()
        yield from drain()

    def _metered(self, tokens: int) -> None:
        """The conversation grew by ``tokens`` since the previous call ended (the schedule's pace)."""
        now = time.perf_counter()
        self.parts.compactor.meter.turn(tokens, now - self._turn_end)
        self._turn_end = now

    def _turn_parts(self) -> TurnParts:
        parts = self.parts
        return TurnParts(ctx=parts.ctx, compactor=parts.compactor, prober=parts.prober, transcript=parts.transcript,
                         room=parts.room, window=parts.window, chunk_tokens=parts.chunk_tokens,
                         drain=parts.outbox.drain, probe_if_due=self._probe_if_due, append=parts.append)

    def _run_call(self, messages, max_tokens, tools, sampling, streaming):
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        parts = self.parts
        msgs = normalize_messages(messages)
        sampling, stop = check_sampling(sampling)
        new_tools = parts.tools.begin_call(tools)
        parts.outbox.forget_pending()
        first = parts.compactor.call_tidx = len(parts.transcript.messages)  # its messages stay raw until answered
        ctx = parts.ctx
        ctx.prefilled = 0
        completion_tokens = 0
        if new_tools != parts.tools.in_effect:  # the tool header changed: re-render
            parts.transcript.journal.tools(new_tools)
            parts.tools.in_effect = ctx.tools = new_tools
            parts.room.make(lambda: ctx.measure(ctx.render()))
            ctx.sync(ctx.render())
        yield from self._add_messages(msgs)
        others: list = []
        searched = False
        runs = parts.tools.runs
        for loops in range(4):
            msg, finish, generated = yield from Turn(self._turn_parts(), max_tokens, sampling, stop, streaming,
                                                     keep_call_raw=searched).run()
            completion_tokens += generated
            calls = msg.get("tool_calls") or []
            own = [c for c in calls if runs(c)]
            others = [c for c in calls if not runs(c)]
            searched = any(history_search.is_search_call(c) for c in own)
            if searched:  # the model answers from the result: its question stays raw until it has
                parts.compactor.call_tidx = first
                self._keep_question_raw(first)
            for c in own:
                self.run_tool(c)
                yield from parts.outbox.drain()
            if others:  # their arguments may name offloaded things: recalled once the results are in
                parts.recall.note([msg], skip_calls=runs)
            if not own or others:
                break
            if loops < 3:  # another reply follows (a stream's reader starts a new one here)
                parts.outbox.emit(ev.ReplyFollows([c["function"]["name"] for c in own]))
                yield from parts.outbox.drain()
        self._metered(ctx.prefilled + completion_tokens)
        self.n_calls += 1  # answered calls only: each left an assistant message (load resumes the count)
        self.last_response = completion(f"chatcmpl-{self.response_id}-{self.n_calls}", self.model_name,
                                        msg.get("content"), others, finish, ctx.prefilled, completion_tokens,
                                        self.fill())
        yield from parts.outbox.drain()


__all__ = ["CallLoop", "CallParts"]
