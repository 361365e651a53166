"""The session's call loop: one ``chat``/``stream``/``add`` call, from its messages to its reply — the messages
appended (room made first, tool results counted, compaction-tool calls run), the schedule ticked between
them, the due probe, the recall of offloaded lines the new messages name (``recall.py``), then up to four
replies (a reply that only calls ``compact_conversation`` is followed by another, as is one that only
searches the history), the rates measured and the OpenAI-shaped response built.  A mixin of
:class:`~..session.Session`: it works on the session's parts (``_ctx``, ``_ledger``, ``_compactor``,
``_prober``, ``_room``, ``_recall``)."""
from __future__ import annotations

import contextlib
import time
from typing import List

from ..compaction.tools import compact as compaction_tool, history_search
from .. import events as ev
from ..chat.messages import check_sampling, check_tool_results, completion, normalize_messages
from .turn import Turn, TurnParts


class CallLoop:
    def _runs(self, call: dict) -> bool:
        """Does the session answer this call itself?  ``compact_conversation`` always, ``search_history``
        when the session offers it, neither when the caller's own tools define that name (theirs, then)."""
        if compaction_tool.is_compact_call(call):
            return compaction_tool.NAME not in self._caller_tool_names
        if history_search.is_search_call(call):
            return self._offer_search and history_search.NAME not in self._caller_tool_names
        return False

    def _run_tool(self, call: dict) -> dict:
        runner = self._search if history_search.is_search_call(call) else self._tool
        msg = runner.run(call)
        self._append(msg)
        return msg

    def _keep_question_raw(self, first: int) -> None:
        """A background preparation planned while the model wrote its search call may summarize the
        call's own messages (the question the search serves): restart it at a cut before them."""
        comp = self._compactor
        p = comp.prep
        if p is not None and any(e.tidx >= first for e in self._ctx.entries[:p.mark] if not e.summary):
            comp.cancel("question_in_use")

    def _probe_if_due(self):
        trig = self._prober.due()
        if trig is None:
            return
        comp = self._compactor
        v = self._prober.run(trig, has_cut=self._ctx.choose_mark(self.limits.keep_recent, self.limits.min_span) is not None,
                             committing=comp.prep is not None and comp.prep.commit_trigger is not None)
        yield from self._drain()
        if v == "COMPRESS":
            comp.compress()
            yield from self._drain()

    def _add_messages(self, msgs: List[dict]):
        self._check_open()
        check_tool_results(msgs, [e.msg for e in self._ctx.entries])
        self._room.for_batch(msgs)
        yield from self._drain()
        for i, m in enumerate(msgs):
            if m["role"] == "user":
                # what a user message names that only the offloaded history holds goes before it, so that
                # the question stays the last thing the model reads before it answers (after it, the model
                # answered by describing the lookup: "search_history returned").  Only if the rest of the
                # batch fits after it; no events are drained in between (a stream closed there would keep
                # the lookup without its question).
                self._recall.note([m])
                self._recall.run(then=msgs[i:])
            self._append(m)
            yield from self._drain()
            if m["role"] == "tool":
                self._prober.tool_results(1)
                self._maker.notes.tool_result(len(self._ledger.transcript) - 1, m)
            if m["role"] == "assistant" and m.get("tool_calls"):
                answered = {x.get("tool_call_id") for x in msgs[i + 1:] if x["role"] == "tool"}
                for c in m["tool_calls"]:
                    if self._runs(c) and c.get("id") not in answered:
                        self._run_tool(c)
                        yield from self._drain()
            # after the call's last message the reply is the raw tail to come: a preparation may start
            self._compactor.tick(turn_end=i == len(msgs) - 1)
            yield from self._drain()
        self._recall.note([m for m in msgs if m["role"] != "user"], skip_calls=self._runs)
        yield from self._probe_if_due()
        # what the new messages name that only the offloaded history holds, placed before the reply
        self._recall.run()
        yield from self._drain()

    def _run(self, messages, max_tokens, tools, sampling, streaming):
        with self._one_call():
            yield from self._run_call(messages, max_tokens, tools, sampling, streaming)

    @contextlib.contextmanager
    def _one_call(self):
        """One call at a time: a second call while a stream is open would interleave two replies."""
        self._check_open()
        if self._busy:
            from ..errors import SequenceBusyError
            raise SequenceBusyError("this session is still producing a reply (a stream is open): exhaust or "
                                    "close() that stream before the next chat/stream/add/compact call")
        self._busy = True
        try:
            self._ctx.heal()   # (a failed in-place swap the engine could not undo at the time)
            yield
        finally:
            self._busy = False
            self._compactor.call_tidx = None

    def _metered(self, tokens: int) -> None:
        """The conversation grew by ``tokens`` since the previous call ended (the schedule's pace)."""
        now = time.perf_counter()
        self._compactor.meter.turn(tokens, now - self._turn_end)
        self._turn_end = now

    def _turn_parts(self) -> TurnParts:
        return TurnParts(ctx=self._ctx, compactor=self._compactor, prober=self._prober, ledger=self._ledger,
                         window=self.window, chunk_tokens=self.policy.chunk_tokens, make_room=self._make_room,
                         drain=self._drain, probe_if_due=self._probe_if_due, append=self._append)

    def _run_call(self, messages, max_tokens, tools, sampling, streaming):
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        msgs = normalize_messages(messages)
        sampling, stop = check_sampling(sampling)
        new_tools = self._effective_tools(tools)
        self._caller_tool_names = tool_names(tools if tools is not None else self.tools)
        self._pending.clear()
        first = self._compactor.call_tidx = len(self._ledger.transcript)  # its messages stay raw until answered
        ctx = self._ctx
        ctx.prefilled = 0
        completion_tokens = 0
        if new_tools != self._cur_tools:  # the tool header changed: re-render
            self._ledger.journal.tools(new_tools)
            self._cur_tools = ctx.tools = new_tools
            self._make_room(lambda: ctx.measure(ctx.render()))
            ctx.sync(ctx.render())
        yield from self._add_messages(msgs)
        others: list = []
        searched = False
        for loops in range(4):
            msg, finish, ntok = yield from Turn(self._turn_parts(), max_tokens, sampling, stop, streaming,
                                                keep_call_raw=searched).run()
            completion_tokens += ntok
            calls = msg.get("tool_calls") or []
            own = [c for c in calls if self._runs(c)]
            others = [c for c in calls if not self._runs(c)]
            searched = any(history_search.is_search_call(c) for c in own)
            if searched:  # the model answers from the result: its question stays raw until it has
                self._compactor.call_tidx = first
                self._keep_question_raw(first)
            for c in own:
                self._run_tool(c)
                yield from self._drain()
            if others:  # their arguments may name offloaded things: recalled once the results are in
                self._recall.note([msg], skip_calls=self._runs)
            if not own or others:
                break
            if loops < 3:  # another reply follows (a stream's reader starts a new one here)
                self._emit(ev.ReplyFollows([c["function"]["name"] for c in own]))
                yield from self._drain()
        self._metered(ctx.prefilled + completion_tokens)
        self._n_calls += 1  # answered calls only: each left an assistant message (load resumes the count)
        self.last_response = completion(f"chatcmpl-{self.session_id}-{self._n_calls}",
                                        getattr(self.engine, "model_name", "local"), msg.get("content"), others,
                                        finish, ctx.prefilled, completion_tokens, self.fill)
        yield from self._drain()


def tool_names(tools) -> set:
    return {t["function"]["name"] for t in (tools or []) if isinstance(t, dict) and isinstance(t.get("function"), dict)}


__all__ = ["CallLoop", "tool_names"]
