"""A live sequence of the remote backend: a token list held by the client.

Appending costs nothing until a request: the server's prefix cache (llama-server ``cache_prompt``, vLLM
``--enable-prefix-caching``, SGLang's radix cache, llama-cpp-python's reuse of its last prompt) holds the
KV of what was sent before, so each request prefills only what is new since.  A fork is a copy of the list
(nothing on the server); a probe, a summary and a prepared rebase are requests on a prefix of it.
"""
from __future__ import annotations

import itertools
import numbers
import threading
import time
from typing import Dict, Iterable, Iterator, List, Sequence as _Seq

from .. import errors
from .generation import Generation
from .jobs import DoneJob, RemoteJob, RemoteRebase
from .probe import ask, label_scores, normalise, probe_body

_ids = itertools.count()


def _token_list(tokens, what: str = "tokens") -> List[int]:
    if isinstance(tokens, (str, bytes)):
        raise TypeError(f"{what} must be a list of token ids, not text; use engine.tokenize(text) first")
    out = []
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, int):
            try:
                import numpy as np
                if isinstance(t, np.integer):
                    out.append(int(t))
                    continue
            except ImportError:  # pragma: no cover
                pass
            raise TypeError(f"{what} must contain integer token ids, found {t!r}")
        if t < 0:
            raise ValueError(f"token id {t} is out of range")
        out.append(int(t))
    return out


