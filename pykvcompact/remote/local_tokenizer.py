"""A local tokenizer for the remote backend: the vocabulary of the same GGUF the server runs, loaded
vocab-only through the pinned llama-cpp-python (no weights, no llama context, no thread pool).

Tokenizing on the client costs microseconds and never waits for the server (whose tokenize endpoint may
share the model's lock with generation, as llama-cpp-python's does), so replies can be streamed token by
token.  It also gives the model's chat template, BOS/EOS and end-of-generation tokens.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
from typing import Iterable, List, Optional


class LocalTokenizer:
    """``LocalTokenizer(model)``: ``model`` a GGUF path or a registry name (``"smollm2-135m"``)."""

    concurrent = True  # usable while a stream is open (no server round trip)
    kind = "local"

    def __init__(self, model):
        import llama_cpp
        from ..models.registry import resolve_model
        self._ll = llama_cpp
        self.path = str(resolve_model(model) if not os.path.exists(str(model)) else model)
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        lg = logging.getLogger("llama-cpp-python")
        old = lg.level
        lg.setLevel(logging.ERROR)  # the loader's metadata dump is noise here
        try:
            m = llama_cpp.llama_model_load_from_file(self.path.encode("utf-8"), params)
        finally:
            lg.setLevel(old)
        if not m:
            raise ValueError(f"cannot load the vocabulary of {self.path}")
        self._model = m
        self._vocab = llama_cpp.llama_model_get_vocab(m)
        self._lock = threading.Lock()
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.token_bos = int(llama_cpp.llama_vocab_bos(self._vocab))
        self.token_eos = int(llama_cpp.llama_vocab_eos(self._vocab))
        self.chat_template = self._meta("tokenizer.chat_template")
        self.name = os.path.basename(self.path)

    def _meta(self, key: str) -> Optional[str]:
        size = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(size)
            n = self._ll.llama_model_meta_val_str(self._model, key.encode("utf-8"), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", errors="replace")
            size = n + 1

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> List[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        with self._lock:
            while True:
                buf = (self._ll.llama_token * cap)()
                n = self._ll.llama_tokenize(self._vocab, raw, len(raw), buf, cap, bool(add_special), bool(parse_special))
                if n >= 0:
                    return [int(t) for t in buf[:n]]
                cap = -n

    def detokenize(self, tokens: Iterable[int], *, special: bool = True) -> str:
        toks = [int(t) for t in tokens]
        if not toks:
            return ""
        arr = (self._ll.llama_token * len(toks))(*toks)
        cap = len(toks) * 8 + 16
        with self._lock:
            while True:
                buf = ctypes.create_string_buffer(cap)
                n = self._ll.llama_detokenize(self._vocab, arr, len(toks), buf, cap, False, bool(special))
                if n >= 0:
                    return buf.raw[:n].decode("utf-8", errors="replace")
                cap = -n + 1

    def token_to_piece(self, token: int, *, special: bool = True) -> str:
        return self.detokenize([token], special=special)

    def is_eog(self, token: int) -> bool:
        return bool(self._ll.llama_vocab_is_eog(self._vocab, int(token)))

    def close(self) -> None:
        m, self._model = getattr(self, "_model", None), None
        if m:
            try:
                self._ll.llama_model_free(m)
            except Exception:  # noqa: BLE001
                pass

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


class WrappedTokenizer:
    """Any object with ``tokenize(text, add_special=, parse_special=)`` and ``detokenize(tokens)``
    (a :class:`pykvcompact.Engine` loaded on the same model, say)."""

    concurrent = True
    kind = "object"

    def __init__(self, obj):
        self._o = obj
        self.token_bos = int(getattr(obj, "token_bos", -1))
        self.token_eos = int(getattr(obj, "token_eos", -1))
        self.chat_template = getattr(obj, "chat_template", None)
        self.name = getattr(obj, "model_name", type(obj).__name__)

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> List[int]:
        return list(self._o.tokenize(text, add_special=add_special, parse_special=parse_special))

    def detokenize(self, tokens: Iterable[int]) -> str:
        return self._o.detokenize(list(tokens))

    def token_to_piece(self, token: int) -> str:
        f = getattr(self._o, "token_to_piece", None)
        return f(token) if f is not None else self._o.detokenize([token])

    def is_eog(self, token: int) -> bool:
        f = getattr(self._o, "is_eog", None)
        return bool(f(token)) if f is not None else token == self.token_eos

    def close(self) -> None:
        pass


__all__ = ["LocalTokenizer", "WrappedTokenizer"]
