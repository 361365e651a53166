"""A pure-Python stand-in for ``pykvcompact.Engine`` for fast session/policy logic tests.

It keeps the contract that matters to the session: one pool of ``n_ctx`` cells shared by every sequence
(a fork shares its parent's cells), ``n_seq_max`` slots, background jobs counted as background rows,
``prepare_rebase`` catching up with tokens appended later, EOG not appended.  Tokens are word pieces
(``\\w+``, whitespace runs, single punctuation) plus special tokens ``<|...|>``; the model's replies come
from a ``responder(prompt_text) -> str`` and probe probabilities from ``probe_fn(prompt_text) -> float``.
"""
from __future__ import annotations

import itertools
import re
from typing import Callable, Dict, List, Optional

from pykvcompact import errors

_TOK_RE = re.compile(r"<\|[^|<>\s]+\|>|\s+|\w+|[^\w\s]")
EOG_TEXT = "<|im_end|>"


_SUMMARIES = itertools.count(1)


def default_responder(prompt: str) -> str:
    last_user = prompt.rsplit("<|im_start|>user\n", 1)[-1]
    if "write a summary of the conversation" in last_user:
        # a new fact each time, or the session stops asking the model (compaction/summary/novelty.py)
        n = next(_SUMMARIES)
        # (written after the prefilled head: "Verified facts:\n-", or "Standing instructions:" when the
        # request lists user messages to copy: this model copies none of them)
        if "These user messages will not be kept" in last_user:
            return f" none\nVerified facts: {n} read.\nNext step: continue."
        return f" {n} read."
    if "Which lines of the tool output above" in last_user:   # (the request may quote the task first)
        # a note (compaction/summary/notes.py): the head the grammar offers for the output's second line
        from pykvcompact.compaction.summary.notes import choices, heads
        output = prompt.rsplit("<|im_start|>tool\n", 1)[-1].split("<|im_end|>", 1)[0]
        offered = heads(choices(output))
        return list(offered)[1] if len(offered) > 1 else ""
    n = prompt.count("<|im_start|>assistant")
    return f"Reply number {n}: noted and done."


class FakeJob:
    def __init__(self, tokens, finish_reason="stop", polls=0, error=None):
        self.tokens = list(tokens)
        self.finish_reason = finish_reason
        self.error = error
        self._polls = polls
        self.cancelled = False

    def done(self):
        if self._polls > 0:
            self._polls -= 1
            return False
        return True

    def result(self, timeout=None):
        if timeout is not None and self._polls > 0:  # a job that needs more engine steps than the wait allows
            import time
            time.sleep(min(timeout, 0.002))
            self._polls -= 1
            if self._polls > 0:
                raise TimeoutError(f"the job did not finish within {timeout} s")
        self._polls = 0
        if self.error:
            raise errors.EngineError(self.error)
        return list(self.tokens)

    def cancel(self):
        self.cancelled = True
        self._polls = 0


class FakeRebase:
    def __init__(self, seq, keep_prefix, replacement, keep_from, mode, slot_seq):
        self.sequence = seq
        self.keep_prefix, self.replacement, self.keep_from, self.mode = keep_prefix, list(replacement), keep_from, mode
        self._slot = slot_seq
        self.committed = False
        self.target_len_at_prepare = keep_prefix + len(replacement) + (len(seq.tokens) - keep_from)

    def done(self):
        return True

    def wait(self, timeout=None):
        return True

    def cancel(self):
        if self._slot is not None:
            self._slot.close()
            self._slot = None