class RemoteSequence:
    def __init__(self, engine, tokens: Iterable[int] = ()):
        self.engine = engine
        self.id = next(_ids)
        self.closed = False
        self._tokens: List[int] = []
        self._bg: List[RemoteJob] = []   # background generations writing to this sequence
        self._streaming = False          # a foreground stream is open (it appends as its tokens come)
        self._lock = threading.Lock()
        self.last_probe: Dict = {}
        self.last_stall: Dict = {}
        engine.register(self)
        toks = _token_list(tokens)
        if toks:
            self.append(toks)

    # ------------------------------------------------------------------ reading
    @property
    def tokens(self) -> List[int]:
        self._live()
        with self._lock:
            return list(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def text(self) -> str:
        return self.engine.detokenize(self.tokens)

    def _live(self) -> None:
        if self.closed:
            raise errors.SequenceClosedError(f"sequence {self.id} is closed")
        self.engine.check_open()

    def _idle(self) -> None:
        """Foreground changes wait for no one: a background generation still writing here is an error."""
        self._live()
        if self._streaming:
            raise errors.SequenceBusyError(f"a stream is open on sequence {self.id}: exhaust or close() it first")
        if any(not j.done() for j in self._bg):
            raise errors.SequenceBusyError(f"a background generation is running on sequence {self.id}; wait for "
                                           "it (job.result()) or cancel it")

    def _fits(self, n: int) -> None:
        if n > self.engine.n_ctx:
            raise errors.ContextFullError(f"{n} tokens do not fit in the server's context of {self.engine.n_ctx} "
                                          "tokens per request")

    # ------------------------------------------------------------------ writing
    def append(self, tokens: Iterable[int]) -> None:
        """Held client-side; the next request sends them (and the server prefills what it has not cached)."""
        toks = _token_list(tokens)
        self._idle()
        self._fits(len(self._tokens) + len(toks))
        with self._lock:
            self._tokens.extend(toks)

    def append_background(self, tokens: Iterable[int]) -> DoneJob:
        self.append(tokens)
        return DoneJob(tokens)

    def truncate(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"n must be an integer, got {n!r}")
        self._idle()
        if n < 0 or n > len(self._tokens):
            raise ValueError(f"truncate({n}) outside 0..{len(self._tokens)}")
        with self._lock:
            del self._tokens[n:]

    def fork(self, n=None) -> "RemoteSequence":
        self._live()
        toks = self.tokens if n is None else self.tokens[:n]
        return RemoteSequence(self.engine, toks)

    # ------------------------------------------------------------------ generation
    def _generation(self, max_tokens, temperature=0.0, top_p=1.0, seed=None, stop=(), grammar=None, top_k=0,
                    min_p=0.0) -> Generation:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
        if grammar is not None and not isinstance(grammar, str):
            raise TypeError("grammar must be a GBNF string")
        if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0: off), got {top_k!r}")
        top_k = min(int(top_k), 2 ** 31 - 1)   # (a larger k is all of any vocabulary; servers refuse it)
        if isinstance(min_p, bool) or not isinstance(min_p, numbers.Real) or not 0.0 <= min_p < 1.0:
            raise ValueError(f"min_p must be a number in [0, 1) (0: off), got {min_p!r}")
        min_p = float(min_p)
        toks = self.tokens
        room = self.engine.n_ctx - len(toks)
        if room <= 0 and max_tokens > 0:
            raise errors.ContextFullError(f"the sequence holds {len(toks)} tokens: no room left in the server's "
                                          f"context of {self.engine.n_ctx}")
        return Generation(self.engine, toks, min(max_tokens, max(room, 0)), temperature=temperature, top_p=top_p,
                          seed=seed, stop=stop, grammar=grammar, top_k=top_k, min_p=min_p)

    def _keep(self, gen: Generation) -> None:
        with self._lock:
            self._tokens.extend(gen.tokens)
        self.engine.count_generated(len(gen.tokens))

    def generate(self, max_tokens: int, *, stream: bool = False, **sampling):
        """Up to ``max_tokens`` tokens, appended (end of generation neither returned nor appended)."""
        if stream:
            return self.stream(max_tokens, **sampling)
        self._idle()
        gen = self._generation(max_tokens, **sampling)
        if gen.max_tokens == 0:
            return []
        try:
            gen.run()
        finally:
            self._keep(gen)  # a failure mid-way keeps what was generated, as the local engine does
        return list(gen.tokens)

    def stream(self, max_tokens: int, **sampling) -> Iterator[int]:
        """Like generate(), yielding each token as it comes; closing the iterator early closes the request
        (the tokens received stay)."""
        self._idle()
        gen = self._generation(max_tokens, **sampling)
        return self._stream(gen)

    def _stream(self, gen: Generation) -> Iterator[int]:
        if gen.max_tokens == 0:
            return
        if self._streaming or len(self._tokens) != len(gen.prompt_tokens):
            raise errors.SequenceBusyError(f"sequence {self.id} changed between stream() and its first token")
        self._streaming, kept = True, 0
        try:
            for new in gen.iter():
                with self._lock:
                    self._tokens.extend(new)
                kept += len(new)
                yield from new
        finally:
            self._streaming = False
            gen.cancel()
            self.engine.count_generated(kept)

    def generate_background(self, max_tokens: int, **sampling) -> RemoteJob:
        """A concurrent request in a thread (the server batches it with the conversation's own); its
        tokens are appended when it ends (cancelled: those received)."""
        self._idle()
        gen = self._generation(max_tokens, **sampling)
        job = RemoteJob(gen, on_done=lambda j: None if self.closed else self._keep(gen))
        self._bg = [j for j in self._bg if not j.done()] + [job]
        return job

    # ------------------------------------------------------------------ the probe
    def probe(self, tokens: Iterable[int], labels: _Seq[str] = ("COMPRESS", "CONTINUE")) -> Dict[str, float]:
        """Label probabilities for the continuation of ``self.tokens + tokens``: one request with
        ``max_tokens=1`` and the top-k logprobs (approximate: see :mod:`.probe`).  This sequence is
        untouched; with the server's prefix cache only ``tokens`` are prefilled."""
        self._live()
        toks = _token_list(tokens)
        if isinstance(labels, str) or len(labels) < 2:
            raise ValueError("labels must be a sequence of at least two strings")
        if len(set(labels)) != len(labels) or not all(isinstance(x, str) and x for x in labels):
            raise ValueError(f"labels must be distinct non-empty strings, got {list(labels)}")
        eng = self.engine
        full = self.tokens + toks
        self._fits(len(full) + 1)
        t0 = time.perf_counter()
        body = probe_body(eng.model, eng.prompt(full), eng.probe_top_k, eng.extras())
        top, resp = ask(eng.http, body, on_request=lambda: eng.count_request(body, probe=True))
        scores, missing = label_scores(top, labels)
        probs = normalise(scores)
        self.last_probe = {"logprobs": scores, "tokens": len(toks), "method": "top-k", "top_k": eng.probe_top_k,
                           "missing": missing, "top": top, "ms": (time.perf_counter() - t0) * 1000.0,
                           "cached_tokens": _cached(resp), "prompt_tokens": _usage(resp, "prompt_tokens")}
        if missing:
            eng.count_missing_labels(len(missing))
        return probs

    # ------------------------------------------------------------------ rebase
    def prepare_rebase(self, keep_prefix: int, replacement: Iterable[int], keep_from: int,
                       mode: str = "exact") -> RemoteRebase:
        """Send the warm-up request for ``tokens[:keep_prefix] + replacement + tokens[keep_from:]`` now (in
        a thread), so that the server's cache holds it when the swap comes."""
        if mode == "splice":
            raise errors.UnsupportedOperationError("a remote server cannot shift KV cells: use mode='exact'")
        if mode != "exact":
            raise ValueError(f"mode must be 'exact' or 'splice', got {mode!r}")
        for name, v in (("keep_prefix", keep_prefix), ("keep_from", keep_from)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be an integer, got {v!r}")
        repl = _token_list(replacement, "replacement")
        toks = self.tokens
        if not (0 <= keep_prefix <= keep_from <= len(toks)):
            raise ValueError(f"need 0 <= keep_prefix ({keep_prefix}) <= keep_from ({keep_from}) <= len ({len(toks)})")
        target = toks[:keep_prefix] + repl + toks[keep_from:]
        self._fits(len(target) + 1)
        warm = None
        if self.engine.warm_rebase:
            warm = RemoteJob(Generation(self.engine, target, 1, temperature=0.0), name="pykvcompact-warmup")
            self.engine.count_warmup()
        return RemoteRebase(self, keep_prefix, repl, keep_from, mode, len(target), warm)

    def commit_rebase(self, rebase: RemoteRebase) -> dict:
        """Replace the token list by the prepared one (with the tokens appended since).  Then one request
        (``max_tokens=1``) on it, timed: the stall, small when the warm-up's prefix is still cached, the
        whole prefill when the server evicted it (or there was no warm-up)."""
        if not isinstance(rebase, RemoteRebase):
            raise TypeError("commit_rebase takes the RemoteRebase returned by prepare_rebase")
        if rebase.sequence is not self:
            raise ValueError("this rebase was prepared for another sequence")
        if rebase.committed:
            raise ValueError("this rebase was already committed")
        if rebase.cancelled:
            raise errors.CancelledError("this rebase preparation was cancelled")
        self._idle()
        toks = self.tokens
        if rebase.keep_from > len(toks):
            raise errors.EngineError("the sequence was cut before the rebase's keep_from: prepare it again")
        new = toks[:rebase.keep_prefix] + rebase.replacement + toks[rebase.keep_from:]
        warmed = rebase.warmed
        with self._lock:
            self._tokens = new
        rebase.committed = True
        if rebase.warmup is not None and not rebase.warmup.done():
            rebase.warmup.cancel()
        info = {"mode": "exact", "tokens_before": len(toks), "tokens_after": len(new),
                "catch_up_tokens": max(0, len(new) - rebase.target_len), "warmed": warmed, "warmup_ms": rebase.warmup_ms,
                "stall_ms": 0.0}
        if self.engine.measure_stall:
            info.update(self._touch(new))
        self.last_stall = info
        self.engine.count_commit(info)
        return info

    def _touch(self, toks: List[int]) -> dict:
        """One ``max_tokens=1`` request on ``toks``: the prefill the server had left to do, timed."""
        t0 = time.perf_counter()
        body = self.engine.completion_body(toks, [], "", 1, {"temperature": 0.0}, None, stream=False)
        self.engine.count_request(body)
        try:
            resp = self.engine.http.post("/v1/completions", body)
        except errors.EngineError as e:
            return {"stall_ms": (time.perf_counter() - t0) * 1000.0, "stall_error": str(e)}
        return {"stall_ms": (time.perf_counter() - t0) * 1000.0, "cached_tokens": _cached(resp)}

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for j in self._bg:
            if not j.done():
                j.cancel()
        self.engine.unregister(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"RemoteSequence(id={self.id}, {'closed' if self.closed else f'{len(self._tokens)} tokens'})"


def _usage(resp: dict, key: str):
    u = resp.get("usage") if isinstance(resp, dict) else None
    return u.get(key) if isinstance(u, dict) else None


def _cached(resp: dict):
    """Prompt tokens the server took from its cache, where it says (vLLM, newer llama-server)."""
    d = _usage(resp, "prompt_tokens_details")
    if isinstance(d, dict) and d.get("cached_tokens") is not None:
        return int(d["cached_tokens"])
    t = resp.get("timings") if isinstance(resp, dict) else None
    if isinstance(t, dict) and t.get("cache_n") is not None:
        return int(t["cache_n"])  # llama-server
    return None


__all__ = ["RemoteSequence"]
