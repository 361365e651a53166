"""The saved state of one sequence (``Sequence.save_state`` / ``Engine.load_sequence``), as bytes.

Layout (integers little-endian)::

    magic b"PKVCSEQ\\0" | u32 format version | u32 header length | header (JSON, UTF-8) | payload
    header:  {"fingerprint": {...}, "payload_bytes": N, "payload_sha256": "<hex>"}
    payload: u32 n_tokens | u32 n_evaluated | u32 n_logits | u64 n_state
             | n_tokens x i32 token ids | n_logits x f32 next-token logits | n_state bytes of llama.cpp state

The fingerprint names the model (a key of its file size, GGUF metadata and vocabulary size), the
context size and the library versions; a blob whose fingerprint differs from the engine's is refused
(``StateMismatchError``: prefill the tokens again). The payload is checked against its sha256 before
any of it is read (``InvalidStateError``): only a blob that passes every check reaches llama.cpp.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .versions import LLAMA_CPP_PYTHON_VERSION, VERSION
from ..errors import InvalidStateError, StateMismatchError

MAGIC = b"PKVCSEQ\x00"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<II")          # format version, header length
_COUNTS = struct.Struct("<IIIQ")        # n_tokens, n_evaluated, n_logits, n_state
_MAX_HEADER = 1 << 20

# What must be equal for a state to load, and how a difference is named.
_CHECKED = (("model", "model"), ("n_ctx", "n_ctx"), ("pykvcompact", "pykvcompact version"),
            ("llama_cpp", "llama-cpp-python version"))


@dataclass
class SavedState:
    fingerprint: dict
    tokens: list
    evaluated: int
    logits: np.ndarray       # float32, (n_vocab,) or empty
    state: memoryview        # llama.cpp's bytes, a view into the blob
    exact_upto: Optional[int] = None   # where a splice's approximate cells begin (None: all exact)


def engine_fingerprint(engine) -> dict:
    """``Engine.fingerprint``: what a saved state must match to load into this engine."""
    n_vocab = int(engine.n_vocab)
    key = {"file_size": os.path.getsize(engine.model_path), "metadata": dict(engine.metadata), "n_vocab": n_vocab}
    model = hashlib.sha256(json.dumps(key, sort_keys=True, ensure_ascii=True).encode("ascii")).hexdigest()
    return {"model": model, "model_file": os.path.basename(str(engine.model_path)), "n_vocab": n_vocab,
            "n_ctx": int(engine.n_ctx), "pykvcompact": VERSION, "llama_cpp": LLAMA_CPP_PYTHON_VERSION}


def pack(fingerprint: dict, tokens: list, evaluated: int, logits: Any, state: bytes,
         exact_upto: Optional[int] = None) -> bytes:
    toks = np.asarray(tokens, dtype="<i4").tobytes()
    lg = np.asarray(logits, dtype="<f4").reshape(-1).tobytes()
    counts = _COUNTS.pack(len(tokens), int(evaluated), len(lg) // 4, len(state))
    digest = hashlib.sha256()
    for part in (counts, toks, lg, state):
        digest.update(part)
    header = json.dumps({"fingerprint": fingerprint, "payload_bytes": len(counts) + len(toks) + len(lg) + len(state),
                         "payload_sha256": digest.hexdigest(), "exact_upto": exact_upto}, sort_keys=True).encode("utf-8")
    return b"".join([MAGIC, _PREFIX.pack(FORMAT_VERSION, len(header)), header, counts, toks, lg, state])


def unpack(blob: Any, fingerprint: dict) -> SavedState:
    """Check ``blob`` and read it. ``InvalidStateError`` when it is not a sequence state, cut short or
    corrupt; ``StateMismatchError`` when it was saved by another model, context size or version."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise TypeError(f"a saved sequence state is bytes (from Sequence.save_state()), got {type(blob).__name__}")
    view = memoryview(blob).cast("B")
    head = bytes(view[:len(MAGIC)])
    if head != MAGIC[:len(head)] or not head:
        raise InvalidStateError("not a saved sequence state (no pykvcompact magic at the start): pass the bytes "
                                "Sequence.save_state() returned")
    if len(view) < len(MAGIC) + _PREFIX.size:
        raise InvalidStateError(f"the saved sequence state is cut short ({len(view)} bytes)")
    version, header_len = _PREFIX.unpack_from(view, len(MAGIC))
    if version != FORMAT_VERSION:
        raise _mismatch([f"state format version (saved {version}, this pykvcompact reads {FORMAT_VERSION})"], None)
    start = len(MAGIC) + _PREFIX.size
    if header_len > _MAX_HEADER or start + header_len > len(view):
        raise InvalidStateError(f"the saved sequence state is cut short or corrupt (header of {header_len} bytes, "
                                f"{len(view) - start} left)")
    header = _read_header(view[start:start + header_len])
    payload = view[start + header_len:]
    if len(payload) != header["payload_bytes"]:
        raise InvalidStateError(f"the saved sequence state is cut short or has extra bytes (payload of {len(payload)} "
                                f"bytes, {header['payload_bytes']} expected)")
    if hashlib.sha256(payload).hexdigest() != header["payload_sha256"]:
        raise InvalidStateError("the saved sequence state is corrupt (sha256 of its payload does not match)")
    saved = _read_payload(payload, header["fingerprint"])
    saved.exact_upto = header.get("exact_upto")
    diffs = differences(header["fingerprint"], fingerprint)
    if diffs:
        raise _mismatch(diffs, saved.tokens)
    return saved


