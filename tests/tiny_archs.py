"""Tiny random-weight GGUFs of non-llama architectures, with SmolLM2's real tokenizer.

They let the engine's capability checks run on the model kinds llama.cpp treats differently:

- ``make_tiny_mamba``: ``mamba`` (recurrent memory: no tail removal, no ranged copies).
- ``make_tiny_gemma2``: ``gemma2`` (interleaved sliding-window attention, ``n_swa > 0``).
- ``make_tiny_mrope``: ``qwen2vl`` (M-RoPE: ``llama_memory_can_shift`` is false).
- ``make_tiny_lfm2``: ``lfm2`` (hybrid: short-conv recurrent layers plus attention layers).

Every model is float32, 2 layers (lfm2: 3), 64 wide; weights are ``normal * 0.02`` from
``numpy.random.default_rng(seed)``, norms are 1. Tensor shapes and metadata keys follow llama.cpp's
loaders for each architecture (``src/models/<arch>.cpp`` and ``gguf-py``'s ``MODEL_TENSORS``); numpy
shapes are ggml's ``ne`` reversed. Files are written to a temp name and renamed (no partial files).

``python tests/tiny_archs.py OUTDIR`` writes all of them and prints their sizes and times.
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile
from typing import Any, Callable, Dict, List, Tuple, Union

import gguf
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from tiny_model import tokenizer_fields, write_gguf as _write  # noqa: E402

__all__ = ["ARCHS", "make_tiny_gemma2", "make_tiny_lfm2", "make_tiny_mamba", "make_tiny_mrope"]

PathLike = Union[str, os.PathLike]
Tensors = List[Tuple[str, np.ndarray]]


class _Rand:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, *shape: int, scale: float = 0.02) -> np.ndarray:
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)

    @staticmethod
    def ones(*shape: int) -> np.ndarray:
        return np.ones(shape, dtype=np.float32)


def _attn(r: _Rand, b: str, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, bias: bool = False) -> Tensors:
    t = [
        (b + "attn_q.weight", r(n_head * head_dim, n_embd)),
        (b + "attn_k.weight", r(n_head_kv * head_dim, n_embd)),
        (b + "attn_v.weight", r(n_head_kv * head_dim, n_embd)),
        (b + "attn_output.weight", r(n_embd, n_head * head_dim)),
    ]
    if bias:
        t += [
            (b + "attn_q.bias", r(n_head * head_dim)),
            (b + "attn_k.bias", r(n_head_kv * head_dim)),
            (b + "attn_v.bias", r(n_head_kv * head_dim)),
        ]
    return t


def _ffn(r: _Rand, b: str, n_embd: int, n_ff: int) -> Tensors:
    return [
        (b + "ffn_gate.weight", r(n_ff, n_embd)),
        (b + "ffn_up.weight", r(n_ff, n_embd)),
        (b + "ffn_down.weight", r(n_embd, n_ff)),
    ]


def make_tiny_mamba(path: PathLike, seed: int = 0, *, n_layer: int = 2, n_embd: int = 64, d_state: int = 16,
                    d_conv: int = 4, n_ctx_train: int = 8192, tokenizer_source: PathLike | None = None) -> pathlib.Path:
    """Mamba (v1): ``d_inner = 2 * n_embd`` (the only expansion llama.cpp supports), ``dt_rank = ceil(n_embd/16)``."""
    tok = tokenizer_fields(tokenizer_source)
    n_vocab = len(tok["tokenizer.ggml.tokens"][0])
    d_inner = 2 * n_embd
    dt_rank = -(-n_embd // 16)
    r = _Rand(seed)
    tensors: Tensors = [("token_embd.weight", r(n_vocab, n_embd))]
    for i in range(n_layer):
        b = f"blk.{i}."
        # A = -exp(A_log) with A_log = log(1..d_state), as in Mamba's init; D = 1; dt bias ~ softplus^-1(0.01).
        a = -np.tile(np.arange(1, d_state + 1, dtype=np.float32), (d_inner, 1))
        tensors += [
            (b + "attn_norm.weight", r.ones(n_embd)),
            (b + "ssm_in.weight", r(2 * d_inner, n_embd)),
            (b + "ssm_conv1d.weight", r(d_inner, d_conv, scale=0.2)),
            (b + "ssm_conv1d.bias", r(d_inner)),
            (b + "ssm_x.weight", r(dt_rank + 2 * d_state, d_inner)),
            (b + "ssm_dt.weight", r(d_inner, dt_rank)),
            (b + "ssm_dt.bias", np.full(d_inner, -4.6, dtype=np.float32)),
            (b + "ssm_a", a),
            (b + "ssm_d", r.ones(d_inner)),
            (b + "ssm_out.weight", r(n_embd, d_inner)),
        ]
    tensors += [("output_norm.weight", r.ones(n_embd)), ("output.weight", r(n_vocab, n_embd))]

    def kv(w: gguf.GGUFWriter) -> None:
        w.add_context_length(n_ctx_train)
        w.add_embedding_length(n_embd)
        w.add_block_count(n_layer)
        w.add_feed_forward_length(0)
        w.add_head_count(0)
        w.add_ssm_conv_kernel(d_conv)
        w.add_ssm_inner_size(d_inner)
        w.add_ssm_state_size(d_state)
        w.add_ssm_time_step_rank(dt_rank)
        w.add_layer_norm_rms_eps(1e-5)

    return _write(path, "mamba", seed, kv, tensors, tok)


def make_tiny_gemma2(path: PathLike, seed: int = 0, *, n_layer: int = 2, n_embd: int = 64, n_head: int = 4,
                     n_head_kv: int = 2, n_ff: int = 128, sliding_window: int = 32, n_ctx_train: int = 8192,
                     tokenizer_source: PathLike | None = None) -> pathlib.Path:
    """Gemma 2: every other layer uses a ``sliding_window``-token window (llama.cpp's gemma2 SWA pattern)."""
    tok = tokenizer_fields(tokenizer_source)
    n_vocab = len(tok["tokenizer.ggml.tokens"][0])
    head_dim = n_embd // n_head
    r = _Rand(seed)
    tensors: Tensors = [("token_embd.weight", r(n_vocab, n_embd))]
    for i in range(n_layer):
        b = f"blk.{i}."
        tensors += [(b + "attn_norm.weight", r.ones(n_embd))]
        tensors += _attn(r, b, n_embd, n_head, n_head_kv, head_dim)
        tensors += [(b + "post_attention_norm.weight", r.ones(n_embd)), (b + "ffn_norm.weight", r.ones(n_embd))]
        tensors += _ffn(r, b, n_embd, n_ff)
        tensors += [(b + "post_ffw_norm.weight", r.ones(n_embd))]
    tensors += [("output_norm.weight", r.ones(n_embd))]  # output is tied to token_embd, as in Gemma

    def kv(w: gguf.GGUFWriter) -> None:
        w.add_context_length(n_ctx_train)
        w.add_embedding_length(n_embd)
        w.add_block_count(n_layer)
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head_kv)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_sliding_window(sliding_window)
        w.add_attn_logit_softcapping(50.0)
        w.add_final_logit_softcapping(30.0)

    return _write(path, "gemma2", seed, kv, tensors, tok)


