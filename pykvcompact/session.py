"""Session: a chat over one live KV sequence whose history is compacted by a :class:`~.policy.Policy`.

The policy decides (pure functions in ``policy.py``); the session executes through the sequence
operations only — ``fork``, ``truncate``, ``append``/``append_background``, ``generate``/``stream``/
``generate_background``, ``probe``, ``prepare_rebase``/``commit_rebase`` — so another backend could stand
behind it.

Invariants
- The live sequence holds exactly the rendered tokens of the live messages (plus the reply being
  generated).  Rendering is incremental: a new message is rendered with the whole list and only the
  difference from the previous render is tokenized and appended.  If the template re-renders an earlier
  part differently (Qwen merges consecutive tool results into one turn), the sequence is truncated back
  to the last message start that is a token boundary and the rest is re-appended.
- The sequence never exceeds the window, and the window plus the forks' cells fits in the engine's pool
  (checked at creation).  Fill is checked before every append and every generation chunk; compaction
  (or, in mode ``none``, dropping the oldest turns) happens first when needed.
- Nothing is lost: before any swap the replaced messages are appended (fsync) to the history file that
  the summary names.  ``transcript`` holds every message ever; non-summary transcript messages ==
  ``offloaded`` + non-summary live messages, in order.
"""
from __future__ import annotations

import copy
import datetime
import json
import time
import uuid
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Union

from . import compaction_tool, events as ev
from . import rubrics as _rubrics
from .chat_template import ChatTemplate, common_prefix_len, is_safe_cut
from .history import HistoryFile, check_session_id
from .policy import (SUMMARY_MESSAGE_OVERHEAD, Limits, MsgInfo, Policy, choose_mark, drop_plan, needs_restart, preparation_due, probe_due,
                     resolve_window, sync_due, tool_allowed, verdict)
from .summarizer import Summarizer, fallback_summary, summarizer_request, summary_message
from .tool_calls import parse_tool_calls

PROBE_PROMPT = ("Context check. {rubric}\n"
                "Is this a good moment to compact the conversation? Answer with one word: COMPRESS or CONTINUE.")
LABELS = ("COMPRESS", "CONTINUE")
ROLES = ("system", "user", "assistant", "tool")


def _errors():
    from . import errors
    return errors


def _engine_error_types():
    e = _errors()
    return tuple(getattr(e, n) for n in ("EngineError", "ContextFullError", "SlotsExhaustedError",
                                         "UnsupportedOperationError", "SequenceBusyError") if hasattr(e, n))


class ContextWindowError(ValueError):
    """A message (or the system prompt) cannot fit in the session's window even after compaction."""


class _Live:
    __slots__ = ("msg", "view", "tidx", "summary", "start_char", "start_tok")

    def __init__(self, msg, view, tidx, summary=False, start_char=0, start_tok=None):
        self.msg, self.view, self.tidx, self.summary = msg, view, tidx, summary
        self.start_char, self.start_tok = start_char, start_tok

    def __repr__(self):
        return f"_Live({self.msg.get('role')}, tidx={self.tidx}, char={self.start_char}, tok={self.start_tok})"


@dataclass
class _Partial:
    """The assistant reply being generated: where it starts (before the generation prompt) and where
    its generated text starts."""
    start_char: int
    start_tok: Optional[int]
    gen_char: int
    gen_tok: int
    tokens: List[int] = field(default_factory=list)


@dataclass
class _Prep:
    """A summary being prepared in the background (mode ``background``)."""
    mark: int
    mark_tok: int
    prefix_tok: int
    t0: float
    instructions: Optional[str] = None
    fork: Any = None
    attempt: Any = None
    attempts: int = 1
    stage: str = "summarizing"          # summarizing -> ready -> rebasing
    text: Optional[str] = None
    n_summary_tokens: int = 0
    fallback: bool = False
    msg: Optional[dict] = None
    r_text: str = ""
    repl: Optional[List[int]] = None
    rb: Any = None
    commit_trigger: Optional[str] = None
    ready_at: Optional[float] = None
    msg_view: Optional[dict] = None


def _normalize_messages(x) -> List[dict]:
    if isinstance(x, str):
        return [{"role": "user", "content": x}]
    if isinstance(x, dict):
        x = [x]
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"messages must be a str, a message dict or a list of message dicts, got {type(x).__name__}")
    out = []
    for m in x:
        if isinstance(m, str):
            m = {"role": "user", "content": m}
        if not isinstance(m, dict):
            raise TypeError(f"each message must be a dict, got {type(m).__name__}")
        role = m.get("role")
        if role not in ROLES:
            raise ValueError(f"message role must be one of {ROLES}, got {role!r}")
        m = dict(m)
        c = m.get("content")
        if isinstance(c, list):  # OpenAI content parts: keep the text parts
            parts = []
            for p in c:
                if isinstance(p, dict) and p.get("type") == "text":
                    parts.append(str(p.get("text", "")))
                elif isinstance(p, str):
                    parts.append(p)
                else:
                    raise ValueError("only text content parts are supported")
            m["content"] = "".join(parts)
        elif c is None:
            if not (role == "assistant" and m.get("tool_calls")):
                raise ValueError(f"a {role} message needs string content")
        elif not isinstance(c, str):
            raise TypeError(f"message content must be a str, got {type(c).__name__}")
        if m.get("tool_calls") is not None:
            if role != "assistant" or not isinstance(m["tool_calls"], list):
                raise ValueError("tool_calls must be a list on an assistant message")
            calls = []
            for i, tc in enumerate(m["tool_calls"]):
                if not isinstance(tc, dict):
                    raise ValueError("each tool call must be a dict")
                f = tc.get("function", tc)
                if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                    raise ValueError("each tool call needs function.name")
                args = f.get("arguments", "{}")
                if not isinstance(args, str):
                    args = json.dumps(args, ensure_ascii=False)
                calls.append({"id": tc.get("id") or f"call_{uuid.uuid4().hex[:8]}", "type": "function",
                              "function": {"name": f["name"], "arguments": args}})
            m["tool_calls"] = calls
        out.append(m)
    return out