class FakeSeq:
    def __init__(self, eng: "FakeEngine", tokens=(), cells=None):
        self.engine = eng
        self.id = next(eng._ids)
        eng._check_slot()
        self._tokens: List[int] = []
        self._cells: List[int] = list(cells or [])
        self.closed = False
        eng._seqs[self.id] = self
        if tokens:
            self.append(tokens)

    # -- reading
    @property
    def tokens(self):
        self._live()
        return list(self._tokens)

    def __len__(self):
        return len(self._tokens)

    def _live(self):
        if self.closed:
            raise errors.SequenceClosedError(f"sequence {self.id} is closed")

    def _grow(self, toks, kind):
        self._live()
        for t in toks:
            if not isinstance(t, int) or t < 0:
                raise ValueError(f"bad token {t!r}")
        self.engine._alloc(len(toks))
        self._tokens.extend(toks)
        self._cells.extend(next(self.engine._cell_ids) for _ in toks)
        self.engine.rows[kind] += len(toks)
        self.engine._check_cells()

    # -- writing
    def append(self, tokens):
        self._grow(list(tokens), "foreground")

    def append_background(self, tokens):
        self._grow(list(tokens), "background")
        return FakeJob(tokens, polls=self.engine.bg_polls)

    def _gen(self, max_tokens, stop, kind):
        self._live()
        text = self.engine.detokenize(self._tokens)
        head = "<|im_start|>assistant\n"
        k = text.rfind(head)
        base = text[:k + len(head)] if k >= 0 else text
        done = text[len(base):]  # a reply generated in earlier chunks: continue it
        reply = self.engine.responder(base)
        toks = self.engine.tokenize(reply + EOG_TEXT)
        if done and reply.startswith(done):
            toks = toks[len(self.engine.tokenize(done)):]
        out = []
        finish = "length"
        stop_strings = [s for s in (stop or ()) if isinstance(s, str)]
        for t in toks:
            if len(out) >= max_tokens:
                break
            if self.engine.is_eog(t):
                finish = "stop"
                break
            self._grow([t], kind)
            out.append(t)
            if stop_strings and any(s in self.engine.detokenize(out) for s in stop_strings):
                finish = "stop"
                break
        self.engine.generated[kind] += len(out)
        return out, finish

    def generate(self, max_tokens, *, temperature=0.0, top_p=1.0, seed=None, stop=(), grammar=None, top_k=0,
                 min_p=0.0):
        return self._gen(max_tokens, stop, "foreground")[0]

    def stream(self, max_tokens, **kw):
        toks = self.generate(max_tokens, **kw)
        yield from toks

    def generate_background(self, max_tokens, **kw):
        if self.engine.fail_background:
            return FakeJob([], finish_reason="error", error="injected")
        out, finish = self._gen(max_tokens, kw.get("stop", ()), "background")
        return FakeJob(out, finish_reason=finish, polls=self.engine.bg_polls)

    def fork(self, n=None):
        self._live()
        n = len(self._tokens) if n is None else n
        if not 0 <= n <= len(self._tokens):
            raise IndexError("fork past the end")
        if n < len(self._tokens) and not self.engine.can_fork_prefix:
            raise errors.UnsupportedOperationError("prefix forks are not supported by this model")
        s = FakeSeq(self.engine, cells=self._cells[:n])
        s._tokens = list(self._tokens[:n])
        self.engine.forks += 1
        return s

    def truncate(self, n):
        self._live()
        if n < 0 or n > len(self._tokens):
            raise IndexError("truncate past the end")
        del self._tokens[n:]
        del self._cells[n:]

    def probe(self, tokens, labels=("COMPRESS", "CONTINUE")):
        self._live()
        f = self.fork()
        try:
            f._grow(list(tokens), "probe")
            p = float(self.engine.probe_fn(self.engine.detokenize(f._tokens)))
        finally:
            f.close()
        self.engine.probes += 1
        return {labels[0]: p, labels[1]: 1.0 - p}

    def prepare_rebase(self, keep_prefix, replacement, keep_from, mode="exact"):
        self._live()
        if mode == "splice" and not self.engine.capabilities["can_shift"]:
            raise errors.UnsupportedOperationError("splice needs can_shift")
        if not (0 <= keep_prefix <= keep_from <= len(self._tokens)):
            raise ValueError("bad rebase range")
        slot = None
        if mode == "exact":
            # the shadow: shares the prefix cells, holds replacement + tail in new cells
            slot = FakeSeq(self.engine, cells=self._cells[:keep_prefix])
            slot._tokens = self._tokens[:keep_prefix]
            slot._grow(list(replacement) + self._tokens[keep_from:], "background")
        self.engine.rebases_prepared += 1
        rb = FakeRebase(self, keep_prefix, replacement, keep_from, mode, slot)
        # (as the engine: replacement tokens equal to the ones they replace are kept, not fed again)
        rb.reused = 0
        while (rb.reused < len(replacement) and keep_prefix + rb.reused < keep_from
               and self._tokens[keep_prefix + rb.reused] == list(replacement)[rb.reused]):
            rb.reused += 1
        return rb

    def commit_rebase(self, rb):
        self._live()
        before = len(self._tokens)
        new = self._tokens[:rb.keep_prefix] + rb.replacement + self._tokens[rb.keep_from:]
        catch = len(new) - rb.target_len_at_prepare
        if rb._slot is not None:
            shadow = rb._slot
            # catch up the shadow with the tokens appended since the preparation
            extra = new[len(shadow._tokens):]
            if extra:
                shadow._grow(extra, "foreground")
            self._tokens, self._cells = shadow._tokens, shadow._cells
            shadow._tokens, shadow._cells = [], []
            shadow.close()
            rb._slot = None
        else:
            self._tokens = new
            self._cells = self._cells[:rb.keep_prefix] + [next(self.engine._cell_ids) for _ in rb.replacement] + \
                self._cells[rb.keep_from:]
        self.engine.commits += 1
        rb.committed = True
        return {"mode": rb.mode, "tokens_before": before, "tokens_after": len(self._tokens), "stall_ms": 0.01,
                "catch_up_tokens": max(0, catch), "reused_tokens": getattr(rb, "reused", 0)}

    def close(self):
        if not self.closed:
            self.closed = True
            self.engine._seqs.pop(self.id, None)


