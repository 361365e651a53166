"""``Engine`` owns a model and a llama.cpp context and hands out ``Sequence`` objects (sequence.py). Every
operation runs on the native engine thread; this class validates input and translates results, nothing more
(the policy lives elsewhere and only uses these verbs)."""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..errors import EngineClosedError
from ..models.registry import resolve_model
from . import state as _state
from .arguments import check_int, check_share, physical_cores, token_list
from .loader import native
from .sequence import Sequence


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
    ``n_batch``: the most rows in one decode step; llama.cpp's ``n_ubatch`` is set to the same, so that a
    step is one micro-batch and a failed or aborted decode rolls back whole (a batch split into micro-
    batches can fail after some of them were written to the KV cache).
    """

    # a swap nobody prepared is rebuilt by truncating and appending (compaction/swap.py): freeing the old
    # cells first, the new rows attend over fewer cells than beside the old history
    rebuilds_in_place = True

    def __init__(self, model: str | os.PathLike | None = None, n_ctx: int = 4096, n_seq_max: int = 8,
                 n_threads: int | None = None, seed: int = 0, *, n_batch: int = 512, background_chunk: int = 64,
                 background_chunk_busy: int | None = None,
                 background_share: float | None = None,
                 use_extra_bufts: bool = False, n_gpu_layers: int = 0, flash_attn: bool | None = None,
                 verbose: bool = False):
        n_ctx = check_int("n_ctx", n_ctx, 16)
        n_seq_max = check_int("n_seq_max", n_seq_max, 1)
        if n_seq_max > 256:
            raise ValueError(f"n_seq_max must be <= 256, got {n_seq_max}")
        n_threads = physical_cores() if n_threads is None else check_int("n_threads", n_threads, 1)
        if n_threads > 1024:
            raise ValueError(f"n_threads must be <= 1024, got {n_threads}")
        seed = check_int("seed", seed, 0) % (2**32 - 1)
        n_batch = check_int("n_batch", n_batch, 1)
        background_chunk = check_int("background_chunk", background_chunk, 1)
        background_chunk_busy = (min(8, background_chunk) if background_chunk_busy is None else
                                 check_int("background_chunk_busy", background_chunk_busy, 1))
        if background_chunk_busy > background_chunk:  # the busy cap would be the larger: a swapped pair
            raise ValueError(f"background_chunk_busy ({background_chunk_busy}) must be <= background_chunk "
                             f"({background_chunk}): it caps background rows beside foreground work, which "
                             "background_chunk caps when the foreground is idle")
        background_share = -1.0 if background_share is None else check_share(background_share)
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
        return self.native().detokenize(token_list(tokens), bool(special)).decode("utf-8", errors="replace")

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
        return Sequence(self, live.seq_import(saved.tokens, saved.evaluated, saved.logits, saved.state, saved.exact_upto))

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
            # replacement tokens a rebase found already in place after its prefix (shared, not fed again)
            "rebase_reused_rows": int(raw["rebase_reused_rows"]),
            "forks": int(raw["forks"]),
            "used_cells": int(raw["used_cells"]),
            "reserved_cells": int(raw["reserved_cells"]),   # promised to foreground appends and replies
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
        """KV cells a new job can take: the pool's free cells less those promised to foreground appends and
        replies still running (a reply is promised up to its ``max_tokens`` when it starts)."""
        return int(self.native().free_cells())

    def sequence(self, tokens: Iterable[int] = ()) -> "Sequence":
        toks = token_list(tokens)
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