def make_tiny_mrope(path: PathLike, seed: int = 0, *, n_layer: int = 2, n_embd: int = 64, n_head: int = 4,
                    n_head_kv: int = 2, n_ff: int = 128, n_ctx_train: int = 8192,
                    tokenizer_source: PathLike | None = None) -> pathlib.Path:
    """Qwen2-VL text model: M-RoPE with ``rope.dimension_sections`` summing to ``head_dim / 2``."""
    tok = tokenizer_fields(tokenizer_source)
    n_vocab = len(tok["tokenizer.ggml.tokens"][0])
    head_dim = n_embd // n_head
    half = head_dim // 2
    sections = [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2, 0]
    r = _Rand(seed)
    tensors: Tensors = [("token_embd.weight", r(n_vocab, n_embd))]
    for i in range(n_layer):
        b = f"blk.{i}."
        tensors += [(b + "attn_norm.weight", r.ones(n_embd))]
        tensors += _attn(r, b, n_embd, n_head, n_head_kv, head_dim, bias=True)
        tensors += [(b + "ffn_norm.weight", r.ones(n_embd))]
        tensors += _ffn(r, b, n_embd, n_ff)
    tensors += [("output_norm.weight", r.ones(n_embd)), ("output.weight", r(n_vocab, n_embd))]

    def kv(w: gguf.GGUFWriter) -> None:
        w.add_context_length(n_ctx_train)
        w.add_embedding_length(n_embd)
        w.add_block_count(n_layer)
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head_kv)
        w.add_rope_freq_base(1000000.0)
        w.add_rope_dimension_sections(sections)
        w.add_layer_norm_rms_eps(1e-6)

    return _write(path, "qwen2vl", seed, kv, tensors, tok)