class FakeEngine:
    def __init__(self, n_ctx=4096, n_seq_max=8, responder: Optional[Callable[[str], str]] = None,
                 probe_fn: Optional[Callable[[str], float]] = None, chat_template: Optional[str] = None,
                 can_shift=True, bg_polls=0, tokenizer=None):
        self.tokenizer = tokenizer  # a real pk.Engine: its tokenizer, fake sequences (no decoding)
        self._vocab: Dict[str, int] = {}
        self._pieces: List[str] = []
        self._ids = itertools.count()
        self._cell_ids = itertools.count()
        self._seqs: Dict[int, FakeSeq] = {}
        self.responder = responder or default_responder
        self.probe_fn = probe_fn or (lambda text: 0.1)
        self.chat_template = chat_template
        self.capabilities = {"n_ctx": n_ctx, "n_seq_max": n_seq_max, "can_shift": can_shift, "recurrent": False}
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max
        self.rows = {"foreground": 0, "background": 0, "probe": 0}
        self.generated = {"foreground": 0, "background": 0}
        self.max_used = 0
        self.forks = self.probes = self.commits = self.rebases_prepared = 0
        self.bg_polls = bg_polls
        self.can_fork_prefix = True   # False: a recurrent model's sequence (no prefix forks)
        self.fail_background = False
        self.model_name = "fake"
        self.token_eos = tokenizer.token_eos if tokenizer is not None else self._id(EOG_TEXT)
        self.token_bos = tokenizer.token_bos if tokenizer is not None else -1
        self.metadata = {}

    def _id(self, piece):
        if piece not in self._vocab:
            self._vocab[piece] = len(self._pieces)
            self._pieces.append(piece)
        return self._vocab[piece]

    def tokenize(self, text, *, add_special=False, parse_special=True):
        if self.tokenizer is not None:
            return self.tokenizer.tokenize(text, add_special=add_special, parse_special=parse_special)
        return [self._id(p) for p in _TOK_RE.findall(text)]

    def detokenize(self, tokens):
        if self.tokenizer is not None:
            return self.tokenizer.detokenize(tokens)
        return "".join(self._pieces[t] for t in tokens)

    def token_to_piece(self, t):
        if self.tokenizer is not None:
            return self.tokenizer.token_to_piece(t)
        return self._pieces[t]

    def is_eog(self, t):
        if self.tokenizer is not None:
            return self.tokenizer.is_eog(t)
        return self._pieces[t] == EOG_TEXT

    def sequence(self, tokens=()):
        return FakeSeq(self, tokens)

    def used_cells(self):
        s = set()
        for q in self._seqs.values():
            s.update(q._cells)
        return len(s)

    def _alloc(self, n):
        if self.used_cells() + n > self.n_ctx:
            raise errors.ContextFullError(f"{n} more cells do not fit ({self.used_cells()}/{self.n_ctx})")

    def _check_cells(self):
        u = self.used_cells()
        self.max_used = max(self.max_used, u)
        assert u <= self.n_ctx

    def _check_slot(self):
        if len(self._seqs) >= self.n_seq_max:
            raise errors.SlotsExhaustedError("all sequence slots are in use")

    def stats(self):
        return {"rows": dict(self.rows), "live_sequences": len(self._seqs), "used_cells": self.used_cells()}
