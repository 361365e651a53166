"""Recall: what a new message asks about, when the offloaded history answers it better than the live
context does, is placed back before the reply.

A model rarely calls ``search_history`` by itself: asked "What is max_pool_size in services/auth/config.toml?"
long after that file's listing was compacted away, it answers from what it sees.  So the session looks
first.  When a user message, or an agent's tool call (its arguments), names a thing — by its *syntax*
(``names.py``): a
path or dotted name (``services/auth/config.toml``), an identifier with an underscore, a digit or inner
capitals (``max_pool_size``, ``ACC-1042``, ``build_77``, ``getUserById``), a number of three or more
digits, a quoted string, a proper noun of several capitalised words (``Eastholm County Council``) — that
the offloaded messages hold, the session ranks the lines of the offloaded history *and* of the live context
with the ``search_history`` ranking (``history_search.py``: BM25-idf over lines, a tool result's lines also
matched by their call's arguments) for those names and the other words of the messages that named them.
Only lines about a name count (they match one of its terms), and never the agent's own call lines (what
it asked for, not what it learned).  The offloaded lines that rank above the best live line and that the
live context does not already show (as a line, in a summary's listing, as an excerpt) are added, best
first, within a small token budget, as one lookup before the model's reply::

    {"role": "tool", "name": "search_history", "recall": True,
     "content": "Recalled from the offloaded history (search_history found these lines for max_pool_size):\\n..."}

Why compare with the live context rather than ask "is the name visible": the live context usually shows
the name (a summary lists the call that read the file, a later page names the same place) but not the value
next to it; a name being visible says nothing about whether the fact is.  Lines the user wrote do not set
the bar: they are where a question comes from, not its answer (a summary quotes them verbatim).

Why a ``tool`` message named ``search_history``: it is what the tool returns, so the model reads it as a
lookup and not as something the user said (a summary keeps the user's messages verbatim, by role; a tool
output is never one of them), later searches skip it (they would echo its lines ahead of the originals),
and a cut never separates it from the message it follows (no cut lands before a tool message).  The
``recall`` flag marks it for everything else (``results.py`` does not list it as a tool's output).

What is never done: deciding by wording.  No list of words that "matter" — a plain word ("total",
"config", "failed") is not a name, whatever it means, and a message that names nothing recalls nothing.
With nothing offloaded the scan is not even run; when the live context holds evidence clearly better than
the offloaded lines, nothing is added and no event is emitted.  Not sources: an offloaded call that a
later identical call repeated (same tool, same arguments) and its results — the newer result supersedes
them (as ``results.py`` does).  The recall waits while a tool call at the end of the context has no result
yet (it never sits between a call and its results), and is skipped when the template cannot render it or
the window has no room for it.
"""
from __future__ import annotations

import json
import re
from typing import Callable, Iterable, List, Optional, Sequence, Set, Tuple

from .. import events as ev
from .tools import history_search
from ..chat.messages import ContextWindowError, view_of
from .names import FLAG, clip_scan, names_in, text_of

HEADER = "Recalled from the offloaded history (search_history found these lines for {names}):"
MAX_TOKENS = 256          # the default budget: min(MAX_TOKENS, window // WINDOW_SHARE), at least MIN_TOKENS
WINDOW_SHARE = 12
MIN_TOKENS = 48           # the header and one short line
MAX_NAMES = 8             # names recalled at once (the first ones named)
MAX_CANDIDATES = 32       # names checked against the context per call (a pasted log names hundreds)
NAME_SHOWN = 48           # characters of a name quoted in the header

