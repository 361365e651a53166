"""``Sequence``: one KV sequence in an Engine, a list of tokens whose cells live in the engine's cache;
append, generate, probe, fork, truncate, rebase, save."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Sequence as _SeqABC
from typing import Protocol

import numpy as np

from ..errors import EngineClosedError, RebaseNotPendingError, SequenceClosedError
from . import state as _state
from .arguments import check_int, token_list
from .jobs import Job, Rebase, wait_job


class SequenceOwner(Protocol):
    """What a sequence uses of the :class:`~.engine.Engine` that made it.  A protocol, not the class:
    ``engine.py`` imports this module to hand out sequences."""

    @property
    def closed(self) -> bool: ...

    @property
    def n_vocab(self) -> int: ...

    @property
    def fingerprint(self) -> dict: ...

    def native(self): ...

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]: ...

    def detokenize(self, tokens: Iterable[int], *, special: bool = True) -> str: ...

# Row kinds, as the native engine counts them in stats().
FOREGROUND, BACKGROUND, PROBE = 0, 1, 2


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max()
    return x - (m + math.log(np.exp(x - m).sum()))


class Sequence:
    """One KV sequence: a list of tokens whose cells live in the engine's cache at positions 0..n-1.

    Create with ``engine.sequence(tokens)``. The object stays valid across ``commit_rebase`` (its
    slot in llama.cpp may change; ``id`` does not)."""

    def __init__(self, engine: SequenceOwner, handle: int):
        self.engine = engine
        self._h = handle
        self._closed = False
        self.last_probe: dict | None = None

    # -- reading ----------------------------------------------------------------------------------
    @property
    def id(self) -> int:
        return self._h

    @property
    def slot(self) -> int:
        """The llama.cpp sequence id this sequence uses now."""
        return int(self._n().seq_slot(self._h))

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def tokens(self) -> list[int]:
        return list(self._n().seq_tokens(self._h))

    def __len__(self) -> int:
        return int(self._n().seq_len(self._h))

    def text(self) -> str:
        return self.engine.detokenize(self.tokens)

    @property
    def spliced(self) -> bool:
        """A splice rebase moved some of this sequence's cells: their KV was computed after other tokens than
        the ones they now follow (approximate), so a rebase takes only the exact cells before them (the prefix
        and the replacement the splice computed after it) as already in place.  False again once those
        cells are truncated away or fed again by an exact rebase."""
        return bool(self._n().seq_spliced(self._h))

    def pos_range(self) -> tuple[int, int]:
        """(pos_min, pos_max) of this sequence in the KV cache as llama.cpp reports them; (-1, -1) if empty."""
        lo, hi = self._n().seq_pos_range(self._h)
        return int(lo), int(hi)

    def logits(self) -> np.ndarray:
        """float32 logits of the next token after the last one (recomputed once after a truncate)."""
        return self._n().seq_logits(self._h)

    def save_state(self) -> bytes:
        """This sequence's tokens, KV state and next-token logits (when valid) as bytes, for
        ``Engine.load_sequence`` in this process or another one running the same model, n_ctx and
        versions (see ``Engine.fingerprint``). Raises SequenceBusyError while a job runs on it."""
        tokens, evaluated, logits, data, exact_upto = self._n().seq_export(self._h)
        return _state.pack(self.engine.fingerprint, tokens, evaluated, logits, data, exact_upto)

    # -- writing ----------------------------------------------------------------------------------
    def append(self, tokens: Iterable[int]) -> None:
        """Prefill tokens in chunks of at most n_batch, as foreground work."""
        toks = token_list(tokens)
        wait_job(self._n().seq_append(self._h, toks, FOREGROUND, False))

    def append_background(self, tokens: Iterable[int]) -> Job:
        """Prefill tokens as background rows (at most background_chunk per decode step), interleaved
        with foreground decoding. Returns a Job; ``result()`` returns the tokens appended. After
        ``cancel()`` it stops at the next decode step and the sequence keeps exactly the tokens
        decoded so far (``result()`` lists them)."""
        toks = token_list(tokens)
        return Job(self._n().seq_append(self._h, toks, BACKGROUND, False), self, toks)

    def _append_rows(self, tokens: list[int], kind: int, all_logits: bool):
        job = self._n().seq_append(self._h, tokens, kind, all_logits)
        wait_job(job)
        return job

    def generate(self, max_tokens: int, *, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
                 stop: Iterable[int | str] = (), grammar: str | None = None, stream: bool = False,
                 top_k: int = 0, min_p: float = 0.0):
        """Generate up to max_tokens tokens (appended to the sequence). An end-of-generation token
        stops it and is neither returned nor appended; a stop token id or stop string stops it after
        the token that completes it (that token is kept). ``grammar`` is GBNF with a ``root`` rule.
        With ``temperature`` > 0 the token is drawn from the ``top_k`` most likely (0: all), then the
        ``top_p`` nucleus, then those at least ``min_p`` times as likely as the best (0: all), in that
        order as in llama.cpp; a small ``top_k`` spares sorting a large vocabulary for ``top_p``.
        With ``stream=True`` it returns an iterator of tokens instead (see ``stream()``).

        The reply is promised up to ``max_tokens`` KV cells when it starts (as many as are free): background
        work never makes it end early, and while it runs that work (a rebase catching up, another
        sequence's generation) only has the cells beyond the promise, so ask for what you need (a session
        generates in chunks)."""
        job = self._start_generate(max_tokens, temperature, top_p, seed, stop, grammar, FOREGROUND, top_k, min_p)
        return job.stream() if stream else job.result()

    def stream(self, max_tokens: int, *, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
               stop: Iterable[int | str] = (), grammar: str | None = None, top_k: int = 0,
               min_p: float = 0.0) -> Iterator[int]:
        """Like generate(), yielding each token as soon as it is decoded. Closing the iterator early
        cancels the generation (tokens already decoded stay in the sequence)."""
        job = self._start_generate(max_tokens, temperature, top_p, seed, stop, grammar, FOREGROUND, top_k, min_p)
        return job.stream()

    def generate_background(self, max_tokens: int, *, temperature: float = 0.0, top_p: float = 1.0,
                            seed: int | None = None, stop: Iterable[int | str] = (), grammar: str | None = None,
                            top_k: int = 0, min_p: float = 0.0) -> Job:
        """Generate as background work: one row per decode step, batched with foreground work."""
        return self._start_generate(max_tokens, temperature, top_p, seed, stop, grammar, BACKGROUND, top_k, min_p)

    def _start_generate(self, max_tokens, temperature, top_p, seed, stop, grammar, kind, top_k=0, min_p=0.0) -> Job:
        max_tokens = check_int("max_tokens", max_tokens, 0)
        top_k = min(check_int("top_k", top_k, 0), 2 ** 31 - 1)   # (a larger k is all of any vocabulary)
        if isinstance(min_p, bool) or not isinstance(min_p, (int, float, np.integer, np.floating)):
            raise TypeError(f"min_p must be a number in [0, 1), got {min_p!r}")
        try:
            min_p = float(min_p)
        except OverflowError:
            raise ValueError(f"min_p must be in [0, 1) (0: off), got {min_p!r}") from None
        if isinstance(stop, (bytes, bytearray)):
            raise TypeError("stop must be a string, a token id, or a list of them; decode bytes to str first")
        if isinstance(stop, (str, int)):
            stop = (stop,)
        stop_tokens, stop_strings = [], []
        for s in stop:
            if isinstance(s, str):
                if s:
                    stop_strings.append(s)
            elif isinstance(s, (int, np.integer)) and not isinstance(s, bool):
                stop_tokens.append(int(s))
            else:
                raise TypeError(f"stop entries must be token ids (int) or strings, got {s!r}")
        if grammar is not None and not isinstance(grammar, str):
            raise TypeError("grammar must be a GBNF string")
        if seed is not None:
            seed = check_int("seed", seed, 0)
        native_job = self._n().seq_generate(self._h, max_tokens, float(temperature), float(top_p),
                                            -1 if seed is None else seed, stop_tokens, stop_strings,
                                            grammar or "", kind, top_k=top_k, min_p=float(min_p))
        return Job(native_job, self)

    def fork(self, n: int | None = None) -> "Sequence":
        """A new sequence with the same tokens (or the first ``n``), sharing this one's KV cells: no
        copy. A prefix fork is refused on recurrent and hybrid models."""
        n = -1 if n is None else check_int("n", n, 0)
        return Sequence(self.engine, self._n().seq_fork(self._h, n))

    def truncate(self, n: int) -> None:
        """Keep the first n tokens (0 <= n <= len). Raises UnsupportedOperationError on recurrent models."""
        n = check_int("n", n, 0)
        self._n().seq_truncate(self._h, n)

    def probe(self, tokens: Iterable[int], labels: _SeqABC[str] = ("COMPRESS", "CONTINUE")) -> dict[str, float]:
        """Probability of each label as the continuation of ``self.tokens + tokens``, normalised over
        the labels. Only ``tokens`` are prefilled, on a fork that is dropped afterwards: this
        sequence is untouched. Labels whose first tokens differ cost one logits read; otherwise each
        label's full token sequence is scored on forks."""
        t0 = time.perf_counter()
        toks = token_list(tokens)
        if isinstance(labels, str) or len(labels) < 2:
            raise ValueError("labels must be a sequence of at least two strings")
        if len(set(labels)) != len(labels):
            raise ValueError(f"labels must be distinct, got {list(labels)}")
        label_tokens = []
        for lab in labels:
            if not isinstance(lab, str) or not lab:
                raise ValueError(f"each label must be a non-empty string, got {lab!r}")
            lt = self.engine.tokenize(lab)
            if not lt:
                raise ValueError(f"label {lab!r} tokenizes to nothing")
            label_tokens.append(lt)
        firsts = [lt[0] for lt in label_tokens]
        if len(set(firsts)) == len(firsts):
            # One native command: fork, prefill the probe, read the labels' log-probabilities, drop.
            job = self._n().seq_probe(self._h, toks, firsts)
            wait_job(job)
            scores = [float(v) for v in job.values()]
            method = "first-token"
        else:
            scores = self._score_full_labels(toks, label_tokens)
            method = "full-sequence"
        m = max(scores)
        exp = [math.exp(s - m) for s in scores]
        total = sum(exp)
        probs = {lab: e / total for lab, e in zip(labels, exp)}
        self.last_probe = {"logprobs": dict(zip(labels, scores)), "tokens": len(toks), "method": method,
                           "ms": (time.perf_counter() - t0) * 1000.0}
        return probs

    def _score_full_labels(self, toks: list[int], label_tokens: list[list[int]]) -> list[float]:
        """Labels sharing a first token: score each label's whole token sequence on forks."""
        fork = self.fork()
        try:
            if toks:
                fork._append_rows(toks, PROBE, False)
            first = log_softmax(fork.logits())
            scores = []
            for lt in label_tokens:
                score = float(first[lt[0]])
                if len(lt) > 1:
                    branch = fork.fork()
                    try:
                        job = branch._append_rows(lt[:-1], PROBE, True)
                        rows = job.logit_rows(self.engine.n_vocab)
                        for i in range(1, len(lt)):
                            score += float(log_softmax(rows[i - 1])[lt[i]])
                    finally:
                        branch.close()
                scores.append(score)
            return scores
        finally:
            fork.close()

    def prepare_rebase(self, keep_prefix: int, replacement: Iterable[int], keep_from: int,
                       mode: str = "exact") -> Rebase:
        """Start building, in the background, ``tokens[:keep_prefix] + replacement + tokens[keep_from:]``
        (prefix cells shared, not recomputed). In ``exact`` mode the prepared sequence keeps catching
        up with tokens appended to this one afterwards. ``splice`` shifts this sequence's own cells at
        commit instead (approximate; only where ``capabilities['can_shift']``)."""
        if mode not in ("exact", "splice"):
            raise ValueError(f"mode must be 'exact' or 'splice', got {mode!r}")
        keep_prefix = check_int("keep_prefix", keep_prefix, 0)
        keep_from = check_int("keep_from", keep_from, 0)
        repl = token_list(replacement, "replacement")
        rid, job = self._n().prepare_rebase(self._h, keep_prefix, repl, keep_from, mode == "splice")
        return Rebase(self, rid, job, keep_prefix, keep_from, repl, mode)

    def commit_rebase(self, rebase: Rebase) -> dict:
        """Make this sequence the prepared one, tokens and KV, including tokens appended since the
        preparation began (caught up in the background where possible, the rest now)."""
        if not isinstance(rebase, Rebase):
            raise TypeError("commit_rebase takes the Rebase returned by prepare_rebase")
        if rebase.sequence is not self:
            raise ValueError("this rebase was prepared for another sequence")
        try:
            info = self._n().commit_rebase(self._h, rebase.id)
        except RebaseNotPendingError:
            rebase.raise_if_superseded()   # the engine dropped it because another rebase was committed first
            raise
        rebase.mark_committed()
        return {"mode": rebase.mode, "tokens_before": int(info["tokens_before"]), "tokens_after": int(info["tokens_after"]),
                "stall_ms": float(info["stall_ms"]), "catch_up_tokens": int(info["catch_up_tokens"]),
                "reused_tokens": int(info.get("reused_tokens", 0))}   # (of the replacement: already in place)

    def close(self) -> None:
        """Free the sequence's slot and its cells (cells shared with forks stay for them)."""
        if self._closed:
            return
        self._closed = True
        if not self.engine.closed:
            try:
                self.engine.native().seq_close(self._h)
            except EngineClosedError:
                pass  # the engine closed meanwhile: its sequences are gone with it

    def __del__(self):
        # A dropped handle gives its slot and cells back at the engine's next pause between steps: the
        # collecting thread does not wait for a decode (any engine call made after it sees it closed).
        # Never raise from a finalizer.
        try:
            if not self._closed and not self.engine.closed:
                self._closed = True
                self.engine.native().seq_close_later(self._h)
        except Exception:
            pass

    def __enter__(self) -> "Sequence":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self)} tokens"
        return f"Sequence(id={self._h}, {state})"

    def _n(self):
        if self._closed:
            raise SequenceClosedError(f"sequence {self._h} is closed")
        return self.engine.native()