def make_tiny_lfm2(path: PathLike, seed: int = 0, *, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                   n_ff: int = 128, l_cache: int = 3, layer_kinds: str = "cac", n_ctx_train: int = 8192,
                   tokenizer_source: PathLike | None = None) -> pathlib.Path:
    """LFM2 hybrid: ``layer_kinds`` has one letter per layer, ``c`` short-conv (recurrent), ``a`` attention."""
    tok = tokenizer_fields(tokenizer_source)
    n_vocab = len(tok["tokenizer.ggml.tokens"][0])
    head_dim = n_embd // n_head
    r = _Rand(seed)
    tensors: Tensors = [("token_embd.weight", r(n_vocab, n_embd))]
    for i, kind in enumerate(layer_kinds):
        b = f"blk.{i}."
        tensors += [(b + "attn_norm.weight", r.ones(n_embd)), (b + "ffn_norm.weight", r.ones(n_embd))]
        tensors += _ffn(r, b, n_embd, n_ff)
        if kind == "a":
            tensors += _attn(r, b, n_embd, n_head, n_head_kv, head_dim)
            tensors += [(b + "attn_q_norm.weight", r.ones(head_dim)), (b + "attn_k_norm.weight", r.ones(head_dim))]
        elif kind == "c":
            tensors += [
                (b + "shortconv.conv.weight", r(n_embd, l_cache, scale=0.2)),
                (b + "shortconv.in_proj.weight", r(3 * n_embd, n_embd)),
                (b + "shortconv.out_proj.weight", r(n_embd, n_embd)),
            ]
        else:
            raise ValueError(f"layer kind must be 'a' or 'c', got {kind!r}")
    tensors += [("token_embd_norm.weight", r.ones(n_embd))]  # LFM2's final norm; output tied to token_embd

    def kv(w: gguf.GGUFWriter) -> None:
        w.add_context_length(n_ctx_train)
        w.add_embedding_length(n_embd)
        w.add_block_count(len(layer_kinds))
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv([n_head_kv if k == "a" else 0 for k in layer_kinds])
        w.add_rope_freq_base(1000000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_shortconv_l_cache(l_cache)

    return _write(path, "lfm2", seed, kv, tensors, tok)


ARCHS: Dict[str, Callable[..., pathlib.Path]] = {
    "mamba": make_tiny_mamba,
    "gemma2": make_tiny_gemma2,
    "qwen2vl": make_tiny_mrope,
    "lfm2": make_tiny_lfm2,
}


if __name__ == "__main__":  # python tests/tiny_archs.py OUTDIR
    import time

    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    tokenizer_fields()  # read once, outside the timings
    for name, make in ARCHS.items():
        t = time.perf_counter()
        p = make(out / f"tiny-{name}.gguf", seed=0)
        print(f"{p} {p.stat().st_size} bytes in {time.perf_counter() - t:.3f}s")
