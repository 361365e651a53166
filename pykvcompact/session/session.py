"""Session: a chat over one live KV sequence whose history is compacted by a
:class:`~pykvcompact.compaction.policy.Policy`.

A facade over small objects in ``session/`` (the live ``Context``, the ``Transcript`` of every message, the
write-ahead ``Journal``, the ``Turn`` that writes one reply) and ``compaction/`` (``Compactor``, ``Swap``,
``Prober``, ``Recall``, the summary makers); how they fit and what they guarantee (nothing is lost: the
replaced messages are on disk before any swap) is in docs/architecture.md.
"""
from __future__ import annotations

import copy
import datetime
import uuid
import warnings
import weakref
from typing import Iterator, List, Optional, Sequence, Union

from ..compaction.tools import compact as compaction_tool, history_search
from .. import events as ev
from ..compaction import rubrics as _rubrics
from ..chat.template import ChatTemplate
from .history_file import HistoryFile, check_session_id
from ..compaction.policy import Policy
from .call_loop import CallLoop, CallParts
from ..compaction.tools.compact import CompactTool
from ..compaction.recall import Recall, default_budget as default_recall_budget
from ..compaction.tools.search import SearchTool
from ..compaction.compactor import Compactor
from .context import Context
from .journal import Journal, log_path
from .transcript import Transcript
from ..chat.messages import ContextWindowError, check_json, check_tools, normalize_messages
from ..compaction.prober import LABELS, Prober
from ..compaction.room import Room
from .append import append_message
from .arguments import check_arguments, check_labels, check_seconds, session_tool_call
from .sizing import check_base, release, reserve, size_session
from .outbox import Outbox
from .tools import SessionTools
from ..compaction.summary.summaries import SummaryMaker
from ..compaction.summary.summarizer import Summarizer

