"""The swap: the one transaction that replaces old history by a summary (or by nothing, for a drop).

Fixed order: (1) offload the replaced messages to the history file (durable, idempotent), (2) build the
new sequence — commit a prepared rebase, else prepare one and wait, else prefill a fresh sequence —
(3) only then replace the live entries and the transcript.  A failure in (1) or (2) leaves the live context
exactly as it was (the history file may hold the messages already; a retry does not write them twice).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from .. import errors
from ..session.context import Context, Entry
from ..session.transcript import Transcript
from ..engine.port import engine_errors, rebuilds_in_place


@dataclass
class Replacement:
    """What goes where ``entries[n_prefix:cut]`` were: a summary message (or None) and its tokens."""
    cut: int
    msg: Optional[dict]
    view: Optional[dict]
    r_text: str
    tokens: List[int]
    # a smaller plan for the same cut (None: there is none), used when this one's rebased context does not
    # fit the pool: a swap that cannot fit must not fail the same way at every later call
    smaller: Optional[Callable[[], Optional["Replacement"]]] = field(default=None, compare=False, repr=False)


class Swap:
    def __init__(self, ctx: Context, transcript: Transcript, rebase_mode: str = "exact",
                 describe: Callable[[dict], Optional[dict]] = lambda msg: None):
        """``describe``: what a summary message holds, for the log (the summary maker's)."""
        self.ctx, self.transcript, self.rebase_mode, self.describe = ctx, transcript, rebase_mode, describe
        self.last: Optional[Replacement] = None   # what the latest swap put in (a smaller plan, maybe)

    def gain(self, replacement: Replacement) -> int:
        """Tokens the swap frees (<= 0: not worth doing)."""
        p_tok, m_tok, _, _ = self.ctx.span(replacement.cut)
        return (m_tok - p_tok) - len(replacement.tokens)

    def run(self, replacement: Replacement, *, reason: str, rebase=None, mode: Optional[str] = None) -> dict:
        ctx = self.ctx
        replaced = ctx.entries[ctx.n_prefix:replacement.cut]
        span = ctx.span(replacement.cut)
        before = len(ctx)
        self.transcript.offload(replaced, reason)                                   # (1)
        t0 = time.perf_counter()
        while True:
            if replacement.msg is not None:
                self.transcript.log(replacement.msg, live=False)  # the summary is durable before anything changes
            try:
                info = self._build(span, replacement.tokens, rebase, mode or self.rebase_mode)    # (2)
                break
            except BaseException as e:
                if replacement.msg is not None:
                    self.transcript.unlog(len(self.transcript.messages))
                # (a smaller plan only on the context as it was: not after a restore that failed)
                smaller = replacement.smaller() if (replacement.smaller is not None and isinstance(e, errors.ContextFullError)
                                            and ctx.lost is None) else None
                while smaller is not None and len(smaller.tokens) >= len(replacement.tokens) and smaller.smaller:
                    smaller = smaller.smaller()   # (a plan that saves nothing here: the next one)
                if smaller is None or len(smaller.tokens) >= len(replacement.tokens):
                    raise
                replacement, rebase = smaller, None  # the pool has no room for this rebased context: a smaller one
        expect = before + span[0] + len(replacement.tokens) - span[1]
        if len(ctx.seq) != expect:  # pragma: no cover - engine contract violated: nothing replaced
            raise errors.EngineError(f"rebase left {len(ctx.seq)} tokens, expected {expect}")
        self.last = replacement
        entry = None                                                            # (3)
        if replacement.msg is not None:
            entry = Entry(replacement.msg, replacement.view, self.transcript.record(replacement.msg), summary=True)
        ctx.replaced(replacement.cut, span, entry, replacement.r_text, len(replacement.tokens))
        self.transcript.forget(replaced, entry, None if entry is None else self.describe(entry.msg))
        ctx.n = len(ctx.seq)
        info.setdefault("build_ms", (time.perf_counter() - t0) * 1000.0)
        info["tokens_before"], info["tokens_after"] = before, ctx.n
        info["summary_reused"] = int(info.get("reused_tokens", 0))   # (what the engine kept: 0 for a fresh sequence)
        info["offloaded"] = sum(1 for e in replaced if not e.summary)
        return info

    def _build(self, span, repl: List[int], rebase, mode: str) -> dict:
        seq = self.ctx.seq
        prefix_tok, cut_token = span[0], span[1]
        if rebase is not None:
            try:
                return dict(seq.commit_rebase(rebase))
            except engine_errors():
                _cancel(rebase)
        rebase = None
        if mode == "exact" and rebuilds_in_place(self.ctx.engine):
            built = self._rebuild_in_place(prefix_tok, repl, cut_token)
            if built is not None:
                return built
        try:
            rebase = seq.prepare_rebase(prefix_tok, repl, cut_token, mode=mode)
            if not rebase.wait():
                raise errors.EngineError(f"rebase preparation failed: {getattr(rebase, 'error', '')}")
            return dict(seq.commit_rebase(rebase))
        except engine_errors():
            if rebase is not None:
                _cancel(rebase)
        # last resort: a fresh sequence, created before the old one is closed
        t0 = time.perf_counter()
        toks = seq.tokens
        new = self.ctx.engine.sequence(toks[:prefix_tok] + list(repl) + toks[cut_token:])
        self.ctx.replace_sequence(new)
        # (catch_up_tokens: what the swap decoded on the conversation's own path, here all of it)
        return {"mode": "rebuild", "stall_ms": (time.perf_counter() - t0) * 1000.0,
                "catch_up_tokens": len(new.tokens)}


    def _rebuild_in_place(self, prefix_tok: int, repl: List[int], cut_token: int) -> Optional[dict]:
        """A swap nobody prepared, waited for anyway: truncate the sequence to the prefix and append the
        summary and the tail.  The old cells are freed first, so the new rows attend over the prefix alone
        (a prepared rebase builds beside the old history; ``bench/peer.py``, SmolLM2, one live sequence:
        4.5 s against 5.1 s for summary and rebuild).  A failure puts the old tokens back (the same tokens
        at the same positions: the same context) and raises; None where the model cannot drop a tail."""
        seq = self.ctx.seq
        old = seq.tokens
        t0 = time.perf_counter()
        # (a summary that starts as the one it replaces keeps those tokens: the same KV, not computed again)
        same = 0 if seq.spliced else same_start(old[prefix_tok:cut_token], repl)   # (spliced cells: approximate)
        try:
            seq.truncate(prefix_tok + same)
        except errors.UnsupportedOperationError:   # recurrent and hybrid memories: a prepared rebase instead
            return None
        fed = list(repl[same:]) + old[cut_token:]
        try:
            seq.append(fed)
        except BaseException:
            self._restore(old, prefix_tok + same)
            raise
        # catch_up_tokens: the rows this swap decoded on the conversation's path (a commit's last few tokens,
        # here the summary and the tail): the stall's work, counted where the event says what it cost
        return {"mode": "exact", "stall_ms": (time.perf_counter() - t0) * 1000.0, "catch_up_tokens": len(fed),
                "in_place": True, "reused_tokens": same}

    def _restore(self, old: List[int], prefix_tok: int) -> None:
        """The sequence holds ``old`` again after a failed in-place rebuild: its tail appended again, else a
        fresh sequence of all of it.  When the engine fails at that too, the context remembers ``old``
        (``Context.lost``) and the session's next call puts it back first (``Context.heal``): the live
        messages never part ways with the tokens for good.  Never raises but for an interrupt."""
        seq = self.ctx.seq
        try:
            seq.truncate(prefix_tok)
            seq.append(old[prefix_tok:])
            return
        except Exception:  # noqa: BLE001 - the engine failed again: build it anew
            pass
        except BaseException:   # an interrupt: the next call heals it
            self.ctx.lost = old
            raise
        try:
            self.ctx.replace_sequence(self.ctx.engine.sequence(old))
        except Exception:  # noqa: BLE001 - the engine still fails: the session's next call heals it
            self.ctx.lost = old
        except BaseException:
            self.ctx.lost = old
            raise


def same_start(old: List[int], new: List[int]) -> int:
    """How many tokens ``new`` begins with that ``old`` begins with too."""
    n = 0
    for a, b in zip(old, new):
        if a != b:
            break
        n += 1
    return n


def _cancel(rebase) -> None:
    try:
        rebase.cancel()
    except Exception:  # noqa: BLE001
        pass


__all__ = ["Swap", "Replacement"]
