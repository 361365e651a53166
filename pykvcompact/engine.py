"""The public engine API: ``Engine`` owns a model and a llama.cpp context; ``Sequence`` is one KV
sequence in it. Every operation runs on the native engine thread; these classes validate input and
translate results, nothing more (the policy lives elsewhere and only uses these verbs)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Iterator, Sequence as _SeqABC
from typing import Any

import numpy as np

from ._native_loader import native
from .errors import EngineClosedError, SequenceClosedError
from .jobs import Job, Rebase, wait_job
from .models import resolve_model
from . import state as _state

# Row kinds, as the native engine counts them in stats().
FOREGROUND, BACKGROUND, PROBE = 0, 1, 2


def physical_cores() -> int:
    """Physical cores (not hyperthreads) available to this process; llama.cpp scales with those."""
    try:
        allowed = os.sched_getaffinity(0)
        cores = set()
        cpu = None
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            phys = None
            for line in f:
                key, _, val = line.partition(":")
                key, val = key.strip(), val.strip()
                if key == "processor":
                    cpu = int(val)
                elif key == "physical id":
                    phys = val
                elif key == "core id" and cpu in allowed:
                    cores.add((phys, val))
        if cores:
            return max(1, min(len(cores), len(allowed)))
        return max(1, len(allowed))
    except (OSError, ValueError, AttributeError):
        return max(1, os.cpu_count() or 1)


def _token_list(tokens: Any, what: str = "tokens") -> list[int]:
    if isinstance(tokens, (str, bytes)):
        raise TypeError(f"{what} must be a list of token ids, not text; use engine.tokenize(text) first")
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
            raise TypeError(f"{what} must be a 1-D array of integers, got {tokens.dtype} with shape {tokens.shape}")
        return [int(t) for t in tokens]
    if not isinstance(tokens, Iterable):
        raise TypeError(f"{what} must be a list of token ids, got {type(tokens).__name__}")
    out = []
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"{what} must contain integer token ids, found {t!r}")
        if not -(2**31) <= int(t) < 2**31:
            raise ValueError(f"token id {int(t)} is out of range")
        out.append(int(t))
    return out


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_share(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"background_share must be a number between 0 and 1 (or None: by backend), got {value!r}")
    if not 0.0 <= float(value) <= 1.0:   # NaN fails this too
        raise ValueError(f"background_share must be between 0 and 1 (or None: by backend), got {value}")
    return float(value)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max()
    return x - (m + math.log(np.exp(x - m).sum()))


class Engine:
    """One model, one llama.cpp context (``kv_unified``: ``n_ctx`` cells shared by every sequence), one
    engine thread, up to ``n_seq_max`` live sequences (probes, forks and rebase preparations included).

    ``model`` is a GGUF path or a registry name (``"smollm2-135m"``, ``"qwen2.5-coder-1.5b"``);
    ``None`` is the default model. ``use_extra_bufts`` turns on ggml's extra buffer types (AMX weight
    repacking); it is off because on some CPUs it crashes the process with SIGILL. ``flash_attn``:
    None lets llama.cpp decide, True/False force it (llama-cpp-python's ``Llama`` defaults to False).
    Background work gets up to ``background_chunk`` rows in a decode step when the foreground is idle,
    and at most ``background_chunk_busy`` rows in one that carries foreground rows (each extra row
    delays the foreground token a little on a CPU); ``background_chunk_busy=None`` means 8, or
    ``background_chunk`` if that is smaller, and a busy cap above ``background_chunk`` is refused.
    ``background_share``: the time background rows may take next to foreground work, as a fraction of
    the foreground's own (0.15: the foreground keeps ~1/1.15 = 0.87 of its solo speed; 0: background rows
    never join a foreground step unless their job is on a deadline, ``Job.set_rows_per_step``; 1: every
    step).  None: by backend, 0.15 on a CPU and 1 with layers offloaded to a GPU, where extra rows in a
    step are nearly free.  ``stats()["background_share"]`` says which applies.
    """

    def __init__(self, model: str | os.PathLike | None = None, n_ctx: int = 4096, n_seq_max: int = 8,
                 n_threads: int | None = None, seed: int = 0, *, n_batch: int = 512, background_chunk: int = 64,
                 background_chunk_busy: int | None = None,
                 background_share: float | None = None,
                 use_extra_bufts: bool = False, n_gpu_layers: int = 0, flash_attn: bool | None = None,
                 verbose: bool = False):
        n_ctx = _check_int("n_ctx", n_ctx, 16)
        n_seq_max = _check_int("n_seq_max", n_seq_max, 1)
        if n_seq_max > 256:
            raise ValueError(f"n_seq_max must be <= 256, got {n_seq_max}")
        n_threads = physical_cores() if n_threads is None else _check_int("n_threads", n_threads, 1)
        if n_threads > 1024:
            raise ValueError(f"n_threads must be <= 1024, got {n_threads}")
        seed = _check_int("seed", seed, 0) % (2**32 - 1)
        n_batch = _check_int("n_batch", n_batch, 1)
        background_chunk = _check_int("background_chunk", background_chunk, 1)
        background_chunk_busy = (min(8, background_chunk) if background_chunk_busy is None else
                                 _check_int("background_chunk_busy", background_chunk_busy, 1))
        if background_chunk_busy > background_chunk:  # the busy cap would be the larger: a swapped pair
            raise ValueError(f"background_chunk_busy ({background_chunk_busy}) must be <= background_chunk "
                             f"({background_chunk}): it caps background rows beside foreground work, which "
                             "background_chunk caps when the foreground is idle")
        background_share = -1.0 if background_share is None else _check_share(background_share)
        self.model_path = resolve_model(model)
        self.model_name = model if isinstance(model, str) and not os.path.exists(model) else (
            "qwen2.5-coder-1.5b" if model is None else str(model))
        self._n = native().Engine(str(self.model_path), n_ctx=n_ctx, n_seq_max=n_seq_max, n_threads=n_threads,
                                  n_batch=n_batch, background_chunk=background_chunk,
                                  background_chunk_busy=background_chunk_busy, seed=seed,
                                  use_extra_bufts=bool(use_extra_bufts), n_gpu_layers=int(n_gpu_layers),
                                  flash_attn=-1 if flash_attn is None else int(bool(flash_attn)),
                                  verbose=bool(verbose), background_share=background_share)
        self.n_threads = n_threads
        self.seed = seed
        self._closed = False
        self._n_vocab = self._n.n_vocab()
        self._caps = dict(self._n.capabilities())
        self._metadata: dict[str, str] | None = None
        self._fingerprint: dict | None = None

    # -- model and text ---------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.native().tokenize(text, bool(add_special), bool(parse_special))

    def detokenize(self, tokens: Iterable[int], *, special: bool = True) -> str:
        return self.native().detokenize(_token_list(tokens), bool(special)).decode("utf-8", errors="replace")

    def token_to_piece(self, token: int, *, special: bool = True) -> str:
        return self.native().token_to_piece(int(token), bool(special)).decode("utf-8", errors="replace")

    def token_bytes(self, token: int, *, special: bool = True) -> bytes:
        return self.native().token_to_piece(int(token), bool(special))

    def is_eog(self, token: int) -> bool:
        return bool(self.native().is_eog(int(token)))

    @property
    def token_bos(self) -> int:
        return int(self.native().token_bos())

    @property
    def token_eos(self) -> int:
        return int(self.native().token_eos())

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def n_ctx(self) -> int:
        return int(self._caps["n_ctx"])

    @property
    def n_seq_max(self) -> int:
        return int(self._caps["n_seq_max"])

    @property
    def chat_template(self) -> str | None:
        return self.native().chat_template()

    @property
    def metadata(self) -> dict[str, str]:
        live = self.native()
        if self._metadata is None:
            self._metadata = dict(live.metadata())
        return self._metadata

    @property
    def capabilities(self) -> dict:
        """What the loaded model allows: ``can_shift`` (splice rebase), ``recurrent``/``hybrid``
        (no truncate, exact rebase re-prefills the prefix), ``sliding_window``, ``n_ctx``, ``n_seq_max``..."""
        return dict(self._caps)

    @property
    def fingerprint(self) -> dict:
        """What a saved sequence state must match to load here (``load_sequence``): ``model`` (a key of
        the file's size, GGUF metadata and vocabulary), ``n_ctx``, and the ``pykvcompact`` and
        ``llama_cpp`` versions; ``model_file`` and ``n_vocab`` are informative."""
        self.native()
        if self._fingerprint is None:
            self._fingerprint = _state.engine_fingerprint(self)
        return dict(self._fingerprint)

    def load_sequence(self, blob: bytes) -> "Sequence":
        """A new sequence from ``Sequence.save_state()`` bytes: same tokens, same KV, same next-token
        logits, no prefill. Raises ``InvalidStateError`` (a ValueError) for a cut-short or corrupt
        blob and ``StateMismatchError`` (a ValueError, naming what differs) for one saved by another
        model, n_ctx or library version: prefill its tokens again then. Also ``ContextFullError`` or
        ``SlotsExhaustedError`` when it does not fit; a failed load leaves nothing behind."""
        live = self.native()
        saved = _state.unpack(blob, self.fingerprint)
        return Sequence(self, live.seq_import(saved.tokens, saved.evaluated, saved.logits, saved.state))

    # -- state ------------------------------------------------------------------------------------
    def stats(self) -> dict:
        """Counters since the engine started: decode calls, batch rows by kind, batches that mixed
        foreground and background rows, the background share in effect and the steps background rows
        sat out for lack of it, decode milliseconds, tokens per live sequence."""
        raw = self.native().stats()
        return {
            "decode_calls": int(raw["decode_calls"]),
            "failed_decodes": int(raw["failed_decodes"]),
            "aborted_decodes": int(raw["aborted_decodes"]),
            "aborted_ms": float(raw["aborted_ms"]),
            "rows": {"foreground": int(raw["rows_foreground"]), "background": int(raw["rows_background"]),
                     "probe": int(raw["rows_probe"])},
            "mixed_batches": int(raw["mixed_batches"]),
            "background_share": float(raw["background_share"]),
            "background_deferred_steps": int(raw["background_deferred_steps"]),
            "decode_ms": float(raw["decode_ms"]),
            "rebases": int(raw["rebases"]),
            "catch_up_rows": int(raw["catch_up_rows"]),
            "forks": int(raw["forks"]),
            "used_cells": int(raw["used_cells"]),
            "n_ctx": int(raw["n_ctx"]),
            "live_sequences": int(raw["live_sequences"]),
            "internal_sequences": int(raw["internal_sequences"]),
            "pending_tasks": int(raw["pending_tasks"]),
            "committing": int(raw["committing"]),
            "tokens_per_sequence": {int(k): int(v) for k, v in self.native().tokens_per_sequence().items()},
        }

    def used_cells(self) -> int:
        """KV cells held by live sequences (a cell shared by forks counts once)."""
        return int(self.native().used_cells())

    def free_cells(self) -> int:
        return self.n_ctx - self.used_cells()

    def sequence(self, tokens: Iterable[int] = ()) -> "Sequence":
        toks = _token_list(tokens)
        seq = Sequence(self, self.native().seq_create())
        if toks:
            try:
                seq.append(toks)
            except BaseException:
                seq.close()
                raise
        return seq

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the engine: pending jobs fail with EngineClosedError, then the model is freed. Every
        later call raises EngineClosedError. Idempotent, and safe from several threads at once."""
        self._closed = True
        self._n.shutdown()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Engine(model={self.model_name!r}, n_ctx={self.n_ctx}, n_seq_max={self.n_seq_max}, n_threads={self.n_threads})"

    def native(self):
        """The native engine (raises EngineClosedError once this Engine is closed)."""
        if self._closed:
            raise EngineClosedError("the engine is closed; create a new Engine")
        return self._n


class Sequence:
    """One KV sequence: a list of tokens whose cells live in the engine's cache at positions 0..n-1.

    Create with ``engine.sequence(tokens)``. The object stays valid across ``commit_rebase`` (its
    slot in llama.cpp may change; ``id`` does not)."""

    def __init__(self, engine: Engine, handle: int):
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
        tokens, evaluated, logits, data = self._n().seq_export(self._h)
        return _state.pack(self.engine.fingerprint, tokens, evaluated, logits, data)

    # -- writing ----------------------------------------------------------------------------------
    def append(self, tokens: Iterable[int]) -> None:
        """Prefill tokens in chunks of at most n_batch, as foreground work."""
        toks = _token_list(tokens)
        wait_job(self._n().seq_append(self._h, toks, FOREGROUND, False))

    def append_background(self, tokens: Iterable[int]) -> Job:
        """Prefill tokens as background rows (at most background_chunk per decode step), interleaved
        with foreground decoding. Returns a Job; ``result()`` returns the tokens appended. After
        ``cancel()`` it stops at the next decode step and the sequence keeps exactly the tokens
        decoded so far (``result()`` lists them)."""
        toks = _token_list(tokens)
        return Job(self._n().seq_append(self._h, toks, BACKGROUND, False), self, toks)

    def _append_rows(self, tokens: list[int], kind: int, all_logits: bool):
        job = self._n().seq_append(self._h, tokens, kind, all_logits)
        wait_job(job)
        return job

    def generate(self, max_tokens: int, *, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
                 stop: Iterable[int | str] = (), grammar: str | None = None, stream: bool = False):
        """Generate up to max_tokens tokens (appended to the sequence). An end-of-generation token
        stops it and is neither returned nor appended; a stop token id or stop string stops it after
        the token that completes it (that token is kept). ``grammar`` is GBNF with a ``root`` rule.
        With ``stream=True`` it returns an iterator of tokens instead (see ``stream()``)."""
        job = self._start_generate(max_tokens, temperature, top_p, seed, stop, grammar, FOREGROUND)
        return job.stream() if stream else job.result()

    def stream(self, max_tokens: int, *, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
               stop: Iterable[int | str] = (), grammar: str | None = None) -> Iterator[int]:
        """Like generate(), yielding each token as soon as it is decoded. Closing the iterator early
        cancels the generation (tokens already decoded stay in the sequence)."""
        job = self._start_generate(max_tokens, temperature, top_p, seed, stop, grammar, FOREGROUND)
        return job.stream()

    def generate_background(self, max_tokens: int, *, temperature: float = 0.0, top_p: float = 1.0,
                            seed: int | None = None, stop: Iterable[int | str] = (), grammar: str | None = None) -> Job:
        """Generate as background work: one row per decode step, batched with foreground work."""
        return self._start_generate(max_tokens, temperature, top_p, seed, stop, grammar, BACKGROUND)

    def _start_generate(self, max_tokens, temperature, top_p, seed, stop, grammar, kind) -> Job:
        max_tokens = _check_int("max_tokens", max_tokens, 0)
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
            seed = _check_int("seed", seed, 0)
        native_job = self._n().seq_generate(self._h, max_tokens, float(temperature), float(top_p),
                                            -1 if seed is None else seed, stop_tokens, stop_strings,
                                            grammar or "", kind)
        return Job(native_job, self)

    def fork(self, n: int | None = None) -> "Sequence":
        """A new sequence with the same tokens (or the first ``n``), sharing this one's KV cells: no
        copy. A prefix fork is refused on recurrent and hybrid models."""
        n = -1 if n is None else _check_int("n", n, 0)
        return Sequence(self.engine, self._n().seq_fork(self._h, n))

    def truncate(self, n: int) -> None:
        """Keep the first n tokens (0 <= n <= len). Raises UnsupportedOperationError on recurrent models."""
        n = _check_int("n", n, 0)
        self._n().seq_truncate(self._h, n)

    def probe(self, tokens: Iterable[int], labels: _SeqABC[str] = ("COMPRESS", "CONTINUE")) -> dict[str, float]:
        """Probability of each label as the continuation of ``self.tokens + tokens``, normalised over
        the labels. Only ``tokens`` are prefilled, on a fork that is dropped afterwards: this
        sequence is untouched. Labels whose first tokens differ cost one logits read; otherwise each
        label's full token sequence is scored on forks."""
        t0 = time.perf_counter()
        toks = _token_list(tokens)
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
        keep_prefix = _check_int("keep_prefix", keep_prefix, 0)
        keep_from = _check_int("keep_from", keep_from, 0)
        repl = _token_list(replacement, "replacement")
        rid, job = self._n().prepare_rebase(self._h, keep_prefix, repl, keep_from, mode == "splice")
        return Rebase(self, rid, job, keep_prefix, keep_from, repl, mode)

    def commit_rebase(self, rb: Rebase) -> dict:
        """Make this sequence the prepared one, tokens and KV, including tokens appended since the
        preparation began (caught up in the background where possible, the rest now)."""
        if not isinstance(rb, Rebase):
            raise TypeError("commit_rebase takes the Rebase returned by prepare_rebase")
        if rb.sequence is not self:
            raise ValueError("this rebase was prepared for another sequence")
        info = self._n().commit_rebase(self._h, rb.id)
        rb.mark_committed()
        return {"mode": rb.mode, "tokens_before": int(info["tokens_before"]), "tokens_after": int(info["tokens_after"]),
                "stall_ms": float(info["stall_ms"]), "catch_up_tokens": int(info["catch_up_tokens"])}

    def close(self) -> None:
        """Free the sequence's slot and its cells (cells shared with forks stay for them)."""
        if self._closed:
            return
        self._closed = True
        if not self.engine.closed:
            try:
                self.engine._n.seq_close(self._h)
            except EngineClosedError:
                pass  # the engine closed meanwhile: its sequences are gone with it

    def __del__(self):
        # A dropped handle gives its slot and cells back (never raise from a finalizer).
        try:
            if not self._closed and not self.engine.closed:
                self.close()
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
