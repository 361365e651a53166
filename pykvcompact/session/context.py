"""The live context: one sequence, its rendered text, the live messages and the reply being generated.

Its one invariant: the sequence's tokens are the tokenized render of the live messages (plus the reply
being generated).  Rendering is incremental: a new message is rendered with the whole list and only the
difference from the previous render is tokenized and appended.  If the template re-renders an earlier
part differently (Qwen merges consecutive tool results into one turn), the sequence is cut back to the
last message start that is a token boundary and the rest is re-appended.  No policy, no events.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..chat.template import common_prefix_len, is_safe_cut
from ..compaction.cut_rules import MsgInfo, choose_cut
from ..engine.port import engine_errors


class Entry:
    """One live message: the message, what the template sees, its transcript index, where it starts."""
    __slots__ = ("msg", "view", "tidx", "summary", "start_char", "start_tok")

    def __init__(self, msg, view, tidx, summary=False, start_char=0, start_tok=None):
        self.msg, self.view, self.tidx, self.summary = msg, view, tidx, summary
        self.start_char, self.start_tok = start_char, start_tok

    def __repr__(self):
        return f"Entry({self.msg.get('role')}, tidx={self.tidx}, char={self.start_char}, tok={self.start_tok})"


@dataclass
class Partial:
    """The assistant reply being generated: where it starts (before the generation prompt) and where its
    generated text starts."""
    start_char: int
    start_tok: Optional[int]
    gen_char: int
    gen_tok: int
    tokens: List[int] = field(default_factory=list)


class Context:
    def __init__(self, engine, template, tools: Optional[List[dict]]):
        self.engine = engine
        self.template = template
        self.tools = tools
        self.seq = engine.sequence()
        self.n = 0                         # len(seq), tracked here: asking the engine waits for its next step
        self.text = ""
        self.entries: List[Entry] = []
        self.partial: Optional[Partial] = None
        self.n_prefix = 0
        self.lost: Optional[List[int]] = None   # tokens the sequence must hold again (heal), after a failed swap
        self.prefilled = 0                 # tokens appended by syncs (prompt tokens of the current call)
        self.on_truncate: Callable[[int], None] = lambda n: None

    # ------------------------------------------------------------------ tokens and text
    def tok(self, text: str) -> List[int]:
        return self.engine.tokenize(text, add_special=False, parse_special=True) if text else []

    def detok(self, toks) -> str:
        return self.engine.detokenize(toks) if toks else ""

    def __len__(self) -> int:
        return self.n

    def views(self) -> List[dict]:
        return [e.view for e in self.entries]

    def render(self, views: Optional[List[dict]] = None, add_generation_prompt: bool = False) -> str:
        return self.template.render(self.views() if views is None else views, self.tools, add_generation_prompt)

    # ------------------------------------------------------------------ positions
    def end_tok(self) -> int:
        """Token offset where the complete messages end (the partial reply starts there)."""
        if self.partial is not None and self.partial.start_tok is not None:
            return self.partial.start_tok
        return self.n

    def cut_token(self, cut: int) -> int:
        return self.entries[cut].start_tok if cut < len(self.entries) else self.end_tok()

    def cut_character(self, cut: int) -> int:
        if cut < len(self.entries):
            return self.entries[cut].start_char
        return self.partial.start_char if self.partial is not None else len(self.text)

    def prefix_tok(self) -> int:
        # the first message after the prefix may start inside a token (its text merged with the prefix's
        # end): count the prefix up to the next token boundary, an upper bound of what it keeps
        for e in self.entries[self.n_prefix:]:
            if e.start_tok is not None:
                return e.start_tok
        return self.end_tok()

    def prefix_char(self) -> int:
        return self.cut_character(self.n_prefix)

    def msg_infos(self) -> List[MsgInfo]:
        out, pending = [], []
        end = self.end_tok()
        for i, e in enumerate(self.entries):
            m = e.msg
            if m.get("role") == "user":
                pending.clear()  # calls nobody answered before the user spoke again are abandoned, not open
            for c in m.get("tool_calls") or []:
                pending.append(c.get("id"))
            if m.get("role") == "tool" and pending:
                tid = m.get("tool_call_id")
                pending.remove(tid if tid in pending else pending[0])
            nxt = next((x.start_tok for x in self.entries[i + 1:] if x.start_tok is not None), end)
            size = 0 if e.start_tok is None else max(0, nxt - e.start_tok)
            out.append(MsgInfo(m["role"], size, bool(m.get("tool_calls")), e.summary, cut_ok=e.start_tok is not None,
                               open_after=bool(pending)))
        return out

    def choose_cut(self, keep_recent: int, min_span: int) -> Optional[int]:
        if len(self.entries) <= self.n_prefix or self.entries[self.n_prefix].start_tok is None:
            return None
        return choose_cut(self.msg_infos(), self.n_prefix, keep_recent, min_span=min_span,
                           extra_tail=self.n - self.end_tok())

    # ------------------------------------------------------------------ incremental rendering
    def _plan(self, new_text: str) -> Tuple[int, int, int]:
        """How to make the sequence represent text ``new_text``: ``(cut_char, cut_tok, common)``: cut back to
        ``cut_tok`` (= text ``new_text[:cut_char]``), append ``new_text[cut_char:]``; ``common`` the common prefix."""
        old_text = self.text
        common = common_prefix_len(old_text, new_text)
        if common == len(old_text) and is_safe_cut(new_text, common):
            return len(old_text), self.n, common
        cands = [(0, 0)]
        for e in self.entries:
            if e.start_tok is not None and e.start_char <= common:
                cands.append((e.start_char, e.start_tok))
        p = self.partial
        if p is not None and p.start_tok is not None and p.start_char <= common:
            cands.append((p.start_char, p.start_tok))
        best = max((x for x in cands if is_safe_cut(new_text, x[0])), key=lambda x: x[0])
        return best[0], best[1], common

    def measure(self, new_text: str) -> int:
        """Live tokens once the sequence represents ``new_text``."""
        cut_char, cut_tok, _ = self._plan(new_text)
        return cut_tok + len(self.tok(new_text[cut_char:]))

    def _tokenize_region(self, new_text: str, cut_char: int, bounds: Sequence[int]):
        pts = sorted({b for b in bounds if cut_char < b < len(new_text) and is_safe_cut(new_text, b)})
        toks: List[int] = []
        at: Dict[int, int] = {cut_char: 0}
        prev = cut_char
        for b in pts + [len(new_text)]:
            toks.extend(self.tok(new_text[prev:b]))
            at[b] = len(toks)
            prev = b
        return toks, at

    def sync(self, new_text: str) -> Tuple[int, Optional[int]]:
        """Make the sequence represent ``new_text``. Returns ``(start_char, start_tok)`` of the new text (the common
        prefix of the old and new text; ``start_tok`` None when that is not a token boundary)."""
        cut_char, cut_tok, common = self._plan(new_text)
        bounds = [e.start_char for e in self.entries if e.start_char > cut_char] + [common]
        if self.partial is not None:
            bounds.append(self.partial.start_char)
        toks, at = self._tokenize_region(new_text, cut_char, bounds)
        if cut_tok < self.n:
            self.truncate(cut_tok)
        if toks:
            self.seq.append(toks)
            self.n += len(toks)
            self.prefilled += len(toks)
        for e in self.entries:  # re-map message starts inside the re-appended region
            if e.start_char > cut_char:
                e.start_tok = (cut_tok + at[e.start_char]) if e.start_char in at else None
        p = self.partial
        if p is not None and p.start_char > cut_char:
            p.start_tok = (cut_tok + at[p.start_char]) if p.start_char in at else None
        self.text = new_text
        if common == cut_char:
            return common, cut_tok
        return common, ((cut_tok + at[common]) if common in at else None)

    def add(self, msg: dict, view: dict, tidx: int, *, summary: bool = False, from_partial: bool = False) -> Entry:
        """Render ``msg`` after the live messages and append the difference.  ``from_partial``: the reply
        just generated; it becomes a live entry even if appending its end-of-turn tokens fails (its
        tokens are already in the sequence; the next sync appends what is missing)."""
        p = self.partial if from_partial else None
        try:
            s = self.sync(self.render(self.views() + [view]))
        except BaseException:
            if p is None:
                raise
            self.partial = None
            self.entries.append(Entry(msg, view, tidx, summary, p.start_char, p.start_tok))
            raise
        if p is not None:
            s = (p.start_char, p.start_tok)
            self.partial = None
        e = Entry(msg, view, tidx, summary, s[0], s[1])
        self.entries.append(e)
        return e

    def truncate(self, n: int) -> None:
        self.on_truncate(n)
        try:
            self.seq.truncate(n)
        except engine_errors():  # recurrent models cannot cut a tail: rebuild the sequence
            self.replace_sequence(self.engine.sequence(self.seq.tokens[:n]))
        self.n = n

    def replace_sequence(self, new_seq) -> None:
        """Swap in ``new_seq`` (created first by the caller), then close the old one."""
        old, self.seq = self.seq, new_seq
        self.n = len(new_seq)
        try:
            old.close()
        except Exception:  # noqa: BLE001 - the old sequence is gone either way
            pass

    # ------------------------------------------------------------------ replies
    def begin_reply(self) -> Partial:
        start = self.sync(self.render(add_generation_prompt=True))
        self.partial = Partial(start[0], start[1], len(self.text), self.n)
        return self.partial

    def reply_tokens(self, got: List[int]) -> None:
        p = self.partial
        p.tokens.extend(got)
        self.n += len(got)
        self.text = self.text[:p.gen_char] + self.detok(p.tokens)

    def resync_reply(self) -> None:
        """After an interrupted generation: the reply is what the sequence holds past its start."""
        p = self.partial
        p.tokens = self.seq.tokens[p.gen_tok:]
        self.n = p.gen_tok + len(p.tokens)
        self.text = self.text[:p.gen_char] + self.detok(p.tokens)

    def reply_text(self) -> str:
        return self.text[self.partial.gen_char:] if self.partial is not None else ""

    # ------------------------------------------------------------------ after a swap
    def span(self, cut: int) -> Tuple[int, int, int, int]:
        """``(prefix_tok, cut_token, prefix_char, cut_character)`` of ``entries[n_prefix:cut]``."""
        return self.prefix_tok(), self.cut_token(cut), self.prefix_char(), self.cut_character(cut)

    def replaced(self, cut: int, span: Tuple[int, int, int, int], entry: Optional[Entry], r_text: str,
                 n_repl: int) -> None:
        """``entries[n_prefix:cut]`` (at ``span``, taken before the swap) were replaced in the sequence by
        ``r_text`` (``n_repl`` tokens) and ``entry`` (the summary, or None for a drop): shift what follows."""
        prefix_tok, cut_token, prefix_char, cut_character = span
        d_tok, d_char = prefix_tok + n_repl - cut_token, prefix_char + len(r_text) - cut_character
        self.text = self.text[:prefix_char] + r_text + self.text[cut_character:]
        for e in self.entries[cut:]:
            e.start_char += d_char
            if e.start_tok is not None:
                e.start_tok += d_tok
        p = self.partial
        if p is not None:
            p.start_char += d_char
            p.gen_char += d_char
            p.gen_tok += d_tok
            if p.start_tok is not None:
                p.start_tok += d_tok
        head = self.entries[:self.n_prefix]
        if entry is not None:
            entry.start_char, entry.start_tok = prefix_char, prefix_tok
            head.append(entry)
        self.entries = head + self.entries[cut:]

    def heal(self) -> None:
        """Give the sequence back the tokens a failed in-place swap could not restore (``lost``), before
        anything else uses it; EngineError, and ``lost`` kept for the next call, while the engine still
        fails."""
        if self.lost is None:
            return
        old, have = self.lost, self.seq.tokens
        keep = next((i for i, (a, b) in enumerate(zip(old, have)) if a != b), min(len(old), len(have)))
        try:
            self.seq.truncate(keep)
            self.seq.append(old[keep:])
        except Exception as e:  # noqa: BLE001 - the engine still fails: say so, try again next call
            from ..errors import EngineError
            raise EngineError(f"the live context could not be rebuilt after a failed compaction ({e}); the "
                              "session keeps its messages: call again once the engine works") from e
        self.n, self.lost = len(self.seq), None

    def close(self) -> None:
        try:
            self.seq.close()
        except Exception:  # noqa: BLE001
            pass


__all__ = ["Context", "Entry", "Partial"]
