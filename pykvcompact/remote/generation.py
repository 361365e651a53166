"""One generation over ``POST /v1/completions`` with ``stream: true``: text chunks in, token ids out.

The OpenAI API returns text, not token ids.  Each streamed chunk is (on llama.cpp, llama-cpp-python and
vLLM) the text of one sampled token; it is tokenized on its own and the ids are kept when they spell the
chunk exactly (else the text waits for the next chunk).  So the ids are the model's own tokens in the
common case, and otherwise another tokenization of the same text: the text is always exact.  With a
tokenizer that cannot run while a stream is open (llama-cpp-python's endpoints share the model's lock)
the whole text is tokenized when the stream ends.

Semantics follow ``Sequence.generate``: an end-of-generation token stops it and is not returned; a stop
string stops it after the chunk that completes it (kept; stop strings are checked here, not sent: servers
cut them out); exactly ``max_tokens`` at most.  When the server stops at ``length`` with fewer ids than
asked (the text tokenized into fewer), or a stream ends without a finish reason (llama-cpp-python ends a
stream when another request arrives, unless started with ``--interrupt_requests false``), the generation
continues with a new request for the rest: the prompt is the old one plus the text so far, which the
server's prefix cache holds.
"""
from __future__ import annotations

import threading
import time
from typing import Iterator, List, Optional, Sequence

from ..errors import EngineClosedError
from .errors import RemoteError, RemoteProtocolError

MAX_ROUNDS = 8  # requests per generation (continuations included)


