"""A tiny random-weight llama GGUF with SmolLM2's real tokenizer, for fast mechanics tests.

``make_tiny_gguf(path, seed=...)`` writes a float32 model (2 layers, 64 wide by default) whose
tokenizer and chat template are copied from SmolLM2-135M, so tokenization and chat formatting are real
while the weights are seeded noise: logits are deterministic for a seed and differ between seeds.
"""

from __future__ import annotations

import functools
import os
import pathlib
import struct
import tempfile
from typing import Any, Callable, Dict, List, Tuple, Union

import gguf
import numpy as np

__all__ = ["llama_no_extra_bufts", "make_tiny_gguf", "tokenizer_fields", "write_gguf"]

_VT = gguf.GGUFValueType
_SCALAR = {
    _VT.UINT8: "<B", _VT.INT8: "<b", _VT.UINT16: "<H", _VT.INT16: "<h", _VT.UINT32: "<I",
    _VT.INT32: "<i", _VT.FLOAT32: "<f", _VT.BOOL: "<?", _VT.UINT64: "<Q", _VT.INT64: "<q",
    _VT.FLOAT64: "<d",
}
_NP = {
    _VT.UINT8: "<u1", _VT.INT8: "<i1", _VT.UINT16: "<u2", _VT.INT16: "<i2", _VT.UINT32: "<u4",
    _VT.INT32: "<i4", _VT.FLOAT32: "<f4", _VT.BOOL: "?", _VT.UINT64: "<u8", _VT.INT64: "<i8",
    _VT.FLOAT64: "<f8",
}

Field = Tuple[Any, "gguf.GGUFValueType", "gguf.GGUFValueType | None"]  # value, type, array sub-type


def _read_kv(path: Union[str, os.PathLike]) -> Dict[str, Field]:
    """The metadata section of a little-endian GGUF v2/v3 file (tensors not read).

    Same values as ``gguf.GGUFReader(path).fields[k].contents()``, but ~50x faster: GGUFReader maps
    every string of a 49k-token vocabulary to its own numpy array (~2 s for SmolLM2).
    """
    with open(path, "rb") as f:
        buf = f.read(64 << 20)  # the KV section of SmolLM2 is ~2 MB; tensors follow
    if buf[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} is not supported")
    off = 24

    def string() -> str:
        nonlocal off
        (n,) = struct.unpack_from("<Q", buf, off)
        s = buf[off + 8 : off + 8 + n].decode("utf-8")
        off += 8 + n
        return s

    def scalar(t: "gguf.GGUFValueType") -> Any:
        nonlocal off
        if t == _VT.STRING:
            return string()
        fmt = _SCALAR[t]
        (v,) = struct.unpack_from(fmt, buf, off)
        off += struct.calcsize(fmt)
        return v

    out: Dict[str, Field] = {}
    for _ in range(n_kv):
        key = string()
        (t,) = struct.unpack_from("<I", buf, off)
        off += 4
        t = _VT(t)
        if t != _VT.ARRAY:
            out[key] = (scalar(t), t, None)
            continue
        st, n = struct.unpack_from("<IQ", buf, off)
        off += 12
        st = _VT(st)
        if st == _VT.STRING:
            vals: List[Any] = [string() for _ in range(n)]
        elif st == _VT.ARRAY:
            raise ValueError(f"{path}: nested array in {key} is not supported")
        else:
            dt = np.dtype(_NP[st])
            vals = np.frombuffer(buf, dtype=dt, count=n, offset=off).tolist()
            off += dt.itemsize * n
        out[key] = (vals, t, st)
    return out


@functools.lru_cache(maxsize=4)
def _tokenizer_fields_cached(path: str, size: int, mtime_ns: int) -> Tuple[Tuple[str, Field], ...]:
    kv = _read_kv(path)
    keep = [(k, v) for k, v in kv.items() if k.startswith("tokenizer.ggml.") or k == "tokenizer.chat_template"]
    return tuple(keep)


def tokenizer_fields(source: Union[str, os.PathLike, None] = None) -> Dict[str, Field]:
    """``tokenizer.ggml.*`` and ``tokenizer.chat_template`` of ``source`` (default: SmolLM2-135M)."""
    if source is None:
        from pykvcompact.models.registry import resolve_model

        source = resolve_model("smollm2-135m")
    st = os.stat(source)
    return dict(_tokenizer_fields_cached(str(source), st.st_size, st.st_mtime_ns))


