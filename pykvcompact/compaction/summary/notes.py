"""Notes the model writes in the background, right after a tool result: which lines of that output the task
will need later, copied verbatim.

A small model cannot condense a long history into a summary on a deadline, but right after a tool result it
can point at the lines of that output that matter to the task, when the request quotes the task (the first
user message, clipped): without it Qwen2.5-Coder-1.5B copied a config's first lines (0 of 4 notes held the
asked keys in ``bench/notes.py``; 3 of 4 with it).  The note is written on a fork of
the live sequence (only the short request is prefilled; the output is already in the KV cache), by the engine
thread in background rows next to the conversation's decoding, and the fork is dropped when it is done.  A
grammar allows only the heads of that output's lines (``heads``), so the model chooses and cannot misquote;
what names no line (a backend that ignores grammars) is discarded.  When a summary replaces the span, the note takes the
place of the structural excerpt of that output (``results.py``), with the priority of the assistant's own
statements: what is kept of a long output is then what the model chose, not its last line.

Only in ``background`` mode (a synchronous mode would wait for it); ``Policy(notes=False)`` turns it off.
At most one note is written at a time; up to ``MAX_WAITING`` outputs wait their turn (an older one beyond
that is ``note_skipped`` superseded).  An output that is no longer the newest message when its turn comes
(the reply, or the next call, followed it) is noted on a fork of the sequence cut right after it, so "the
tool output above" is still that output; where the engine cannot fork a prefix (recurrent models) it is
skipped (moved_on), where the next message starts inside a token (no_cut), and one a swap replaced before
its turn is skipped too (gone).  A note goes on through a
swap unless the pool lacks the cells its fork of the old sequence holds (``note_skipped`` no_room).
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional

from ... import events as ev
from ...errors import UnsupportedOperationError
from ...engine.port import engine_errors, free_cells

NOTE_REQUEST = ("Which lines of the tool output above will the task need later? Copy them exactly, one per line, "
                "most important first.")
# the task, quoted (the first user message, clipped): a small model otherwise copies the output's first lines
NOTE_REQUEST_WITH_TASK = ("The task: \"{task}\"\nWhich lines of the tool output above does this task need? Copy "
                          "them exactly, one per line, most important first.")
TASK_CHARS = 300   # of the first user message quoted in the request


def note_request(task: str = "") -> str:
    """The request after a tool output: with the task quoted when there is one."""
    task = " ".join((task or "").split())
    if not task:
        return NOTE_REQUEST
    if len(task) > TASK_CHARS:
        task = task[: TASK_CHARS // 2].rstrip() + " … " + task[-TASK_CHARS // 2:].lstrip()
    return NOTE_REQUEST_WITH_TASK.format(task=task.replace('"', "'"))
MAX_LINES = 3          # lines one note may copy
MAX_WAITING = 2        # outputs waiting for their note while one is written
MAX_NOTE_TOKENS = 64   # tokens it may write
MIN_OUTPUT_LINES = 3   # a shorter output is listed whole by the summary anyway: no note
MAX_CHOICES = 120      # lines of one output offered to the grammar (the first ones, deduplicated)
MAX_LINE_CHARS = 200   # a longer line is not offered (a page of data, not a fact)
MIN_HEAD_CHARS = 12    # the shortest head the grammar offers for a line (heads())


def _literal(text: str) -> str:
    """A GBNF string literal of ``text``: quotes and backslashes escaped, control characters as \\xNN."""
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\x{ord(c):02X}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:   # a lone surrogate: no token sequence spells it
        return False


def choices(content: str) -> List[str]:
    """The lines of a tool output a note may copy: non-empty, not too long, each once, in order; a line
    without a letter or a digit (a brace, a fence, a rule) is syntax, not something to note."""
    seen: Dict[str, None] = {}
    for line in content.split("\n"):
        s = line.strip()
        if (s and len(s) <= MAX_LINE_CHARS and s not in seen and _encodable(s)
                and any(c.isalnum() for c in s)):
            seen[s] = None
            if len(seen) >= MAX_CHOICES:
                break
    return list(seen)


def heads(lines: List[str]) -> Dict[str, str]:
    """Each line's shortest prefix of whole words, at least ``MIN_HEAD_CHARS`` long, that no other line
    starts with -> the line.  The grammar offers these heads: the model chooses a line in a few tokens and
    the session copies the rest.  A full-line grammar spent most of a note's tokens copying what was already
    decided, and a note cut at ``MAX_NOTE_TOKENS`` mid-line kept nothing of that line (``bench/notes.py
    --families``: 50 tokens and 3.7 s per note against 11 and 1.9 s, Qwen2.5-Coder-1.5B)."""
    out: Dict[str, str] = {}
    for line in lines:
        words, head = line.split(" "), line
        for k in range(1, len(words)):
            h = " ".join(words[:k])
            if not words[k - 1]:
                continue   # a head ending in padding (aligned columns): the model's line is read stripped
            if len(h) >= MIN_HEAD_CHARS and not any(o != line and o.startswith(h) for o in lines):
                head = h
                break
        out.setdefault(head, line)
    return out


def grammar(lines: List[str], most: int = MAX_LINES) -> str:
    """GBNF: one to ``most`` of ``lines``, one per line (each exactly as given)."""
    alts = " | ".join(_literal(x) for x in lines)
    return f'root ::= line ("\\n" line){{0,{most - 1}}}\nline ::= {alts}\n'


def noted_lines(text: str, offered) -> List[str]:
    """The lines of the output the model's note names, each once, at most MAX_LINES: ``offered`` is the
    lines themselves, or :func:`heads` (a head -> its whole line; a whole line is taken too, from a
    backend that ignores the grammar)."""
    if isinstance(offered, dict):
        whole = {line: line for line in offered.values()}
        whole.update({head.strip(): line for head, line in offered.items()})
    else:
        whole = {x: x for x in offered}
    out: List[str] = []
    for raw in (text or "").split("\n"):
        line = whole.get(raw.strip())
        if line is not None and line not in out:
            out.append(line)
    return out[:MAX_LINES]


class _Writing:
    def __init__(self, tidx: int, fork, jobs, lines: Dict[str, str], prompt_tokens: int):
        self.tidx, self.fork, self.jobs, self.lines, self.prompt_tokens = tidx, fork, jobs, lines, prompt_tokens
        self.t0 = time.perf_counter()


class NoteTaker:
    """``tool_result(tidx)`` after a tool result joined the live context; ``poll()`` between steps;
    ``notes``: transcript index of a tool result -> the lines its note copied."""

    def __init__(self, ctx, emit: Callable[[ev.Event], None], enabled: bool,
                 record: Callable[[int, List[str]], None] = lambda tidx, lines: None,
                 task: Callable[[], str] = lambda: ""):
        self.ctx, self.emit, self.enabled, self.record, self.task = ctx, emit, enabled, record, task
        self.notes: Dict[int, List[str]] = {}
        self._writing: Optional[_Writing] = None
        self._waiting: List[int] = []

    def tool_result(self, tidx: int, msg: dict) -> None:
        content = msg.get("content")
        if not self.enabled or not isinstance(content, str) or msg.get("recall"):
            return
        if len(choices(content)) < MIN_OUTPUT_LINES:
            return
        self._waiting.append(tidx)
        while len(self._waiting) > MAX_WAITING:   # newer outputs came before the oldest one's note could start
            self.emit(ev.NoteSkipped(self._waiting.pop(0), "superseded"))
        self.poll()

    def poll(self) -> None:
        w = self._writing
        if w is not None:
            if not all(j.done() for j in w.jobs):
                return
            self._finish(w)
        while self._waiting and self._writing is None and self.enabled:
            self._start(self._waiting.pop(0))

    @property
    def writing(self) -> bool:
        return self._writing is not None

    def close(self, reason: str = "") -> None:
        """Cancel the note in progress and free its fork.  ``reason`` (said in a ``note_skipped`` event): after
        a swap the pool lacks the cells its fork of the old sequence holds; the outputs waiting their turn
        keep it (they are noted on the new sequence while they are live).  No reason: the session closes,
        and nothing waits any more."""
        w, self._writing = self._writing, None
        if not reason:
            self._waiting = []
        if w is not None and reason:
            self.emit(ev.NoteSkipped(w.tidx, reason))
        if w is not None:
            for j in w.jobs:
                try:
                    j.cancel()
                except Exception:  # noqa: BLE001 - a finished or failed job
                    pass
            self._free(w.fork)

    # ------------------------------------------------------------------ internals
    def _cut(self, tidx: int):
        """Where the note of the output at ``tidx`` forks: ``(entry index, char, token)``; token None: the
        output is the newest message (fork the whole sequence).  A string: why it cannot be noted."""
        ctx = self.ctx
        k = next((i for i in range(len(ctx.entries) - 1, -1, -1) if ctx.entries[i].tidx == tidx), None)
        if k is None or ctx.entries[k].summary:
            return "gone"          # a swap replaced it before its turn
        if k == len(ctx.entries) - 1 and ctx.partial is None:
            return k, len(ctx.text), None
        after = ctx.entries[k + 1] if k + 1 < len(ctx.entries) else ctx.partial
        if after.start_tok is None:
            # the next message starts inside a token (Qwen's template joins consecutive tool results in one
            # turn): there is no clean place to cut the sequence right after this output
            return "no_cut"
        return k, after.start_char, after.start_tok

    def _start(self, tidx: int) -> None:
        ctx = self.ctx
        cut = self._cut(tidx)
        if isinstance(cut, str):
            self.emit(ev.NoteSkipped(tidx, cut))
            return
        k, cut_char, cut_tok = cut
        lines = heads(choices(ctx.entries[k].msg.get("content") or ""))
        q = {"role": "user", "content": note_request(self.task())}
        text = ctx.render(ctx.views()[:k + 1] + [q], True)
        if not text.startswith(ctx.text[:cut_char]):
            # a template that re-renders earlier turns: the note would need a full prefill
            self.emit(ev.NoteSkipped(tidx, "template"))
            return
        toks = ctx.tok(text[cut_char:])
        if len(toks) + MAX_NOTE_TOKENS + 16 > free_cells(ctx.engine):
            self.emit(ev.NoteSkipped(tidx, "no_room"))
            return
        fork = None
        try:
            if cut_tok is None:
                fork = ctx.seq.fork()
            else:
                try:
                    fork = ctx.seq.fork(cut_tok)
                except UnsupportedOperationError:   # no prefix forks (recurrent models): only the newest
                    self.emit(ev.NoteSkipped(tidx, "moved_on"))
                    return
            jobs = [fork.append_background(toks)]
            jobs.append(fork.generate_background(MAX_NOTE_TOKENS, temperature=0.0, stop=["\n\n"],
                                                 grammar=grammar(list(lines))))
        except UnsupportedOperationError as e:   # a backend without grammars: no notes for this session
            self._free(fork)
            self.enabled = False
            self.emit(ev.NoteSkipped(tidx, f"unsupported: {e}"))
            return
        except engine_errors() + (TypeError, ValueError) as e:
            self._free(fork)
            self.emit(ev.NoteSkipped(tidx, f"failed: {e}"))
            return
        self._writing = _Writing(tidx, fork, jobs, lines, len(toks))

    def _finish(self, w: _Writing) -> None:
        self._writing = None
        gen = w.jobs[-1]
        try:
            text = self.ctx.detok(list(gen.result(timeout=0)))
        except Exception as e:  # noqa: BLE001 - a failed job: no note
            self._free(w.fork)
            self.emit(ev.NoteSkipped(w.tidx, f"failed: {e}"))
            return
        self._free(w.fork)
        kept = noted_lines(text, w.lines)
        ms = (time.perf_counter() - w.t0) * 1000.0
        if not kept:
            self.emit(ev.NoteSkipped(w.tidx, "empty"))
            return
        self.notes[w.tidx] = kept
        self.record(w.tidx, kept)
        self.emit(ev.Noted(w.tidx, kept, w.prompt_tokens, len(gen.tokens), ms))

    @staticmethod
    def _free(fork) -> None:
        if fork is None:
            return
        try:
            fork.close()
        except Exception:  # noqa: BLE001 - a closed engine
            pass


__all__ = ["NoteTaker", "NOTE_REQUEST", "NOTE_REQUEST_WITH_TASK", "note_request", "choices", "heads", "grammar",
           "noted_lines"]