def default_budget(window: int) -> int:
    return max(MIN_TOKENS, min(MAX_TOKENS, window // WINDOW_SHARE))


def _visible_pattern(name: str) -> "re.Pattern":
    """``name`` as a whole token (not part of a longer word), case-insensitive, spaces as any whitespace."""
    body = r"\s+".join(re.escape(p) for p in name.split())
    return re.compile(r"(?<!\w)" + body + r"(?!\w)", re.IGNORECASE)


def open_calls(messages: Sequence[dict]) -> bool:
    """Does a tool call in ``messages`` still wait for its result at their end?  (A recall placed there
    would sit between a call and its result.)"""
    pending: List = []
    for m in messages:
        if m.get("role") == "user":
            pending.clear()   # calls nobody answered before the user spoke again are abandoned
        for c in m.get("tool_calls") or []:
            pending.append(c.get("id"))
        if m.get("role") == "tool" and pending:
            tid = m.get("tool_call_id")
            if tid in pending:
                pending.remove(tid)
            elif not m.get(FLAG):   # a result without a known id answers the oldest call; a recall never does
                pending.pop(0)
    return bool(pending)


class Recall:
    """Collects the names of the messages a call adds (:meth:`note`) and, before the reply, adds one recall
    message for those the offloaded history holds and the live context lacks (:meth:`run`)."""

    def __init__(self, ctx, transcript, budget: int, emit: Callable[[ev.Event], None],
                 append: Callable[[dict], object], window: int, search_offered: Callable[[], bool]):
        self.ctx, self.transcript, self.budget, self.emit, self.append = ctx, transcript, budget, emit, append
        self.window, self.search_offered = window, search_offered
        self.names: List[str] = []          # named since the last recall, in order
        self.naming: Set[int] = set()       # id() of the messages that named them (not "the live context")
        self.texts: List[str] = []          # what those messages said (the search's other words)
        self.repeats: Set[str] = set()      # the calls they made (an earlier identical call is no source)
        self._off_key: Optional[Tuple[int, int]] = None
        self._off_text = ""
        self._off_pairs: List[Tuple[int, dict]] = []
        self._off_lower = ""
        self._off_lines: list = []          # history_search.corpus of the offloaded pairs
        self.lines: list = []               # ... of those the current recall searches (_sources)
        self._stale_key: Optional[Tuple[int, int]] = None
        self._stale: Set[int] = set()

    # ------------------------------------------------------------------ collecting
    def note(self, msgs: Iterable[dict], skip_calls: Callable[[dict], bool] = lambda c: False) -> None:
        """Remember what ``msgs`` (just added, or just generated) name.  Nothing is scanned while nothing
        is offloaded, nor with a zero budget."""
        if self.budget <= 0 or not self.transcript.offloaded:
            return
        for m in msgs:
            try:
                text = text_of(m, skip_calls)
                found = names_in(text)
            except (TypeError, ValueError, AttributeError):   # a message of an unexpected shape: no names
                text, found = "", []
            if found:
                self.naming.add(id(m))
                self.texts.append(clip_scan(text))
                self.repeats.update(_signature(c) for c in (m.get("tool_calls") or []) if not skip_calls(c))
                have = {n.lower() for n in found}
                # the newest names count most (a question after a pasted log names its things last)
                self.names = [n for n in self.names if n.lower() not in have] + found[-MAX_CANDIDATES:]
        del self.names[:-MAX_CANDIDATES]
        del self.texts[:-MAX_NAMES]

    def clear(self) -> None:
        self.names, self.naming, self.texts, self.repeats = [], set(), [], set()

    # ------------------------------------------------------------------ recalling
    def run(self, then: Sequence[dict] = ()) -> Optional[dict]:
        """Add the recall message for the names noted, when some are missing from the live context and in
        the offloaded history; returns it (``None`` when nothing was recalled).  Waits (keeps the names)
        while a tool call at the end of the context has no result yet.  ``then``: messages that will follow
        the recall (the rest of the batch): it is added only if they fit after it in the window."""
        if not self.names:
            return None
        if self.budget <= 0 or not self.transcript.offloaded:
            self.clear()
            return None
        entries = self.ctx.entries
        if open_calls([e.msg for e in entries]):
            return None   # after the results (the next call), not between a call and its results
        names, naming, texts, repeats = self.names, self.naming, self.texts, self.repeats
        self.clear()
        named, pairs, live = self._sources(names, naming, entries, repeats)
        if not named:
            return None
        msg, shown, tokens = self._message(named, texts, pairs, live)
        while msg is None and len(named) > 1:   # a small budget: fewer names (the first ones named)
            named = named[:len(named) // 2]
            msg, shown, tokens = self._message(named, texts, pairs, live)
        if msg is None:
            return None
        missing = named
        # a well-formed lookup: the search_history call, then its result (a tool result with no call before
        # it is read as something to continue: Qwen2.5-Coder-1.5B answered two questions by repeating it)
        call_id = f"recall_{len(self.transcript.messages)}"
        call = {"role": "assistant", "content": None, FLAG: True, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": history_search.NAME, "arguments": json.dumps({"query": " ".join(missing)})}}]}
        msg["tool_call_id"] = call_id
        try:   # a template that cannot render the pair: no recall rather than a failed call
            text = self.ctx.render(self.ctx.views() + [call, msg] + [view_of(m) for m in then])
            if self.ctx.measure(text) > self.window:
                return None
        except Exception:  # noqa: BLE001 - jinja raises its own errors (raise_exception in the template)
            return None
        try:
            self.append(call)
        except ContextWindowError:   # no room even after compaction: the reply needs the window more
            return None
        self.append(msg)   # (its room was measured with the call)
        self.emit(ev.Recalled(list(missing), shown, tokens, len(self.ctx) / self.window))
        return msg

    def _offloaded(self) -> Tuple[List[Tuple[int, dict]], str]:
        """``(transcript index, message)`` of the searchable offloaded messages, and their text (cached
        until more are offloaded)."""
        off = self.transcript.offloaded
        key = (id(off), len(off))
        if key != self._off_key:
            where = {id(m): i for i, m in enumerate(self.transcript.messages)}
            self._off_pairs = [(where.get(id(m), -1), m) for m in off
                               if history_search.searchable(m) and not m.get(FLAG)]
            self._off_text = "\n".join(_text(m) for _, m in self._off_pairs)
            self._off_lower = self._off_text.lower()
            self._off_lines = history_search.corpus(self._off_pairs)
            self._off_key = key
        return self._off_pairs, self._off_text

    def _sources(self, names: Sequence[str], naming: Set[int], entries, repeats: Set[str] = frozenset()
                 ) -> Tuple[List[str], list, List[dict]]:
        """``(names, pairs, live)``: the names the offloaded history holds (each as a whole token,
        case-insensitive; those the live context does not show first; at most :data:`MAX_NAMES`), the
        offloaded ``(index, message)`` pairs to search, and the live messages they compete with (the tool
        schemas among them).  Not sources: a message that named them (offloaded since), and an earlier call
        identical to one they made (same tool, same arguments) with its results — a repeated call's new
        result supersedes them.  Not live: the messages that named them (they ask; they do not answer)."""
        pairs, off_text = self._offloaded()
        stale = self._superseded(pairs) | (_repeated(pairs, repeats) if repeats else set())
        self.lines = self._off_lines
        if stale or any(id(m) in naming for _, m in pairs):
            pairs = [(i, m) for i, m in pairs if id(m) not in naming and id(m) not in stale]
            off_text = "\n".join(_text(m) for _, m in pairs)
            kept = {id(m) for _, m in pairs}
            self.lines = [row for row in self._off_lines if id(row[1]) in kept]
        if not pairs:
            return [], pairs, []
        live = [e.msg for e in entries if id(e.msg) not in naming]
        if self.ctx.tools:
            live.append({"role": "system", "content": json.dumps(self.ctx.tools, ensure_ascii=False)})
        live_text = "\n".join(_text(m) for m in live)
        low = self._off_lower if off_text is self._off_text else off_text.lower()
        held = [n for n in names if n.lower() in low and _visible_pattern(n).search(off_text)]
        unseen = [n for n in held if not _visible_pattern(n).search(live_text)]
        return (unseen + [n for n in held if n not in unseen])[:MAX_NAMES], pairs, live

    def _superseded(self, pairs) -> Set[int]:
        """:func:`_superseded` of the transcript, cached until it grows or more is offloaded."""
        key = (len(self.transcript.messages), len(pairs))
        if key != self._stale_key:
            self._stale, self._stale_key = _superseded(self.transcript.messages, pairs), key
        return self._stale

    def _message(self, missing: List[str], texts: Sequence[str], pairs, live: Sequence[dict] = ()
                 ) -> Tuple[Optional[dict], int, int]:
        """The recall message for ``missing`` within the budget: ``(message, lines shown, tokens)``.  The
        search is the one ``search_history`` runs for a query of the missing names first, then the other
        words of the messages that named them, newest first (the search keeps the first
        ``history_search.MAX_TERMS`` terms, without stop words)."""
        count = self._count
        header = _header(missing, count, self.budget // 3)
        query = " ".join(list(missing) + list(reversed(texts)))
        more = ": search_history finds them)" if self.search_offered() else ": they are in the history file)"
        # the header replaces the result's intro (which the search counts in its budget)
        intro = f"Matches for {history_search.quote_query(query)} in the compacted messages (best first):"
        budget = self.budget - count(header) + count(intro)
        for _ in range(4):   # re-measured: the header and the footer's wording differ from the search's
            room = budget
            if room <= count(intro):
                return None, 0, 0
            text, shown = history_search.search_result(pairs, query, budget=room, count=count, context=live,
                                                       anchors=missing, lines_of_messages=self.lines)
            if not shown:
                return None, 0, 0
            lines = text.split("\n")[1:]   # the result's intro names the query: the header says it better
            if lines and lines[-1].startswith("(") and lines[-1].endswith(": refine the query)"):
                lines[-1] = lines[-1][: -len(": refine the query)")] + more
            content = "\n".join([header] + lines)
            tokens = count(content)
            if tokens <= self.budget:
                return {"role": "tool", "name": history_search.NAME, "content": content, FLAG: True}, shown, tokens
            budget -= tokens - self.budget
        return None, 0, 0

    def _count(self, text: str) -> int:
        return len(self.ctx.tok(text))


def _signature(call) -> str:
    """A call's tool and arguments (parsed when they are JSON: key order and spacing do not count)."""
    f = call.get("function", call) if isinstance(call, dict) else {}
    if not isinstance(f, dict):
        return ""
    args = f.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    try:
        return json.dumps([f.get("name"), args], sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr([f.get("name"), args])


def _repeated(pairs, repeats: Set[str], only: Optional[Set[int]] = None) -> Set[int]:
    """id() of the offloaded assistant messages whose calls are all among ``repeats`` (and, given ``only``,
    among those messages), and of their results."""
    out, ids = set(), set()
    for _, m in pairs:
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        if only is not None and id(m) not in only:
            calls = None
        if calls and isinstance(calls, list) and all(_signature(c) in repeats for c in calls):
            out.add(id(m))
            ids.update(c.get("id") for c in calls if isinstance(c, dict) and c.get("id"))
        elif m.get("role") == "tool" and m.get("tool_call_id") in ids:
            out.add(id(m))
    return out


def _superseded(transcript: Sequence[dict], pairs) -> Set[int]:
    """id() of the offloaded calls that a later identical call (same tool, same arguments) repeated, and of
    their results: the file was read again, the newer output is the one that holds (as in ``results.py``)."""
    later: Set[str] = set()
    repeated: List[dict] = []
    for m in reversed(transcript):
        calls = m.get("tool_calls") if isinstance(m, dict) and m.get("role") == "assistant" else None
        if not calls or not isinstance(calls, list) or m.get(FLAG):
            continue
        sigs = [_signature(c) for c in calls]
        if all(sig in later for sig in sigs):
            repeated.append(m)
        later.update(sigs)
    if not repeated:
        return set()
    return _repeated([(i, m) for i, m in pairs], {_signature(c) for m in repeated for c in m["tool_calls"]},
                     only={id(m) for m in repeated})


def _header(names: Sequence[str], count: Callable[[str], int], most: int) -> str:
    """The recall's first line, naming what it was for: as many of ``names`` as keep it within ``most``
    tokens (at least one), the others counted."""
    shown = [n if len(n) <= NAME_SHOWN else n[:NAME_SHOWN] + "..." for n in names]
    for k in range(len(shown), 0, -1):
        rest = f" and {len(shown) - k} more" if k < len(shown) else ""
        header = HEADER.format(names=", ".join(shown[:k]) + rest)
        if count(header) <= most or k == 1:
            return header
    return HEADER.format(names="")


def _text(msg: dict) -> str:
    try:
        return history_search.message_text(msg)
    except (TypeError, AttributeError, ValueError):
        return ""


__all__ = ["Recall", "FLAG", "HEADER", "default_budget", "open_calls"]