def make_tiny_gguf(
    path: Union[str, os.PathLike],
    *,
    seed: int = 0,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx_train: int = 8192,
    arch: str = "llama",
    tokenizer_source: Union[str, os.PathLike, None] = None,
) -> pathlib.Path:
    """Write a random-weight float32 llama-architecture GGUF to ``path`` and return it.

    Weights are ``normal * gain / sqrt(fan_in)`` from ``numpy.random.default_rng(seed)``, norms are 1. The tokenizer
    (every ``tokenizer.ggml.*`` key and the chat template) is copied from ``tokenizer_source``
    (default SmolLM2-135M). The file is written to a temp name and renamed, so concurrent writers of
    the same path never expose a partial file.
    """
    if arch != "llama":
        raise ValueError(f"only arch='llama' is supported, got {arch!r}")
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must be a multiple of n_head, and n_head a multiple of n_head_kv")
    path = pathlib.Path(path)
    tok = tokenizer_fields(tokenizer_source)
    n_vocab = len(tok["tokenizer.ggml.tokens"][0])
    head_dim = n_embd // n_head
    rng = np.random.default_rng(seed)

    def rand(*shape: int, gain: float = 1.0) -> np.ndarray:
        # std gain/sqrt(fan_in): activations keep unit scale through the layers, so attention is
        # peaked and every context token moves the logits (with a flat 0.02 init the model ignored
        # all but the last token, and exactness tests could not see a wrong middle of the context).
        fan_in = shape[-1]
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(gain / np.sqrt(fan_in))

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    # numpy shapes are ggml's ne reversed: ne = [n_in, n_out] -> array (n_out, n_in).
    tensors: List[Tuple[str, np.ndarray]] = [("token_embd.weight", rand(n_vocab, n_embd, gain=np.sqrt(n_embd)))]
    for i in range(n_layer):
        b = f"blk.{i}."
        tensors += [
            (b + "attn_norm.weight", ones(n_embd)),
            (b + "attn_q.weight", rand(n_head * head_dim, n_embd)),
            (b + "attn_k.weight", rand(n_head_kv * head_dim, n_embd)),
            (b + "attn_v.weight", rand(n_head_kv * head_dim, n_embd)),
            (b + "attn_output.weight", rand(n_embd, n_head * head_dim)),
            (b + "ffn_norm.weight", ones(n_embd)),
            (b + "ffn_gate.weight", rand(n_ff, n_embd)),
            (b + "ffn_up.weight", rand(n_ff, n_embd)),
            (b + "ffn_down.weight", rand(n_embd, n_ff)),
        ]
    tensors += [("output_norm.weight", ones(n_embd)), ("output.weight", rand(n_vocab, n_embd))]

    def kv(w: "gguf.GGUFWriter") -> None:
        w.add_context_length(n_ctx_train)
        w.add_embedding_length(n_embd)
        w.add_block_count(n_layer)
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head_kv)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-5)

    return write_gguf(path, arch, seed, kv, tensors, tok)


def write_gguf(path: Union[str, os.PathLike], arch: str, seed: int, kv: Callable[[gguf.GGUFWriter], None], tensors: List[Tuple[str, np.ndarray]],
           tok: Dict[str, Any]) -> pathlib.Path:
    """Write a float32 GGUF atomically (temp file + rename): name, file type, vocab size, the
    architecture's keys (``kv``), the tokenizer fields, then the tensors."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, arch=arch)
        w.add_name(f"tiny-random-{arch}-seed{seed}")
        w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
        w.add_vocab_size(len(tok["tokenizer.ggml.tokens"][0]))
        kv(w)
        for key, (val, vtype, sub) in tok.items():
            w.add_key_value(key, val, vtype, sub_type=sub)
        for name, arr in tensors:
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path




def llama_no_extra_bufts(model_path: Union[str, os.PathLike], **kwargs: Any) -> "llama_cpp.Llama":
    """``llama_cpp.Llama(model_path, **kwargs)`` with ``use_extra_bufts = False``, as our Engine loads models
    (quantized models crash in ggml's AMX/repack kernels on some CPUs): the package's own loader."""
    from pykvcompact.remote.llama_cpp_peer import load_llama

    llm = load_llama(model_path, use_extra_bufts=False, **kwargs)
    assert llm.model_params.use_extra_bufts is False
    return llm


if __name__ == "__main__":  # python tests/tiny_model.py OUT.gguf [SEED]
    import sys
    import time

    t = time.perf_counter()
    p = make_tiny_gguf(sys.argv[1], seed=int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    print(f"{p} {p.stat().st_size} bytes in {time.perf_counter() - t:.3f}s")