def _check_tools(tools) -> List[dict]:
    if tools is None:
        return []
    if not isinstance(tools, (list, tuple)):
        raise TypeError("tools must be a list of OpenAI tool schemas")
    out = []
    for t in tools:
        if not isinstance(t, dict):
            raise TypeError("each tool must be a dict (OpenAI tool schema)")
        f = t.get("function", t)
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise ValueError("each tool needs function.name")
        out.append(t if "function" in t else {"type": "function", "function": t})
    return out


class Session:
    """A chat session on ``engine`` under ``policy``.

    ``Session(engine, *, system=None, policy=Policy(), session_id=None, history_dir="conversation_history",
    tools=None)``.  Use :meth:`chat` (OpenAI chat-completion dict), :meth:`stream` (text deltas and events),
    :meth:`compact` (``/compact``), :meth:`add` (messages without a reply); read :attr:`events`,
    :attr:`fill`, :attr:`transcript`, :attr:`messages`, :attr:`window`.
    """

    def __init__(self, engine, *, system: Optional[str] = None, policy: Optional[Policy] = None,
                 session_id: Optional[str] = None, history_dir="conversation_history", tools=None,
                 template: Optional[ChatTemplate] = None, summarizer: Optional[Summarizer] = None,
                 labels: Sequence[str] = LABELS):
        if policy is None:
            policy = Policy()
        if not isinstance(policy, Policy):
            raise TypeError("policy must be a pykvcompact.Policy")
        if system is not None and not isinstance(system, str):
            raise TypeError("system must be a str")
        self.engine = engine
        self.policy = policy
        if session_id is None:
            session_id = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:8]
        self.session_id = check_session_id(session_id)
        self.history = HistoryFile(history_dir, self.session_id)
        self.history_path = str(self.history.path)
        self.tools = _check_tools(tools)
        self.template = template or ChatTemplate.from_engine(engine)
        if self.template.fallback_reason:
            warnings.warn(f"the model's chat template cannot be rendered ({self.template.fallback_reason}); "
                          "using ChatML", RuntimeWarning, stacklevel=2)
        self.summarizer = summarizer or Summarizer()
        self.rubric = _rubrics.load(policy.rubric)
        self.labels = tuple(labels)
        self.events: List[ev.Event] = []
        self.offloaded: List[dict] = []
        self.last_response: Optional[dict] = None
        self._transcript: List[dict] = []
        self._live: List[_Live] = []
        self._text = ""
        self._partial: Optional[_Partial] = None
        self._prep: Optional[_Prep] = None
        self._pending: List[ev.Event] = []
        self._gen_since_probe = 0
        self._n_prefix = 0
        self._n_calls = 0
        self._prefilled = 0
        self._closed = False
        self._seq = None
        self._cur_tools = self._effective_tools(None)

        # --- the window: the window plus the forks' cells must fit in what the engine has free
        probe_est = len(self._tok(self.template.render(
            [{"role": "user", "content": "x"}, {"role": "user", "content": PROBE_PROMPT.format(rubric=self.rubric)}],
            None, True))) + 16
        summ_est = len(self._tok(self.template.render(
            [{"role": "user", "content": "x"},
             {"role": "user", "content": summarizer_request(self.history_path, policy.summary_max_tokens,
                                                            "x " * 64)}], None, True))) + 16
        free = engine.n_ctx - engine.used_cells()
        self.window = resolve_window(policy, free, probe_tokens=probe_est, summarizer_tokens=summ_est)
        self.limits: Limits = policy.limits(self.window)
        self._probe_est, self._summ_est = probe_est, summ_est

        # the system prompt (with the tool definitions) must leave room for work: check before prefilling it
        first = [{"role": "system", "content": system}] if system is not None else [{"role": "user", "content": ""}]
        base = len(self._tok(self._render(first)))
        trig = self.limits.trigger(policy.mode)
        need = base + self.limits.keep_recent + (policy.summary_max_tokens if policy.summarizes else 0)
        if base >= trig or (policy.summarizes and need > self.limits.hard + self.limits.keep_recent):
            raise ValueError(
                f"window={self.window} is too small: the system prompt and tool definitions take {base} tokens; "
                f"with keep_recent and a summary of up to {policy.summary_max_tokens} tokens the session needs "
                f"a window of at least {int(need / max(policy.hard, 1e-9)) + 1}")
        self._seq = engine.sequence()
        try:
            if system is not None:
                self._append_message({"role": "system", "content": system}, check_room=False)
                self._n_prefix = 1
        except BaseException:
            self.close()
            raise

    # ================================================================== public API
    @property
    def fill(self) -> float:
        """Live tokens / window."""
        return (len(self._seq) / self.window) if self._seq is not None and not self._seq.closed else 0.0

    @property
    def n_tokens(self) -> int:
        return len(self._seq)

    @property
    def tokens(self) -> List[int]:
        """The live sequence's tokens."""
        return self._seq.tokens

    @property
    def sequence(self):
        return self._seq

    @property
    def transcript(self) -> List[dict]:
        """Every message ever, in order; summaries carry ``"summary": True``."""
        return [copy.deepcopy(m) for m in self._transcript]

    @property
    def messages(self) -> List[dict]:
        """The live messages (what the model sees), summaries included."""
        return [copy.deepcopy(l.msg) for l in self._live]

    def render(self, add_generation_prompt: bool = False) -> str:
        """A full render of the live messages with the session's template and tools."""
        return self.template.render(self._views(), self._cur_tools, add_generation_prompt)

    def add(self, messages) -> None:
        """Append messages to the live context without generating a reply."""
        for _ in self._add_messages(_normalize_messages(messages)):
            pass

    def chat(self, messages, *, max_tokens: int = 256, tools=None, **sampling) -> dict:
        """Add ``messages`` (a str is a user message) and generate the assistant reply.

        Returns an OpenAI chat-completion dict (``choices[0].message`` with ``tool_calls`` parsed from the
        output, ``finish_reason``, ``usage``).  Calls to ``compact_conversation`` are run by the session
        itself (the tool loop); other tool calls are handed back to the caller."""
        for _ in self._run(messages, max_tokens, tools, sampling, streaming=False):
            pass
        return self.last_response

    def stream(self, messages, *, max_tokens: int = 256, tools=None, **sampling) -> Iterator[Union[str, ev.Event]]:
        """Like :meth:`chat`, yielding text deltas (``str``) and compaction events (``events.Event``) as they
        happen. The final chat-completion dict is in :attr:`last_response` afterwards."""
        return self._run(messages, max_tokens, tools, sampling, streaming=True)

    def compact(self, instructions: Optional[str] = None) -> Optional[ev.Rebased]:
        """Compact now (``/compact``); ``instructions`` focus the summary. Returns the ``rebased`` event, or
        ``None`` when there is nothing to compact yet."""
        self._check_open()
        if instructions is not None and not isinstance(instructions, str):
            raise TypeError("instructions must be a str")
        out = self._compact("manual", instructions)
        self._pending.clear()
        return out

    def call_tool(self, name: str = compaction_tool.NAME, arguments: Optional[dict] = None) -> str:
        """Run a session-handled tool as if the model had called it now (only ``compact_conversation``):
        the assistant tool call and its result are added to the conversation; returns the result text
        ("Nothing to compact yet" below ``tool_min_fill`` x ``hard``)."""
        self._check_open()
        if name != compaction_tool.NAME:
            raise ValueError(f"the session only runs {compaction_tool.NAME!r}; other tools belong to the caller")
        call = {"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments or {})}}
        self._append_message({"role": "assistant", "content": None, "tool_calls": [call]})
        out = self._run_compact_tool(call)["content"]
        self._pending.clear()
        return out

    def compact_conversation(self) -> str:
        """The ``compact_conversation`` tool, called directly (see :meth:`call_tool`)."""
        return self.call_tool(compaction_tool.NAME)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._cancel_prep(None)
        if self._seq is not None:
            try:
                self._seq.close()
            except Exception:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"Session(id={self.session_id!r}, mode={self.policy.mode!r}, window={self.window}, "
                f"tokens={len(self._seq) if self._seq and not self._seq.closed else 0}, messages={len(self._live)})")

    # ================================================================== helpers
    def _check_open(self):
        if self._closed:
            raise _errors().SequenceClosedError("the session is closed") if hasattr(_errors(), "SequenceClosedError") \
                else RuntimeError("the session is closed")

    def _tok(self, text: str) -> List[int]:
        return self.engine.tokenize(text, add_special=False, parse_special=True) if text else []

    def _detok(self, toks) -> str:
        return self.engine.detokenize(toks) if toks else ""

    def _emit(self, e: ev.Event):
        self.events.append(e)
        self._pending.append(e)

    def _drain(self):
        while self._pending:
            yield self._pending.pop(0)

    def _effective_tools(self, tools) -> Optional[List[dict]]:
        base = _check_tools(tools) if tools is not None else list(self.tools)
        if self.policy.compact_tool and self.policy.mode != "none" and \
                not any(t["function"]["name"] == compaction_tool.NAME for t in base):
            base = base + [compaction_tool.TOOL]
        return base or None

    def _views(self) -> List[dict]:
        return [l.view for l in self._live]

    def _render(self, views, add_generation_prompt=False) -> str:
        return self.template.render(views, self._cur_tools, add_generation_prompt)

    def _end_tok(self) -> int:
        """Token offset where the complete messages end (the partial reply starts there)."""
        if self._partial is not None and self._partial.start_tok is not None:
            return self._partial.start_tok
        return len(self._seq)

    def _msg_infos(self) -> List[MsgInfo]:
        out = []
        n = len(self._live)
        end = self._end_tok()
        for i, l in enumerate(self._live):
            if l.start_tok is None:
                out.append(MsgInfo(l.msg["role"], 0, bool(l.msg.get("tool_calls")), l.summary, cut_ok=False))
                continue
            nxt = end
            for j in range(i + 1, n):
                if self._live[j].start_tok is not None:
                    nxt = self._live[j].start_tok
                    break
            out.append(MsgInfo(l.msg["role"], max(0, nxt - l.start_tok), bool(l.msg.get("tool_calls")), l.summary))
        return out

    def _choose_mark(self, keep_recent: Optional[int] = None, min_span: Optional[int] = None) -> Optional[int]:
        if len(self._live) <= self._n_prefix or self._live[self._n_prefix].start_tok is None:
            return None
        infos = self._msg_infos()
        extra = len(self._seq) - self._end_tok()
        return choose_mark(infos, self._n_prefix, self.limits.keep_recent if keep_recent is None else keep_recent,
                           min_span=self.limits.min_span if min_span is None else min_span, extra_tail=extra)

    def _mark_tok(self, mark: int) -> int:
        return self._live[mark].start_tok if mark < len(self._live) else self._end_tok()

    def _mark_char(self, mark: int) -> int:
        if mark < len(self._live):
            return self._live[mark].start_char
        return self._partial.start_char if self._partial is not None else len(self._text)

    def _prefix_tok(self) -> int:
        return self._live[self._n_prefix].start_tok if len(self._live) > self._n_prefix else self._end_tok()

    def _prefix_char(self) -> int:
        return self._live[self._n_prefix].start_char if len(self._live) > self._n_prefix else len(self._text)

    # ================================================================== incremental rendering
    def _plan(self, N: str, new_start_from: Optional[str] = None):
        """How to make the sequence represent text ``N``: ``(cut_char, cut_tok, c)``; the sequence is cut
        back to ``cut_tok`` (= text ``N[:cut_char]``) and ``N[cut_char:]`` appended. ``c`` is the common
        prefix of the current text and ``N``."""
        O = self._text
        c = common_prefix_len(O, N)
        if c == len(O) and is_safe_cut(N, c):
            return len(O), len(self._seq), c
        cands = [(0, 0)]
        for l in self._live:
            if l.start_tok is not None and l.start_char <= c:
                cands.append((l.start_char, l.start_tok))
        p = self._partial
        if p is not None and p.start_tok is not None and p.start_char <= c:
            cands.append((p.start_char, p.start_tok))
        best = max((x for x in cands if is_safe_cut(N, x[0])), key=lambda x: x[0])
        return best[0], best[1], c

    def _tokenize_region(self, N: str, cut_char: int, bounds: Sequence[int]) -> (List[int], Dict[int, int]):
        """Tokens of ``N[cut_char:]``, split at the safe ``bounds`` (so that each boundary maps to a token
        offset relative to ``cut_char``)."""
        pts = sorted({b for b in bounds if cut_char < b < len(N) and is_safe_cut(N, b)})
        toks: List[int] = []
        at: Dict[int, int] = {cut_char: 0}
        prev = cut_char
        for b in pts + [len(N)]:
            toks.extend(self._tok(N[prev:b]))
            at[b] = len(toks)
            prev = b
        return toks, at

    def _sync(self, render_fn: Callable[[], str], *, check_room: bool = True):
        """Make the sequence represent ``render_fn()`` (re-evaluated after any compaction). Returns
        ``(start_char, start_tok, cut_char)``: the common-prefix point of the old and new text (where a new
        message starts) and its token offset (None when it is not a token boundary), and where the
        sequence was cut back to (= the old end, unless the template re-rendered earlier text)."""
        for attempt in range(3):
            N = render_fn()
            cut_char, cut_tok, c = self._plan(N)
            bounds = [l.start_char for l in self._live if l.start_char > cut_char] + [c]
            if self._partial is not None:
                bounds += [self._partial.start_char]
            toks, at = self._tokenize_region(N, cut_char, bounds)
            after = cut_tok + len(toks)
            if not check_room or self._room_ok(after) or (attempt > 0 and after <= self.window):
                break
            if not self._make_room(lambda: self._plan_after(render_fn)):
                raise ContextWindowError(
                    f"the new text needs {after - len(self._seq)} more tokens than the window of {self.window} "
                    f"can hold even after compaction; shorten it or use a larger window")
        if after > self.window and check_room:
            raise ContextWindowError(f"the new text does not fit in the window of {self.window} tokens")
        if cut_tok < len(self._seq):
            self._truncate(cut_tok)
        if toks:
            self._seq.append(toks)
            self._prefilled += len(toks)
        # re-map message starts inside the re-appended region
        for l in self._live:
            if l.start_char > cut_char:
                l.start_tok = (cut_tok + at[l.start_char]) if l.start_char in at else None
        p = self._partial
        if p is not None and p.start_char > cut_char:
            p.start_tok = (cut_tok + at[p.start_char]) if p.start_char in at else None
        self._text = N
        if c == cut_char:
            return c, cut_tok, cut_char
        return c, ((cut_tok + at[c]) if c in at else None), cut_char

    def _plan_after(self, render_fn) -> int:
        N = render_fn()
        cut_char, cut_tok, c = self._plan(N)
        return cut_tok + len(self._tok(N[cut_char:]))

    def _append_message(self, msg: dict, view: Optional[dict] = None, *, summary: bool = False,
                        check_room: bool = True, from_partial: bool = False) -> _Live:
        """Render ``msg`` after the live messages and append the difference. ``from_partial``: ``msg`` is
        the reply just generated; it starts where the partial reply started."""
        view = view if view is not None else {k: v for k, v in msg.items() if k != "summary"}
        s = self._sync(lambda: self._render(self._views() + [view]), check_room=check_room)
        if from_partial and self._partial is not None:
            s = (self._partial.start_char, self._partial.start_tok)
            self._partial = None
        tidx = len(self._transcript)
        self._transcript.append(msg)
        live = _Live(msg, view, tidx, summary, s[0], s[1])
        self._live.append(live)
        return live

    def _truncate(self, n: int):
        p = self._prep
        if p is not None:
            if n < p.mark_tok or (p.fork is None and p.stage == "summarizing"):
                self._cancel_prep("history_changed")
            elif p.rb is not None:  # the prepared rebase follows the old tokens: prepare it again later
                try:
                    p.rb.cancel()
                except Exception:
                    pass
                p.rb = None
                p.stage = "ready"
        try:
            self._seq.truncate(n)
        except _engine_error_types():
            self._rebuild(self._seq.tokens[:n])

    def _rebuild(self, tokens: List[int]) -> dict:
        """Replace the live sequence by a fresh one prefilled with ``tokens`` (recurrent models, or when a
        rebase cannot get cells/slots)."""
        t0 = time.perf_counter()
        before = len(self._seq)
        self._seq.close()
        self._seq = self.engine.sequence(tokens)
        return {"mode": "rebuild", "tokens_before": before, "tokens_after": len(tokens),
                "stall_ms": (time.perf_counter() - t0) * 1000.0, "catch_up_tokens": 0}

    # ================================================================== room / compaction
    def _room_ok(self, after: int) -> bool:
        if after > self.window:
            return False
        if self.policy.mode == "none":
            return True
        if sync_due(self.policy, self.limits, after):
            p = self._prep
            if p is not None and self.policy.mode == "background":
                # a summary still being written: use the headroom above `hard` (while the pool can still
                # hold the shadow it will need); wait only at the window
                pending = p.stage == "summarizing" or (p.stage == "rebasing" and p.rb is not None and not p.rb.done())
                if not pending or after > self.window - self._margin():
                    return False
                shadow = self.policy.summary_max_tokens + SUMMARY_MESSAGE_OVERHEAD + (after - p.mark_tok)
                return self._free_cells() - (after - len(self._seq)) >= shadow
            return self._choose_mark() is None
        return True

    def _free_cells(self) -> int:
        f = getattr(self.engine, "free_cells", None)
        return f() if callable(f) else self.engine.n_ctx - self.engine.used_cells()

    def _margin(self) -> int:
        return self.policy.chunk_tokens + 8

    def _make_room(self, after_fn: Callable[[], int]) -> bool:
        """Compact (or drop) so that ``after_fn()`` tokens fit. False when impossible."""
        after = after_fn()
        mode = self.policy.mode
        if mode != "none" and sync_due(self.policy, self.limits, after):
            trig = "fixed" if mode == "fixed" else "hard"
            if self._choose_mark() is not None or self._prep is not None:
                self._compact(trig)
                after = after_fn()
        if after > self.window:
            need = after - self.window
            if mode == "none":
                self._drop(need + 0, reason="window")
            else:
                self._drop(need, reason="window_full")
            after = after_fn()
        return after <= self.window

    def _compact(self, trigger: str, instructions: Optional[str] = None) -> Optional[ev.Rebased]:
        if self.policy.mode == "background":
            return self._commit_prepared(trigger, instructions)
        return self._compact_sync(trigger, instructions)

    def _summary_prompt_tokens(self, mark: int, instructions: Optional[str], shorter: bool = False) -> List[int]:
        base = self._views()[:mark]
        req = {"role": "user", "content": summarizer_request(self.history_path, self.policy.summary_max_tokens,
                                                            instructions, shorter)}
        B = self._render(base)
        N = self._render(base + [req], True)
        c = common_prefix_len(B, N) if not N.startswith(B) else len(B)
        return self._tok(N[c:])

    def _summary_parts(self, text: str, fallback: bool):
        msg = summary_message(text, self.history_path)
        view = {"role": msg["role"], "content": msg["content"]}
        pre = self._views()[:self._n_prefix]
        B = self._render(pre)
        N = self._render(pre + [view])
        r_text = N[len(B):] if N.startswith(B) else N[common_prefix_len(B, N):]
        repl = self._tok(r_text)
        return msg, view, r_text, repl

    def _fallback_text(self, mark: int, reason: str) -> str:
        msgs = [l.msg for l in self._live[self._n_prefix:mark]]
        # bounded by the summary budget
        text = fallback_summary(msgs, reason=reason, max_chars=self.policy.summary_max_tokens * 6)
        lines = text.split("\n")
        while len(lines) > 2 and len(self._tok("\n".join(lines))) > self.policy.summary_max_tokens:
            lines.pop()  # least important last
        text = "\n".join(lines)
        while len(self._tok(text)) > self.policy.summary_max_tokens and len(text) > 40:
            text = text[: int(len(text) * 0.85)] + "…"
        return text

    def _run_attempts_sync(self, mark: int, mark_tok: int, instructions: Optional[str]):
        last_reason = ""
        n = 1 + self.policy.summary_retries
        for attempt in range(1, n + 1):
            fork = None
            try:
                fork = self._seq.fork()
                fork.truncate(mark_tok)
                prompt = self._summary_prompt_tokens(mark, instructions, shorter=attempt > 1 and last_reason == "over_length")
                a = self.summarizer.start(fork, prompt, max_tokens=self.policy.summary_max_tokens, background=False,
                                          timeout=self.policy.summary_timeout, detokenize=self._detok, attempt=attempt)
                text, reason = a.outcome()
                if reason is None and a.elapsed > self.policy.summary_timeout:
                    reason = "timeout"
                err = str(a.error) if a.error is not None else ""
                ntok = len(a.tokens)
            except Exception as e:  # noqa: BLE001 - fork/truncate failures are summarizer failures too
                text, reason, err, ntok = "", "exception", f"{type(e).__name__}: {e}", 0
            finally:
                if fork is not None:
                    try:
                        fork.close()
                    except Exception:
                        pass
            if reason is None:
                return text, ntok, attempt, False
            last_reason = reason
            self._emit(ev.SummaryFailed(reason, attempt, err))
        text = self._fallback_text(mark, last_reason)
        return text, len(self._tok(text)), n, True

    def _compact_sync(self, trigger: str, instructions: Optional[str] = None) -> Optional[ev.Rebased]:
        t0 = time.perf_counter()
        mark = self._choose_mark()
        if mark is None and trigger in ("manual", "tool", "window_full"):
            mark = self._choose_mark(min_span=1)
        if mark is None:
            return None
        mark_tok = self._mark_tok(mark)
        self._emit(ev.SummaryStarted(mark, mark_tok, background=False, reason=trigger))
        text, ntok, attempts, fb = self._run_attempts_sync(mark, mark_tok, instructions)
        self._emit(ev.SummaryReady(ntok, (time.perf_counter() - t0) * 1000.0, fallback=fb, attempts=attempts))
        msg, view, r_text, repl = self._summary_parts(text, fb)
        if len(repl) >= mark_tok - self._prefix_tok():  # the summary is not smaller than what it replaces
            self._emit(ev.PreparationRestarted("no_gain", mark, len(self._seq) - mark_tok))
            return None
        return self._swap(mark, msg, view, r_text, repl, trigger=trigger, t0=t0, prepared=False)

    def _offload(self, lives: Sequence[_Live], reason: str):
        msgs = [l.msg for l in lives if not l.summary]
        idx = [l.tidx for l in lives if not l.summary]
        summ = [l.tidx for l in lives if l.summary]
        if not msgs and not summ:
            return
        self.history.append(msgs, indices=idx, reason=reason, summaries=summ)
        self.offloaded.extend(msgs)
        self._emit(ev.Offloaded(self.history_path, len(msgs)))

    def _rebase_now(self, prefix_tok: int, repl: List[int], keep_from: int, mode: str) -> dict:
        rb = None
        try:
            rb = self._seq.prepare_rebase(prefix_tok, repl, keep_from, mode=mode)
            if not rb.wait():
                raise _errors().EngineError(f"rebase preparation failed: {getattr(rb, 'error', '')}")
            return self._seq.commit_rebase(rb)
        except _engine_error_types():
            if rb is not None:
                try:
                    rb.cancel()
                except Exception:
                    pass
            toks = self._seq.tokens
            return self._rebuild(toks[:prefix_tok] + list(repl) + toks[keep_from:])

    def _swap(self, mark: int, msg: Optional[dict], view: Optional[dict], r_text: str, repl: List[int], *,
              trigger: str, t0: float, prepared: bool, rb=None) -> ev.Rebased:
        """Offload ``live[n_prefix:mark]`` (durably), then replace it by the summary (or nothing)."""
        replaced = self._live[self._n_prefix:mark]
        prefix_tok, mark_tok = self._prefix_tok(), self._mark_tok(mark)
        prefix_char, mark_char = self._prefix_char(), self._mark_char(mark)
        self._offload(replaced, reason=f"compaction ({trigger})" if msg is not None else f"context shift ({trigger})")
        before = len(self._seq)
        info = None
        if rb is not None:
            try:
                info = self._seq.commit_rebase(rb)
            except _engine_error_types():
                try:
                    rb.cancel()
                except Exception:
                    pass
                info = None
        if info is None:
            mode = self.policy.rebase
            if msg is None and self.policy.mode == "none" and self.engine.capabilities.get("can_shift"):
                mode = "splice"
            info = self._rebase_now(prefix_tok, repl, mark_tok, mode)
        # bookkeeping
        delta_tok = prefix_tok + len(repl) - mark_tok
        delta_char = prefix_char + len(r_text) - mark_char
        self._text = self._text[:prefix_char] + r_text + self._text[mark_char:]
        for l in self._live[mark:]:
            l.start_char += delta_char
            if l.start_tok is not None:
                l.start_tok += delta_tok
        p = self._partial
        if p is not None:
            p.start_char += delta_char
            p.gen_char += delta_char
            p.gen_tok += delta_tok
            if p.start_tok is not None:
                p.start_tok += delta_tok
        new_live = self._live[:self._n_prefix]
        if msg is not None:
            tidx = len(self._transcript)
            self._transcript.append(msg)
            new_live.append(_Live(msg, view, tidx, True, prefix_char, prefix_tok))
        self._live = new_live + self._live[mark:]
        expect = before + delta_tok
        if len(self._seq) != expect:  # pragma: no cover - engine contract violated
            raise _errors().EngineError(f"rebase left {len(self._seq)} tokens, expected {expect}")
        stall = (time.perf_counter() - t0) * 1000.0
        e = ev.Rebased(info.get("mode", self.policy.rebase), int(info.get("tokens_before", before)),
                       int(info.get("tokens_after", len(self._seq))), stall, int(info.get("catch_up_tokens", 0)),
                       trigger=trigger, prepared=prepared, engine_stall_ms=info.get("stall_ms"))
        self._emit(e)
        return e

    def _drop(self, need: int, reason: str) -> bool:
        """Context shift: drop the oldest turns after the system prompt (offloaded first)."""
        if self._prep is not None:
            self._cancel_prep("window_full")
        if len(self._live) <= self._n_prefix or self._live[self._n_prefix].start_tok is None:
            return False
        infos = self._msg_infos()
        m = drop_plan(infos, self._n_prefix, need)
        if m is None:
            return False
        t0 = time.perf_counter()
        n_msgs = m - self._n_prefix
        n_tok = self._mark_tok(m) - self._prefix_tok()
        self._emit(ev.Dropped(n_msgs, n_tok))
        self._swap(m, None, None, "", [], trigger=reason, t0=t0, prepared=False)
        return True

    # ================================================================== background preparation
    def _cancel_prep(self, reason: Optional[str]):
        p = self._prep
        if p is None:
            return
        self._prep = None
        try:
            if p.attempt is not None:
                p.attempt.cancel()
        except Exception:
            pass
        for obj, meth in ((p.rb, "cancel"), (p.fork, "close")):
            if obj is not None:
                try:
                    getattr(obj, meth)()
                except Exception:
                    pass
        if reason is not None:
            self._emit(ev.PreparationRestarted(reason, p.mark, len(self._seq) - p.mark_tok))

    def _start_attempt(self, p: _Prep, shorter: bool = False):
        p.fork = self._seq.fork()
        p.fork.truncate(p.mark_tok)
        prompt = self._summary_prompt_tokens(p.mark, p.instructions, shorter)
        p.attempt = self.summarizer.start(p.fork, prompt, max_tokens=self.policy.summary_max_tokens,
                                          background=True, timeout=self.policy.summary_timeout,
                                          detokenize=self._detok, attempt=p.attempts)

    def _start_prep(self, reason: str, instructions: Optional[str] = None, min_span: Optional[int] = None) -> bool:
        mark = self._choose_mark(min_span=min_span)
        if mark is None:
            return False
        p = _Prep(mark=mark, mark_tok=self._mark_tok(mark), prefix_tok=self._prefix_tok(), t0=time.perf_counter(),
                  instructions=instructions)
        try:
            self._start_attempt(p)
        except _engine_error_types() as e:
            if p.fork is not None:
                try:
                    p.fork.close()
                except Exception:
                    pass
            warnings.warn(f"could not start a background summary: {e}", RuntimeWarning)
            return False
        self._prep = p
        self._emit(ev.SummaryStarted(mark, p.mark_tok, background=True, reason=reason))
        return True

    def _restart_if_needed(self) -> bool:
        """Apply the restart rule (policy.needs_restart); True when the preparation was restarted."""
        p = self._prep
        known = p.repl is not None
        summary = len(p.repl) if known else self.policy.summary_max_tokens
        why = needs_restart(self.policy, self.window, summary_tokens=summary, prefix_tokens=p.prefix_tok,
                            tail_tokens=len(self._seq) - p.mark_tok, overhead=0 if known else SUMMARY_MESSAGE_OVERHEAD)
        if not why:
            return False
        m = self._choose_mark()
        if m is None or m <= p.mark:
            return False
        est = needs_restart(self.policy, self.window, summary_tokens=self.policy.summary_max_tokens,
                            prefix_tokens=p.prefix_tok, tail_tokens=len(self._seq) - self._mark_tok(m))
        if est:  # a new mark would not help either: keep the preparation we have
            return False
        trig = p.commit_trigger
        self._cancel_prep(why)
        if self._start_prep("restart") and trig:
            self._prep.commit_trigger = trig
        return True

    def _advance_prep(self, block: bool = False):
        """Move the preparation forward: summary done -> build the replacement -> prepare_rebase; apply
        the restart rule."""
        p = self._prep
        while p is not None and p.stage == "summarizing":
            a = p.attempt
            done = a.wait() if block else (a.poll() or a.timed_out)
            if not done:
                if not block:
                    self._restart_if_needed()
                return
            text, reason = a.outcome()
            if reason == "timeout":
                a.cancel()
            err = str(a.error) if a.error is not None else ""
            try:
                p.fork.close()
            except Exception:
                pass
            p.fork = None
            if reason is not None:
                self._emit(ev.SummaryFailed(reason, p.attempts, err))
                if p.attempts <= self.policy.summary_retries:
                    p.attempts += 1
                    try:
                        self._start_attempt(p, shorter=reason == "over_length")
                        continue
                    except _engine_error_types():
                        pass
                text = self._fallback_text(p.mark, reason)
                p.fallback = True
                p.n_summary_tokens = len(self._tok(text))
            else:
                p.n_summary_tokens = len(a.tokens)
            p.text = text
            p.msg, view, p.r_text, p.repl = self._summary_parts(text, p.fallback)
            p.msg_view = view
            p.stage = "ready"
            p.ready_at = time.perf_counter()
            self._emit(ev.SummaryReady(p.n_summary_tokens, (p.ready_at - p.t0) * 1000.0, fallback=p.fallback,
                                       attempts=p.attempts))
        if p is None:
            return
        if self._restart_if_needed():
            return
        if p.stage == "ready":
            try:
                p.rb = self._seq.prepare_rebase(p.prefix_tok, p.repl, p.mark_tok, mode=self.policy.rebase)
                p.stage = "rebasing"
            except _engine_error_types():  # no slot/cells now: the commit will rebase synchronously
                p.rb = None

    def _tick(self):
        """Background bookkeeping between steps: advance the preparation, start one at ``soft``, and
        commit when a COMPRESS verdict asked for it and it is ready."""
        if self.policy.mode != "background":
            return
        if self._prep is not None:
            self._advance_prep()
        if self._prep is None and preparation_due(self.policy, self.limits, len(self._seq)):
            self._start_prep("soft")
            if self._prep is not None:
                self._advance_prep()
        p = self._prep
        if p is not None and p.commit_trigger and p.stage == "rebasing" and p.rb is not None and p.rb.done():
            self._commit_prepared(p.commit_trigger)
        elif p is not None and p.stage != "summarizing" and len(self._seq) >= self.limits.hard and \
                (p.rb is None or p.rb.done() or len(self._seq) > self.window - self._margin()):
            self._commit_prepared("hard")  # ready (and caught up) now, after running in the headroom above hard

    def _commit_prepared(self, trigger: str, instructions: Optional[str] = None) -> Optional[ev.Rebased]:
        t0 = time.perf_counter()
        p = self._prep
        if p is not None and instructions and p.instructions != instructions:
            self._cancel_prep("new_instructions")
            p = None
        if p is None:
            loose = trigger in ("manual", "tool", "window_full")
            if not self._start_prep(trigger, instructions, min_span=1 if loose else None):
                return None
            p = self._prep
        prepared = p.stage in ("ready", "rebasing")
        self._advance_prep(block=True)
        if self._prep is not p:  # restarted from a new mark by the restart rule
            p = self._prep
            if p is None:
                return None
            self._advance_prep(block=True)
            p = self._prep
            if p is None:
                return None
        if len(p.repl) >= p.mark_tok - p.prefix_tok:  # the summary is not smaller than what it replaces
            self._cancel_prep("no_gain")
            return None
        self._prep = None
        return self._swap(p.mark, p.msg, p.msg_view, p.r_text, p.repl, trigger=trigger, t0=t0, prepared=prepared,
                          rb=p.rb)

    # ================================================================== probes
    def _probe_tokens(self) -> List[int]:
        views = self._views()
        if self._partial is not None:
            views = views + [{"role": "assistant", "content": self._text[self._partial.gen_char:]}]
        q = {"role": "user", "content": PROBE_PROMPT.format(rubric=self.rubric)}
        N = self._render(views + [q], True)
        O = self._text
        if N.startswith(O):
            return self._tok(N[len(O):])
        return self._tok("\n\n" + q["content"] + "\nAnswer: ")

    def _probe(self, trigger: str):
        if not self.policy.probes:
            return
        self._gen_since_probe = 0
        n = len(self._seq)
        if n < self.limits.tool_min or self._choose_mark(min_span=1) is None:
            return  # nothing worth compacting: the rule says CONTINUE, no need to ask the model
        if self._prep is not None and self._prep.commit_trigger:
            return
        toks = self._probe_tokens()
        if len(toks) + 8 > self._free_cells():
            return  # no room in the pool right now (a summary fork or a shadow holds it): CONTINUE
        t0 = time.perf_counter()
        try:
            probs = self._seq.probe(toks, labels=self.labels)
        except _engine_error_types() as e:
            warnings.warn(f"probe failed ({e}); CONTINUE", RuntimeWarning)
            return
        ms = (time.perf_counter() - t0) * 1000.0
        p = float(probs.get(self.labels[0], float("nan")))
        v, why = verdict(self.policy, self.limits, p, n)
        self._emit(ev.Probe(v, p, len(toks), ms, reason=why, fill=n / self.window, trigger=trigger))
        if v == "COMPRESS":
            if self.policy.mode == "background":
                if self._prep is None:
                    self._start_prep("compress")
                if self._prep is not None:
                    self._prep.commit_trigger = "compress"  # committed by _tick once ready and caught up
                    self._tick()
            else:
                self._compact_sync("compress")

    # ================================================================== the compaction tool
    def _run_compact_tool(self, call: dict) -> dict:
        n = len(self._seq)
        if not tool_allowed(self.policy, self.limits, n) or self.policy.mode == "none":
            self._emit(ev.ToolRefused(n / self.window))
            result = compaction_tool.NOTHING_TO_COMPACT
        else:
            before = n
            e = self._compact("tool")
            if e is None:
                self._emit(ev.ToolRefused(n / self.window))
                result = compaction_tool.NOTHING_TO_COMPACT
            else:
                result = compaction_tool.compacted_result(self.history_path, before, len(self._seq))
        msg = {"role": "tool", "tool_call_id": call.get("id", ""), "name": compaction_tool.NAME, "content": result}
        self._append_message(msg)
        return msg

    # ================================================================== the main loop
    def _add_messages(self, msgs: List[dict]):
        self._check_open()
        had_tool = False
        for i, m in enumerate(msgs):
            self._append_message(m)
            had_tool = had_tool or m["role"] == "tool"
            yield from self._drain()
            if m["role"] == "assistant" and m.get("tool_calls"):
                answered = {x.get("tool_call_id") for x in msgs[i + 1:] if x["role"] == "tool"}
                for c in m["tool_calls"]:
                    if compaction_tool.is_compact_call(c) and c["id"] not in answered:
                        self._run_compact_tool(c)
                        yield from self._drain()
            self._tick()
            yield from self._drain()
        if had_tool and probe_due(self.policy, after_tool_result=True):
            self._probe("tool_result")
            yield from self._drain()

    def _run(self, messages, max_tokens, tools, sampling, streaming):
        self._check_open()
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        msgs = _normalize_messages(messages)
        sampling = dict(sampling)
        for k in sampling:
            if k not in ("temperature", "top_p", "seed", "stop", "grammar"):
                raise TypeError(f"unknown sampling argument {k!r}")
        stop = sampling.pop("stop", None) or ()
        if isinstance(stop, str):
            stop = (stop,)
        stop = tuple(stop)
        new_tools = self._effective_tools(tools)
        self._pending.clear()
        self._n_calls += 1
        self._prefilled = 0
        completion = 0
        if new_tools != self._cur_tools:
            self._cur_tools = new_tools
            self._sync(lambda: self._render(self._views()))  # the tool header changed: re-render
        yield from self._add_messages(msgs)
        loops = 0
        while True:
            msg, finish, ntok = yield from self._turn(max_tokens, sampling, stop, streaming)
            completion += ntok
            calls = msg.get("tool_calls") or []
            compact_calls = [c for c in calls if compaction_tool.is_compact_call(c)]
            others = [c for c in calls if not compaction_tool.is_compact_call(c)]
            for c in compact_calls:
                self._run_compact_tool(c)
                yield from self._drain()
            if compact_calls and not others and loops < 3:
                loops += 1
                continue
            break
        out_msg = {"role": "assistant", "content": msg.get("content")}
        if others:
            out_msg["tool_calls"] = copy.deepcopy(others)
            finish = "tool_calls"
        self.last_response = {
            "id": f"chatcmpl-{self.session_id}-{self._n_calls}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": getattr(self.engine, "model_name", "local"),
            "choices": [{"index": 0, "message": out_msg, "finish_reason": finish}],
            "usage": {"prompt_tokens": self._prefilled, "completion_tokens": completion,
                      "total_tokens": self._prefilled + completion},
            "fill": self.fill,
        }
        yield from self._drain()

    def _turn(self, max_tokens: int, sampling: dict, stop: tuple, streaming: bool):
        """Generate one assistant message; returns ``(message, finish_reason, n_generated)``."""
        start = self._sync(lambda: self._render(self._views(), True))
        self._partial = _Partial(start[0], start[1], len(self._text), len(self._seq))
        yield from self._drain()
        p = self._partial
        finish = "length"
        shown = 0
        chunk = self.policy.chunk_tokens
        completed = False
        try:
            while len(p.tokens) < max_tokens:
                n = min(chunk, max_tokens - len(p.tokens))
                if not self._room_ok(len(self._seq) + n):
                    self._make_room(lambda: len(self._seq) + n)
                    if len(self._seq) + n > self.window:
                        n = self.window - len(self._seq) - 4  # leave room to close the turn
                        if n <= 0:
                            break
                yield from self._drain()
                self._tick()
                yield from self._drain()
                got: List[int] = []
                if streaming:
                    it = self._seq.stream(n, stop=stop, **sampling)
                    try:
                        for t in it:
                            got.append(t)
                            text = self._detok(p.tokens + got)
                            if text.endswith("\ufffd"):
                                continue
                            if len(text) > shown:
                                yield text[shown:]
                                shown = len(text)
                    finally:
                        close = getattr(it, "close", None)
                        if close is not None:
                            close()  # cancels the generation if we stopped early (tokens decoded stay)
                else:
                    got = list(self._seq.generate(n, stop=stop, **sampling))
                p.tokens.extend(got)
                self._text = self._text[:p.gen_char] + self._detok(p.tokens)
                self._gen_since_probe += len(got)
                gen_text = self._text[p.gen_char:]
                if len(got) < n or (stop and any(s in gen_text for s in stop)):
                    finish = "stop"
                    break
                if probe_due(self.policy, generated_since_probe=self._gen_since_probe):
                    self._probe("interval")
                    yield from self._drain()
            completed = True
        finally:
            if not completed and self._partial is p:
                # the stream was closed early or the engine failed: keep what was generated (tokens already
                # decoded stay in the sequence) and close the turn, so the session stays consistent
                try:
                    p.tokens = self._seq.tokens[p.gen_tok:]
                    self._text = self._text[:p.gen_char] + self._detok(p.tokens)
                    self._close_turn(p, stop)
                except Exception:  # noqa: BLE001 - best effort; the original error propagates
                    pass
        raw = self._text[p.gen_char:]
        if streaming and len(raw) > shown:
            yield raw[shown:]
        msg = self._close_turn(p, stop)
        yield from self._drain()
        if probe_due(self.policy, generated_since_probe=self._gen_since_probe):
            self._probe("interval")
            yield from self._drain()
        self._tick()
        yield from self._drain()
        return msg, finish, len(p.tokens)

    def _close_turn(self, p: _Partial, stop: tuple) -> dict:
        """The generated reply becomes a live message (the template's end-of-turn tokens appended)."""
        raw = self._text[p.gen_char:]
        content = raw
        if stop:
            cut = min((raw.find(s) for s in stop if s in raw), default=-1)
            if cut >= 0:
                content = raw[:cut]
        parsed_content, calls = parse_tool_calls(content, self._cur_tools)
        msg = {"role": "assistant", "content": parsed_content if calls else content}
        if calls:
            msg["tool_calls"] = calls
        view = {"role": "assistant", "content": raw}
        self._append_message(msg, view, from_partial=True)
        return msg


__all__ = ["Session", "ContextWindowError"]
