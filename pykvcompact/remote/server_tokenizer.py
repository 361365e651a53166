"""Tokenizing through the server's own endpoints (when no local tokenizer is given).

- llama-server: ``POST /tokenize {content, add_special, parse_special}``, ``POST /detokenize {tokens}``;
  they run beside generation (``concurrent``).
- vLLM / SGLang: ``POST /tokenize {model, prompt, add_special_tokens}``, ``POST /detokenize {model, tokens}``.
- llama-cpp-python: ``POST /extras/tokenize {input}`` (adds BOS when the model does; we drop it unless
  ``add_special``) and ``POST /extras/detokenize {tokens}``, which renders special tokens as nothing.  So
  special-looking pieces of the texts we tokenize (``<|im_start|>``, ``<s>``, ``[INST]``...) are learnt
  (their one-token id -> their text) and put back when detokenizing.  Its endpoints wait for the model's
  lock, like a generation does: not ``concurrent`` (a stream is tokenized when it ends, not while open).
"""
from __future__ import annotations

import re
import threading
from typing import Dict, Iterable, List

from .errors import RemoteProtocolError

_SPECIAL_RE = re.compile(r"<\|[^<>|\s]{1,64}\|>|</?[A-Za-z_][\w.-]{0,62}>|\[/?[A-Z_]{2,32}\]")


class ServerTokenizer:
    kind = "server"

    def __init__(self, http, model: str, dialect: str):
        if dialect == "openai":
            raise ValueError(f"the server at {http.root} has no tokenize endpoint that pykvcompact knows; pass "
                             "tokenizer= (the GGUF path or registry name of the model it serves, or an object with "
                             "tokenize/detokenize)")
        self.http, self.model, self.dialect = http, model, dialect
        self.concurrent = dialect != "llama-cpp-python"
        self.token_bos = self.token_eos = -1
        self.chat_template = None
        self.name = model
        self._specials: Dict[int, str] = {}     # id -> text (llama-cpp-python's detokenize drops them)
        self._seen: set = set()
        self._lock = threading.Lock()
        self._bos_added = None                  # llama-cpp-python: does /extras/tokenize add BOS?

    # ------------------------------------------------------------------ raw endpoints
    def _tok(self, text: str, add_special: bool, parse_special: bool) -> List[int]:
        d = self.dialect
        if d == "llama-server":
            r = self.http.post("/tokenize", {"content": text, "add_special": add_special, "parse_special": parse_special})
        elif d == "vllm":
            r = self.http.post("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": add_special})
        else:
            r = self.http.post("/extras/tokenize", {"input": text, "model": self.model})
        toks = r.get("tokens") if isinstance(r, dict) else None
        if not isinstance(toks, list):
            raise RemoteProtocolError(f"{self.http.root}: the tokenize answer has no token list: {str(r)[:200]}",
                                      url=self.http.root)
        return [int(t["id"]) if isinstance(t, dict) else int(t) for t in toks]  # llama-server with_pieces form

    def _detok(self, tokens: List[int]) -> str:
        d = self.dialect
        if d == "llama-server":
            r = self.http.post("/detokenize", {"tokens": tokens})
            return str(r.get("content", ""))
        if d == "vllm":
            r = self.http.post("/detokenize", {"model": self.model, "tokens": tokens})
            return str(r.get("prompt", ""))
        r = self.http.post("/extras/detokenize", {"tokens": tokens, "model": self.model})
        return str(r.get("text", ""))

    # ------------------------------------------------------------------ the tokenizer
    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> List[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if self.dialect != "llama-cpp-python":
            return self._tok(text, add_special, parse_special)
        if not text:
            return []
        self._learn(text)
        toks = self._tok(text, False, True)
        if self._bos_added is None:
            self._bos_added = bool(self._tok("", False, True))
            if self._bos_added:
                self.token_bos = self._tok("", False, True)[0]
        if self._bos_added and not add_special and toks and toks[0] == self.token_bos:
            toks = toks[1:]
        return toks

    def _learn(self, text: str) -> None:
        for m in set(_SPECIAL_RE.findall(text)):
            with self._lock:
                if m in self._seen:
                    continue
                self._seen.add(m)
            ids = self._tok(m, False, True)
            if self._bos_added is None:
                self._bos_added = bool(self._tok("", False, True))
                if self._bos_added:
                    self.token_bos = self._tok("", False, True)[0]
            if self._bos_added and ids and ids[0] == self.token_bos and len(ids) > 1:
                ids = ids[1:]
            if len(ids) == 1:
                with self._lock:
                    self._specials[ids[0]] = m

    def detokenize(self, tokens: Iterable[int]) -> str:
        toks = [int(t) for t in tokens]
        if not toks:
            return ""
        if self.dialect != "llama-cpp-python" or not self._specials:
            return self._detok(toks)
        out, run = [], []
        for t in toks:
            s = self._specials.get(t)
            if s is None:
                run.append(t)
                continue
            if run:
                out.append(self._detok(run))
                run = []
            out.append(s)
        if run:
            out.append(self._detok(run))
        return "".join(out)

    def token_to_piece(self, token: int) -> str:
        return self.detokenize([token])

    def is_eog(self, token: int) -> bool:
        return token == self.token_eos and token >= 0

    def close(self) -> None:
        pass


__all__ = ["ServerTokenizer"]