def differences(saved: dict, current: dict) -> list:
    """What differs between two fingerprints, in words (empty when the state can load)."""
    out = []
    for key, name in _CHECKED:
        a, b = saved.get(key), current.get(key)
        if a != b:
            if key == "model":
                a = f"{saved.get('model_file')!r} (key {str(a)[:12]})"
                b = f"{current.get('model_file')!r} (key {str(b)[:12]})"
            out.append(f"{name} (saved {a}, this engine {b})")
    return out


def _mismatch(diffs: list, tokens: Optional[list]) -> StateMismatchError:
    err = StateMismatchError("the saved sequence state does not match this engine: " + "; ".join(diffs) +
                             ". Prefill its tokens again instead (engine.sequence(tokens); the error's .tokens "
                             "holds them when the state was readable)")
    err.differences = diffs
    err.tokens = tokens
    return err


def _read_header(raw: memoryview) -> dict:
    try:
        header = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise InvalidStateError("the saved sequence state is corrupt (its header is not JSON)") from None
    ok = (isinstance(header, dict) and isinstance(header.get("fingerprint"), dict)
          and isinstance(header.get("payload_bytes"), int) and isinstance(header.get("payload_sha256"), str)
          and (header.get("exact_upto") is None
               or (type(header["exact_upto"]) is int and header["exact_upto"] >= 0)))
    if not ok:
        raise InvalidStateError("the saved sequence state is corrupt (its header lacks the fingerprint or checksum)")
    return header


def _read_payload(payload: memoryview, fingerprint: dict) -> SavedState:
    if len(payload) < _COUNTS.size:
        raise InvalidStateError("the saved sequence state is corrupt (payload too short)")
    n_tok, n_eval, n_logits, n_state = _COUNTS.unpack_from(payload, 0)
    if _COUNTS.size + 4 * (n_tok + n_logits) + n_state != len(payload):
        raise InvalidStateError("the saved sequence state is corrupt (its sizes do not add up)")
    if n_eval > n_tok or n_tok - n_eval > 1 or (n_logits and (n_eval != n_tok or n_logits != fingerprint.get("n_vocab"))):
        raise InvalidStateError(f"the saved sequence state is inconsistent ({n_eval} evaluated of {n_tok} tokens, "
                                f"{n_logits} logits)")
    at = _COUNTS.size
    tokens = np.frombuffer(payload, dtype="<i4", count=n_tok, offset=at).tolist()
    at += 4 * n_tok
    logits = np.frombuffer(payload, dtype="<f4", count=n_logits, offset=at).astype(np.float32)
    at += 4 * n_logits
    return SavedState(fingerprint, tokens, n_eval, logits, payload[at:])
