"""``RemoteEngine``: the engine protocol of :mod:`pykvcompact.engine.port` over an OpenAI-compatible
server with prefix caching (vLLM, SGLang, llama-server, llama-cpp-python's server).

    eng = pk.RemoteEngine("http://127.0.0.1:8000/v1", "qwen2.5-coder-1.5b", tokenizer="qwen2.5-coder-1.5b")
    s = pk.Session(eng, policy=pk.Policy(mode="background", window=8192))

How each verb maps to HTTP (all on ``POST /v1/completions`` with a raw prompt string: rendering is ours):

- a live sequence is a token list held here; ``append`` costs nothing until a request;
- ``generate``/``stream``: ``stream: true`` (server-sent events), text chunks turned back into ids;
- ``probe``: ``max_tokens=1`` with ``logprobs=probe_top_k``; label probabilities from the top-k
  (approximate, see :mod:`.probe`); the server's prefix cache prefills only the rubric;
- ``generate_background`` (the summary): a concurrent request in a thread on the same prefix;
- ``prepare_rebase``: a warm-up request (``max_tokens=1``) for ``[prefix][summary][recent turns]`` sent
  before the swap; ``commit_rebase`` swaps the list and times one ``max_tokens=1`` request on it: the
  stall (small when the warm-up is still cached, the whole prefill when it was evicted).

Tokenizing: ``tokenizer=`` a GGUF path or registry name of the served model (its vocabulary, loaded
locally: fast, never waits for the server), a :class:`.LocalTokenizer` (shared by several engines), or any
object with ``tokenize``/``detokenize``; ``None`` uses the server's endpoints (llama-server, vLLM/SGLang ``/tokenize``,
llama-cpp-python ``/extras/tokenize``), one round trip per call.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Iterable, List, Optional

from .. import errors
from .dialect import completion_extras, detect
from .http import HttpClient
from .local_tokenizer import LocalTokenizer, WrappedTokenizer
from .sequence import RemoteSequence
from .server_tokenizer import ServerTokenizer

DEFAULT_N_CTX = 4096
_TOK_CACHE = 4096        # tokenize results kept (texts up to _TOK_CACHE_CHARS)
_TOK_CACHE_CHARS = 8192


class RemoteEngine:
    """``RemoteEngine(base_url, model, api_key=None, *, tokenizer=None, server=None, n_ctx=None, ...)``.

    ``base_url``: ``http://host:port`` or ``http://host:port/v1``.  ``server``: the dialect
    (``"llama-server"``, ``"vllm"``, ``"llama-cpp-python"``, ``"openai"``), detected when None.  ``n_ctx``:
    the server's context per request (asked of the server when it says: llama-server, vLLM; else 4096).
    ``timeout``: seconds for an answer or a stream's next chunk.  ``probe_top_k``: logprobs asked for a
    probe.  ``warm_rebase``: send the warm-up request of a prepared rebase.  ``measure_stall``: time one
    request at the commit (the stall).  ``cache_prompt``: sent as is to servers that know it
    (llama-server; None: its default, on).  ``prompt_format``: ``"text"`` (the prompt as a string, every
    server) or ``"ids"`` (token ids: llama-server and vLLM take them; exact, no re-tokenization).
    ``extra_body``: fields added to every completion request.
    """

    def __init__(self, base_url: str, model: str, api_key: Optional[str] = None, *, tokenizer=None,
                 server: Optional[str] = None, n_ctx: Optional[int] = None, timeout: float = 120.0,
                 connect_timeout: float = 5.0, probe_top_k: int = 20, warm_rebase: bool = True,
                 measure_stall: bool = True, cache_prompt: Optional[bool] = None, prompt_format: str = "text",
                 chat_template: Optional[str] = None, extra_body: Optional[dict] = None):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        if not isinstance(model, str) or not model:
            raise ValueError("model must be the model's name on the server")
        if prompt_format not in ("text", "ids"):
            raise ValueError(f"prompt_format must be 'text' or 'ids', got {prompt_format!r}")
        if isinstance(probe_top_k, bool) or not isinstance(probe_top_k, int) or probe_top_k < 1:
            raise ValueError(f"probe_top_k must be an integer >= 1, got {probe_top_k!r}")
        self.base_url, self.model, self.model_name = base_url, model, model
        self.http = HttpClient(base_url, api_key, timeout=timeout, connect_timeout=connect_timeout)
        self._closed = False
        try:
            self.info = detect(self.http, model, server)          # a server that is not there fails here
            self.dialect = self.info.dialect
            if tokenizer is None:
                self.tokenizer = ServerTokenizer(self.http, model, self.dialect)
            elif isinstance(tokenizer, LocalTokenizer):
                self.tokenizer = tokenizer  # shared by several engines (one per session, say)
            elif isinstance(tokenizer, (str, bytes)) or hasattr(tokenizer, "__fspath__"):
                self.tokenizer = LocalTokenizer(tokenizer)
            elif hasattr(tokenizer, "tokenize") and hasattr(tokenizer, "detokenize"):
                self.tokenizer = WrappedTokenizer(tokenizer)
            else:
                raise TypeError("tokenizer must be a GGUF path, a registry name, or an object with tokenize/detokenize")
        except BaseException:
            self.http.close()
            raise
        self._owns_tokenizer = self.tokenizer is not tokenizer
        self._n_ctx = int(n_ctx or self.info.n_ctx or DEFAULT_N_CTX)
        self.n_ctx_source = "argument" if n_ctx else ("server" if self.info.n_ctx else "default")
        self.probe_top_k, self.warm_rebase, self.measure_stall = probe_top_k, bool(warm_rebase), bool(measure_stall)
        self.cache_prompt, self.prompt_format = cache_prompt, prompt_format
        self.extra_body = dict(extra_body or {})
        self._chat_template = chat_template
        self.metadata: dict = {}
        self._seqs: "weakref.WeakValueDictionary[int, RemoteSequence]" = weakref.WeakValueDictionary()
        self._tok_cache: "OrderedDict[tuple, List[int]]" = OrderedDict()
        self._lock = threading.Lock()
        self._stats = {"requests": 0, "probe_requests": 0, "warmups": 0, "commits": 0,
                       "generated_tokens": 0, "probe_labels_missing": 0, "stall_ms": [], "tokenize_calls": 0}
        if prompt_format == "ids" and self.dialect == "llama-cpp-python":
            self.close()
            raise ValueError("prompt_format='ids' needs a server that takes token ids as the prompt (llama-server, "
                             "vLLM); llama-cpp-python's server takes text: use prompt_format='text'")

    # ------------------------------------------------------------------ model and text
    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    # Each request gets the server's whole context: sessions on one RemoteEngine do not share a cell pool
    # here (the server's own KV is shared with all its clients and managed by its cache), so the sessions'
    # reservations are not added up (session/sizing.py).
    cells_shared = False

    @property
    def n_seq_max(self) -> int:
        return 1 << 20  # sequences are client-side lists: no slot limit here

    @property
    def capabilities(self) -> dict:
        return {"n_ctx": self._n_ctx, "n_seq_max": self.n_seq_max, "can_shift": False, "recurrent": False,
                "hybrid": False, "sliding_window": False, "rebase_modes": ["exact"], "remote": True,
                "dialect": self.dialect, "tokenizer": self.tokenizer.kind, "prompt_format": self.prompt_format,
                "exact_logits": False}

    @property
    def chat_template(self) -> Optional[str]:
        return self._chat_template or self.info.chat_template or getattr(self.tokenizer, "chat_template", None)

    @property
    def token_bos(self) -> int:
        return int(getattr(self.tokenizer, "token_bos", -1))

    @property
    def token_eos(self) -> int:
        return int(getattr(self.tokenizer, "token_eos", -1))

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> List[int]:
        self.check_open()
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        key = (text, bool(add_special), bool(parse_special))
        with self._lock:
            hit = self._tok_cache.get(key)
            if hit is not None:
                self._tok_cache.move_to_end(key)
                return list(hit)
        toks = self.tokenizer.tokenize(text, add_special=add_special, parse_special=parse_special)
        with self._lock:
            self._stats["tokenize_calls"] += 1
            if len(text) <= _TOK_CACHE_CHARS:
                self._tok_cache[key] = list(toks)
                while len(self._tok_cache) > _TOK_CACHE:
                    self._tok_cache.popitem(last=False)
        return list(toks)

    def detokenize(self, tokens: Iterable[int]) -> str:
        self.check_open()
        toks = [int(t) for t in tokens]
        return self.tokenizer.detokenize(toks) if toks else ""

    def tok(self, text: str) -> List[int]:
        return self.tokenize(text, add_special=False, parse_special=True) if text else []

    def detok(self, tokens) -> str:
        return self.detokenize(tokens)

    def token_to_piece(self, token: int) -> str:
        return self.tokenizer.token_to_piece(int(token))

    def is_eog(self, token: int) -> bool:
        return self.tokenizer.is_eog(int(token))

    # ------------------------------------------------------------------ sequences
    def sequence(self, tokens: Iterable[int] = ()) -> RemoteSequence:
        self.check_open()
        return RemoteSequence(self, tokens)

    def register(self, seq: RemoteSequence) -> None:
        """A new sequence of this engine (RemoteSequence calls it)."""
        with self._lock:
            self._seqs[seq.id] = seq

    def unregister(self, seq: RemoteSequence) -> None:
        with self._lock:
            self._seqs.pop(seq.id, None)

    def used_cells(self) -> int:
        """The longest live sequence: what one request's context holds.  (The server's own KV is shared with
        its other clients and not known here; each request has the whole ``n_ctx``.)"""
        with self._lock:
            seqs = list(self._seqs.values())
        return max((len(s) for s in seqs if not s.closed), default=0)

    def free_cells(self) -> int:
        return self._n_ctx - self.used_cells()

    # ------------------------------------------------------------------ requests
    def prompt(self, tokens: List[int]):
        return list(tokens) if self.prompt_format == "ids" else self.detokenize(tokens)

    def extras(self, grammar: Optional[str] = None) -> dict:
        out = completion_extras(self.dialect, grammar=grammar, cache_prompt=self.cache_prompt)
        out.update(self.extra_body)
        return out

    def completion_body(self, prompt_tokens: List[int], gen_tokens: List[int], gen_text: str, max_tokens: int,
                        sampling: dict, grammar: Optional[str], *, stream: bool) -> dict:
        """A ``/v1/completions`` body for ``prompt_tokens`` continued by what was generated so far."""
        if self.prompt_format == "ids":
            prompt = list(prompt_tokens) + list(gen_tokens)
        else:
            prompt = self.detokenize(prompt_tokens) + gen_text
        body = {"model": self.model, "prompt": prompt, "max_tokens": max(1, int(max_tokens)), "stream": bool(stream)}
        body.update(sampling)
        body.update(self.extras(grammar))
        return body

    # ------------------------------------------------------------------ counters
    def count_request(self, body: dict, probe: bool = False) -> None:
        with self._lock:
            self._stats["requests"] += 1
            self._stats["probe_requests"] += int(probe)

    def count_generated(self, n: int) -> None:
        with self._lock:
            self._stats["generated_tokens"] += n

    def count_warmup(self) -> None:
        with self._lock:
            self._stats["warmups"] += 1

    def count_missing_labels(self, n: int) -> None:
        with self._lock:
            self._stats["probe_labels_missing"] += n

    def count_commit(self, info: dict) -> None:
        with self._lock:
            self._stats["commits"] += 1
            self._stats["stall_ms"].append(round(float(info.get("stall_ms", 0.0)), 2))

    def stats(self) -> dict:
        """Requests sent (probes, warm-ups), commits and their stalls, tokens generated, live sequences."""
        with self._lock:
            out = {k: (list(v) if isinstance(v, list) else v) for k, v in self._stats.items()}
            out["live_sequences"] = sum(1 for s in self._seqs.values() if not s.closed)
        out["used_cells"] = self.used_cells()
        return out

    # ------------------------------------------------------------------ lifetime
    def check_open(self) -> None:
        """Raises EngineClosedError once this engine is closed."""
        if self._closed:
            raise errors.EngineClosedError("the remote engine is closed; create a new RemoteEngine")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Cancel what runs in the background, close the connections (the server keeps running)."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            seqs = list(self._seqs.values())
        for s in seqs:
            try:
                s.close()
            except Exception:  # noqa: BLE001
                pass
        self.http.close()
        if self._owns_tokenizer:
            try:
                self.tokenizer.close()
            except Exception:  # noqa: BLE001
                pass

    def __enter__(self) -> "RemoteEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"RemoteEngine({self.base_url!r}, model={self.model!r}, dialect={self.dialect!r}, "
                f"n_ctx={self._n_ctx}, tokenizer={self.tokenizer.kind!r})")


__all__ = ["RemoteEngine"]