class Generation:
    def __init__(self, engine, prompt_tokens: Sequence[int], max_tokens: int, *, temperature: float = 0.0,
                 top_p: float = 1.0, seed: Optional[int] = None, stop=(), grammar: Optional[str] = None,
                 top_k: int = 0, min_p: float = 0.0):
        self.engine = engine
        self.prompt_tokens = list(prompt_tokens)
        self.max_tokens = int(max_tokens)
        self.sampling = {"temperature": float(temperature), "top_p": float(top_p)}
        # (sent only when set: llama-server, vLLM and llama-cpp-python take them; OpenAI refuses them)
        if top_k:
            self.sampling["top_k"] = int(top_k)
        if min_p:
            self.sampling["min_p"] = float(min_p)
        if seed is not None:
            self.sampling["seed"] = int(seed)
        self.grammar = grammar
        self.stop_strings = _stop_strings(engine, stop)
        self.tokens: List[int] = []
        self.text = ""
        self.finish_reason: Optional[str] = None
        self.requests = 0
        self.first_chunk_ms: Optional[float] = None
        self._pending = ""          # text not yet turned into ids
        self._pending_chunks = 0
        self._cancel = threading.Event()
        self._stream = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ control
    def cancel(self) -> None:
        """Stop after the current chunk; the open request is closed (from any thread)."""
        self._cancel.set()
        with self._lock:
            s = self._stream
        if s is not None:
            s.close()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def count(self) -> int:
        """Tokens generated so far (chunks not yet tokenized counted one each)."""
        return len(self.tokens) + self._pending_chunks

    def partial_tokens(self) -> List[int]:
        """The ids so far, the untokenized tail included (when the tokenizer may be asked now)."""
        toks = list(self.tokens)
        pend = self._pending
        if pend and self.engine.tokenizer.concurrent:
            toks += self.engine.tok(pend)
        return toks

    # ------------------------------------------------------------------ the loop
    def run(self) -> List[int]:
        for _ in self.iter():
            pass
        return list(self.tokens)

    def iter(self) -> Iterator[List[int]]:
        """Yields the new token ids as they come; ``finish_reason`` is set when it ends."""
        eng = self.engine
        t0 = time.perf_counter()
        rounds = 0
        try:
            while self.finish_reason is None and not self.cancelled:
                left = self.max_tokens - self.count
                if left <= 0:
                    self.finish_reason = "length"
                    break
                rounds += 1
                if rounds > MAX_ROUNDS:
                    hint = (" (llama-cpp-python's server ends a stream whenever another request arrives: start it "
                            "with --interrupt_requests false)" if eng.dialect == "llama-cpp-python" else
                            " (its streams ended without a finish reason or without tokens)")
                    raise RemoteProtocolError(f"{eng.http.url('/v1/completions')}: the generation did not finish in "
                                              f"{MAX_ROUNDS} requests{hint}", url=eng.http.url("/v1/completions"))
                body = eng.completion_body(self.prompt_tokens, self.tokens, self.text + self._pending, left,
                                           self.sampling, self.grammar, stream=True)
                eng.count_request(body)
                self.requests += 1
                stream = eng.http.stream("/v1/completions", body)
                with self._lock:
                    self._stream = stream
                if self.cancelled:
                    stream.close()
                finish, chunks = None, 0
                for ev in stream:
                    ch = _choice(ev, stream.url)
                    piece = ch.get("text") or ""
                    if piece:
                        if self.first_chunk_ms is None:
                            self.first_chunk_ms = (time.perf_counter() - t0) * 1000.0
                        chunks += 1
                        new = self._feed(piece)
                        if new:
                            yield new
                        if self.finish_reason is not None or self.count >= self.max_tokens:
                            break
                    if ch.get("finish_reason"):
                        finish = ch["finish_reason"]
                with self._lock:
                    self._stream = None
                stream.close()
                new = self._flush()
                if new:
                    yield new
                if self.finish_reason is not None or self.cancelled:
                    break
                if self.count >= self.max_tokens:
                    self.finish_reason = "length"
                elif finish == "length" and chunks == 0:
                    self.finish_reason = "length"   # the server has no room left (its context is full)
                elif finish in ("length", None):
                    continue                        # fewer ids than chunks, or an interrupted stream: go on
                else:
                    self.finish_reason = "stop" if finish in ("stop", "eos", "eog") else str(finish)
        except RemoteError:
            if eng.closed:  # closed under the request (from another thread): say that, not "cannot reach"
                raise EngineClosedError("the remote engine was closed during this generation") from None
            raise
        finally:
            with self._lock:
                s, self._stream = self._stream, None
            if s is not None:
                s.close()
            if self.cancelled and self.finish_reason is None:
                self.finish_reason = "cancelled"

    # ------------------------------------------------------------------ text -> ids
    def _feed(self, piece: str) -> List[int]:
        self._pending += piece
        self._pending_chunks += 1
        if self.stop_strings and any(s in self.text + self._pending for s in self.stop_strings):
            self.finish_reason = "stop"
            return self._flush()
        if not self.engine.tokenizer.concurrent:
            return []
        cand = self.engine.tok(self._pending)
        if self.engine.detok(cand) != self._pending:
            return []  # the chunk ends inside what the tokenizer spells differently: wait for more text
        return self._emit(cand, self._pending)

    def _flush(self) -> List[int]:
        if not self._pending:
            return []
        return self._emit(self.engine.tok(self._pending), self._pending)

    def _emit(self, cand: List[int], text: str) -> List[int]:
        room = self.max_tokens - len(self.tokens)
        if len(cand) > room:  # the text tokenized into more ids than asked: keep at most max_tokens
            cand = cand[:max(0, room)]
            # ... ending on a character boundary: the kept text is sent back as the next prompt, and a
            # cut inside a UTF-8 sequence would send U+FFFD, which the model never wrote
            while cand and not text.startswith(self.engine.detok(cand)):
                cand = cand[:-1]
            text = self.engine.detok(cand)
            self.finish_reason = "length"
        self.tokens.extend(cand)
        self.text += text
        self._pending, self._pending_chunks = "", 0
        return cand


def _choice(ev: dict, url: str) -> dict:
    if isinstance(ev, dict) and ev.get("error"):
        raise RemoteProtocolError(f"{url}: the stream reported an error: {str(ev['error'])[:300]}", url=url)
    try:
        return ev["choices"][0] if ev.get("choices") else {}
    except (KeyError, IndexError, TypeError, AttributeError):
        raise RemoteProtocolError(f"{url}: an event without choices: {str(ev)[:200]}", url=url) from None


def _stop_strings(engine, stop) -> List[str]:
    if isinstance(stop, (str, int)):
        stop = (stop,)
    out = []
    for s in stop or ():
        if isinstance(s, str):
            if s:
                out.append(s)
        elif isinstance(s, int) and not isinstance(s, bool):
            piece = engine.detok([s])  # a stop token id: stop at its text (approximate)
            if piece:
                out.append(piece)
        else:
            raise TypeError(f"stop entries must be token ids (int) or strings, got {s!r}")
    return out


__all__ = ["Generation", "MAX_ROUNDS"]