class Session:
    """A chat session on ``engine`` under ``policy``.

    ``Session(engine, *, system=None, policy=Policy(), session_id=None, history_dir="conversation_history",
    tools=None, recall_tokens=None)``.  Use :meth:`chat` (OpenAI chat-completion dict), :meth:`stream` (text
    deltas and events), :meth:`compact` (``/compact``), :meth:`add` (messages without a reply), :meth:`pin`;
    read :attr:`events`, :attr:`fill`, :attr:`transcript`, :attr:`messages`, :attr:`window`.

    ``recall_tokens``: when a new user message or tool call names something (a path, key, id, number,
    quoted string, proper noun) that the offloaded history holds, and the offloaded lines about it rival the
    live context's best, up to this many tokens of them are placed in the context before the reply
    (``compaction/recall.py``; a ``recalled`` event).  ``None``: ``min(256, window // 12)``; ``0``: never.
    """

    def __init__(self, engine, *, system: Optional[str] = None, policy: Optional[Policy] = None,
                 session_id: Optional[str] = None, history_dir="conversation_history", tools=None,
                 template: Optional[ChatTemplate] = None, summarizer: Optional[Summarizer] = None,
                 labels: Sequence[str] = LABELS, recall_tokens: Optional[int] = None, _resume=None):
        policy = check_arguments(engine, policy, system, recall_tokens)
        self.engine, self.policy = engine, policy
        if session_id is None:
            session_id = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:8]
        self.session_id = check_session_id(session_id)
        self.history = HistoryFile(history_dir, self.session_id)
        self.history_path = str(self.history.path)
        self.history.check_writable()
        caller_tools = check_tools(tools)
        self.template = template or ChatTemplate.from_engine(engine)
        if self.template.fallback_reason:
            warnings.warn(f"the model's chat template cannot be rendered ({self.template.fallback_reason}); "
                          "using ChatML", RuntimeWarning, stacklevel=2)
        self.summarizer = summarizer or Summarizer()
        self.rubric = _rubrics.load(policy.rubric)
        self.labels = check_labels(labels)
        self._outbox = Outbox()
        self._closed = False
        self.log_path = str(log_path(self.history.dir, self.session_id))  # absolute: a later chdir moves neither
        self._transcript = Transcript(self.history, _resume or Journal(self.log_path))
        self._tools = SessionTools(caller_tools, policy.offers_tool, policy.offers_search)
        self.window, cells = size_session(engine, policy, self.template, self.rubric, self.history_path, self._tools)
        self.limits = policy.limits(self.window)
        check_base(engine, policy, self.limits, self.template, self._tools.in_effect, system)
        self._cells_key = object()  # the reservation is released on close() or when the session is collected
        reserve(engine, self._cells_key, cells)
        self._release = weakref.finalize(self, release, engine, self._cells_key)
        self._ctx = Context(engine, self.template, self._tools.in_effect)
        self._maker = SummaryMaker(self._ctx, self._transcript, policy, self.limits, self.summarizer, self._emit,
                                   searchable=self._tools.answers_search())
        self._compactor = Compactor(self._ctx, self._transcript, self._maker, policy, self.limits, self._emit,
                                    fork_cells=cells - self.window)
        self._prober = Prober(self._ctx, policy, self.limits, self.rubric, self.labels, self._emit)
        self._room = Room(self._ctx, self._compactor, self.window)
        self._tool = CompactTool(self._ctx, policy, self.limits, self._compactor, self._emit, self.history_path)
        self._search = SearchTool(self._ctx, self._transcript, self.limits, self._emit)
        self.recall_tokens = default_recall_budget(self.window) if recall_tokens is None else recall_tokens
        self._recall = Recall(self._ctx, self._transcript, self.recall_tokens, self._emit, self._append, self.window,
                              self._tools.answers_search)
        self._calls = CallLoop(
            CallParts(ctx=self._ctx, transcript=self._transcript, compactor=self._compactor, prober=self._prober,
                      room=self._room, recall=self._recall, notes=self._maker.notes, tools=self._tools,
                      compact_tool=self._tool, search_tool=self._search, outbox=self._outbox, append=self._append,
                      check_open=self._check_open, window=self.window, keep_recent=self.limits.keep_recent,
                      min_span=self.limits.min_span, chunk_tokens=policy.chunk_tokens),
            response_id=self.session_id, model_name=getattr(engine, "model_name", "local"), fill=lambda: self.fill)
        try:
            if _resume is None:  # a new session (a same-id log restarts at this record)
                self._transcript.journal.open(session_id=self.session_id, history_dir=str(history_dir),
                                          policy=policy, tools=self._tools.caller, cur_tools=self._tools.in_effect)
            if system is not None:
                self._append({"role": "system", "content": system}, check_room=False)
                self._ctx.n_prefix = 1
        except BaseException:
            self.close()
            raise

    # ================================================================== public API
    @property
    def events(self) -> List[ev.Event]:
        """Every event of this session, oldest first."""
        return self._outbox.events

    @property
    def tools(self) -> List[dict]:
        """The caller's tools, used by every call that passes none (assign a new list to change them)."""
        return self._tools.caller

    @tools.setter
    def tools(self, tools) -> None:
        self._tools.set_caller(check_tools(tools))

    @property
    def last_response(self) -> Optional[dict]:
        """The chat-completion dict of the last answered call."""
        return self._calls.last_response

    @property
    def fill(self) -> float:
        """Live tokens / window."""
        ctx = getattr(self, "_ctx", None)
        return len(ctx) / self.window if ctx is not None and not ctx.seq.closed else 0.0

    @property
    def n_tokens(self) -> int:
        return len(self._ctx)

    @property
    def tokens(self) -> List[int]:
        """The live sequence's tokens."""
        return self._ctx.seq.tokens

    @property
    def sequence(self):
        return self._ctx.seq

    @property
    def transcript(self) -> List[dict]:
        """Every message ever, in order; summaries carry ``"summary": True``."""
        return self._transcript.copy()

    @property
    def offloaded(self) -> List[dict]:
        """Messages that left the live context (all of them are in the history file)."""
        return self._transcript.offloaded

    @property
    def messages(self) -> List[dict]:
        """The live messages (what the model sees), summaries included."""
        return [copy.deepcopy(e.msg) for e in self._ctx.entries]

    @property
    def worst_stall_ms(self) -> float:
        """The longest a swap (or drop) has held the conversation up in this session."""
        return self._compactor.worst_stall_ms

    def render(self, add_generation_prompt: bool = False) -> str:
        """A full render of the live messages with the session's template and tools."""
        return self._ctx.render(add_generation_prompt=add_generation_prompt)

    def add(self, messages) -> None:
        """Append messages to the live context without generating a reply."""
        self._calls.add(normalize_messages(messages))

    def chat(self, messages, *, max_tokens: int = 256, tools=None, **sampling) -> dict:
        """Add ``messages`` (a str is a user message) and generate the assistant reply.

        Returns an OpenAI chat-completion dict.  Calls to ``compact_conversation`` are run by the session
        itself (the tool loop); other tool calls are handed back to the caller."""
        for _ in self._calls.run(messages, max_tokens, tools, sampling, streaming=False):
            pass
        return self._calls.last_response

    def stream(self, messages, *, max_tokens: int = 256, tools=None, **sampling) -> Iterator[Union[str, ev.Event]]:
        """Like :meth:`chat`, yielding text deltas (``str``) and compaction events as they happen. The final
        chat-completion dict is in :attr:`last_response` afterwards."""
        return self._calls.run(messages, max_tokens, tools, sampling, streaming=True)

    def steps(self, messages, *, max_tokens: int = 256, tools=None, **sampling) -> Iterator[object]:
        """:meth:`chat` as a generator its caller can stop: it yields each compaction event as it happens
        and :data:`CHUNK_DONE` after each generated chunk of the reply (chunks as ``chat`` generates them,
        no text deltas).  Closing it ends the reply there, as closing a :meth:`stream` does (what was
        generated stays); when it runs to the end the chat-completion dict is in :attr:`last_response`.
        A server uses it to stop a plain reply whose client went away."""
        return self._calls.run(messages, max_tokens, tools, sampling, streaming=False)

    @property
    def tools_in_effect(self) -> List[dict]:
        """The tool schemas the context renders now: the caller's and the session's own
        (``compact_conversation``, ``search_history``), a copy."""
        return copy.deepcopy(self._tools.in_effect or [])

    def compact(self, instructions: Optional[str] = None) -> Optional[ev.Rebased]:
        """Compact now (``/compact``); ``instructions`` focus the summary. Returns the ``rebased`` event, or
        ``None`` when there is nothing to compact yet (a ``compaction_skipped`` event says why)."""
        if instructions is not None and not isinstance(instructions, str):
            raise TypeError("instructions must be a str")
        check_json(instructions, "instructions")
        with self._calls.one_call():
            out = self._compactor.compact("manual", instructions)
        self._outbox.forget_pending()
        return out

    def idle(self, seconds: float) -> None:
        """The caller has nothing for the session for up to ``seconds`` (a tool of the agent is running):
        in background mode the preparation advances meanwhile — the engine gives its jobs whole chunks
        when nothing else runs, and the session builds and prefills the rebased context as soon as the
        summary is in, and commits one a COMPRESS verdict asked for.  Returns when the preparation is caught
        up, when there is none to advance, or after ``seconds``.  Other modes return at once."""
        seconds = check_seconds(seconds)
        if getattr(self.engine, "closed", False):
            from ..errors import EngineClosedError
            raise EngineClosedError("the session's engine is closed; Session.load the log on a new engine")
        with self._calls.one_call():
            self._compactor.idle(seconds)
        self._outbox.forget_pending()

    def pin(self, message_index: int) -> None:
        """Keep transcript message ``message_index`` verbatim in every compaction from now on."""
        self._check_open()
        was = set(self._transcript.pinned)
        self._transcript.pin(message_index)
        p, new = self._compactor.prep, self._transcript.pinned - was
        if p is not None and new and not any(e.tidx in new for e in self._ctx.entries[p.cut:] if not e.summary):
            self._compactor.cancel("pinned")  # planned before the pin: it would summarize the message

    def save(self, path) -> None:
        """Snapshot the session to ``path``: its live context, the position in its log and the KV state of
        its sequence, so that :meth:`load` resumes without re-prefilling.  (Every message is in the log
        already, fsynced as it came: a session that was never saved can be loaded from its log.)"""
        from .persist import save_session
        with self._calls.one_call():
            save_session(path, self._ctx, self._transcript.journal, self.session_id, self.log_path)

    @classmethod
    def load(cls, engine, path, **kwargs) -> "Session":
        """Resume a session from a :meth:`save` snapshot or from its log (``{history_dir}/{id}.log.jsonl``,
        after a crash).  The transcript, pins, summaries and live context come back as they were; the KV
        state is loaded when the snapshot is current and was saved by the same model, context size and
        library version, else the live context is prefilled again (``resumed["kv"]`` says which).
        ``kwargs`` (``summarizer``, ``labels``, ``template``, ``recall_tokens``) as for the constructor."""
        from .persist import read_session, restore_context
        got = read_session(path, kwargs)
        r = got.record
        # the history lives next to the log, wherever the log is now (moved, or named relative to another cwd)
        s = cls(engine, policy=got.policy, session_id=r.session_id, history_dir=str(got.journal.path.parent),
                tools=r.tools or None, _resume=got.journal, **kwargs)
        s.log_path = str(got.journal.path)
        try:
            s._transcript.restore(r)
            # completion ids go on from here: each answered call left at least one assistant message
            s._calls.n_calls = sum(1 for m in r.transcript if m.get("role") == "assistant")
            for i, described in r.metas.items():
                s._maker.restore(r.transcript[i], described)
            s._maker.notes.notes.update(r.notes)
            if r.cur_tools != s._tools.in_effect:
                s._tools.in_effect = s._ctx.tools = r.cur_tools
            s.resumed = restore_context(s._ctx, s._room, s.engine, s.window, s.session_id, r, got.header,
                                        got.blob)
        except BaseException:
            s.close()
            raise
        return s

    def call_tool(self, name: str = compaction_tool.NAME, arguments: Optional[dict] = None) -> str:
        """Run a session-handled tool as if the model had called it now (``compact_conversation``, or
        ``search_history`` with ``{"query": ...}``): the assistant tool call and its result are added to
        the conversation; returns the result text."""
        self._check_open()
        call = session_tool_call(name, arguments)
        with self._calls.one_call():
            self._append({"role": "assistant", "content": None, "tool_calls": [call]})
            out = self._calls.run_tool(call)["content"]
        self._outbox.forget_pending()
        return out

    def compact_conversation(self) -> str:
        """The ``compact_conversation`` tool, called directly (see :meth:`call_tool`)."""
        return self.call_tool(compaction_tool.NAME)

    def search_history(self, query: str) -> str:
        """The ``search_history`` tool, called directly: the offloaded lines that match ``query``, as the
        model would see them (the call and its result join the conversation; see :meth:`call_tool`)."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a str, got {type(query).__name__}")
        return self.call_tool(history_search.NAME, {"query": query})

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if hasattr(self, "_compactor"):
            self._compactor.cancel(None)
        if hasattr(self, "_maker"):
            self._maker.notes.close()
        if hasattr(self, "_ctx"):
            self._ctx.close()
        if hasattr(self, "_release"):
            self._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"Session(id={self.session_id!r}, mode={self.policy.mode!r}, window={self.window}, "
                f"tokens={len(self._ctx) if not self._closed else 0}, messages={len(self._ctx.entries)})")

    # ================================================================== the parts' shared verbs
    def _check_open(self):
        if self._closed:
            from ..errors import SequenceClosedError
            raise SequenceClosedError("the session is closed")

    def _emit(self, event: ev.Event):
        self._outbox.emit(event)

    def _append(self, msg: dict, view: Optional[dict] = None, *, check_room: bool = True,
                from_partial: bool = False):
        return append_message(self._ctx, self._transcript, self._room.make, msg, view, check_room=check_room,
                              from_partial=from_partial)


__all__ = ["Session", "ContextWindowError"]
