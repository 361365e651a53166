"""One assistant reply: generated in chunks (room made and the schedule run between chunks), streamed as
text deltas with incomplete UTF-8 held back, stop strings honoured, tool calls parsed when it closes.

If the caller closes the stream early or the engine fails mid-reply, what was generated stays: the reply
is closed and recorded (even when appending its end-of-turn tokens fails, it is in the transcript).

A plain (not streamed) reply yields ``CHUNK_DONE`` after each chunk: the one point between events where
its caller (the server, when the client goes away) may stop it; ``Session.chat`` ignores it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional

from ..chat.tool_calls import parse_tool_calls


class _ChunkDone:
    """A plain reply's chunk was generated (no text is yielded for it: the reply is read when it closes)."""

    def __repr__(self) -> str:
        return "CHUNK_DONE"


CHUNK_DONE = _ChunkDone()


@dataclass
class TurnParts:
    """What a reply needs of its session, handed to it (the call loop builds one per reply)."""
    ctx: object                                    # the live context (session/context.py)
    compactor: object                              # room, schedule ticks (compaction/compactor.py)
    prober: object                                 # counts generated tokens (compaction/prober.py)
    transcript: object                                 # records a reply the sequence lost (session/transcript.py)
    room: object                                   # makes room before each chunk (compaction/room.py)
    window: int
    chunk_tokens: int                              # tokens generated between two schedule ticks
    drain: Callable[[], Iterator]                  # the session's pending events
    probe_if_due: Callable[[], Iterator]           # a due rubric probe (its events)
    append: Callable[..., object]                  # a message into the live context and the transcript


class Turn:
    def __init__(self, parts: TurnParts, max_tokens: int, sampling: dict, stop: tuple, streaming: bool,
                 keep_call_raw: bool = False):
        """``keep_call_raw``: the reply that follows a tool the session ran for the model (the question, the
        call and its result stay raw until it is written; else only until the reply begins)."""
        self.parts, self.max_tokens, self.sampling, self.stop, self.streaming = parts, max_tokens, sampling, stop, streaming
        self.keep_call_raw = keep_call_raw
        self.finish = "length"
        self._close_cost: Optional[int] = None
        self._got: List[int] = []

    def run(self):
        """Generator of text deltas and events; returns ``(message, finish_reason, n_generated)``."""
        s = self.parts
        ctx = s.ctx
        s.room.make(lambda: ctx.measure(ctx.render(add_generation_prompt=True)) + self.close_cost() + 1)
        yield from s.drain()  # before the reply begins: a stream closed here leaves no reply half-open
        p = ctx.begin_reply()
        if not self.keep_call_raw:
            s.compactor.call_tidx = None  # the model has read the call's messages: they may be summarized now
        shown, completed = 0, False
        try:
            while len(p.tokens) < self.max_tokens:
                n = min(s.chunk_tokens, self.max_tokens - len(p.tokens))
                reserve = self.close_cost()  # the turn must close inside the window too
                if not s.room.fits(len(ctx) + n + reserve):
                    s.room.make_best_effort(lambda: len(ctx) + n + reserve)
                    yield from s.drain()
                    if len(ctx) + n + reserve > s.window:
                        n = s.window - len(ctx) - reserve
                        if n <= 0:
                            break
                s.compactor.tick(turn_end=True)  # the reply being written is the raw tail to come
                yield from s.drain()
                got: List[int] = []
                self._got = got  # the chunk in flight (kept if the engine fails mid-chunk)
                if self.streaming:
                    it = ctx.seq.stream(n, stop=self.stop, **self.sampling)
                    try:
                        for t in it:
                            got.append(t)
                            text = ctx.detok(p.tokens + got)
                            if not text.endswith("\ufffd") and len(text) > shown:
                                yield text[shown:]
                                shown = len(text)
                    finally:
                        close = getattr(it, "close", None)
                        if close is not None:
                            close()  # cancels the generation if we stopped early (tokens decoded stay)
                else:
                    got = list(ctx.seq.generate(n, stop=self.stop, **self.sampling))
                ctx.reply_tokens(got)
                self._got = []
                if not self.streaming:
                    yield CHUNK_DONE
                s.prober.generated(len(got))
                if len(got) < n or (self.stop and any(x in ctx.reply_text() for x in self.stop)):
                    self.finish = "stop"
                    break
                yield from s.probe_if_due()
            completed = True
        finally:
            if not completed and ctx.partial is p:
                try:  # keep what was generated (decoded tokens stay in the sequence) and close the turn
                    ctx.resync_reply()
                    self.close()
                except Exception:  # noqa: BLE001 - the original error propagates
                    self._record_lost(p)
        raw = ctx.reply_text()
        if self.streaming and len(raw) > shown:
            yield raw[shown:]
        msg = self.close()
        yield from s.drain()
        yield from s.probe_if_due()
        s.compactor.tick(turn_end=True)
        yield from s.drain()
        return msg, self.finish, len(p.tokens)

    def close_cost(self) -> int:
        """Tokens that closing the reply adds (the template's end of turn), plus a little slack: the
        text generated next may retokenize the boundary."""
        ctx = self.parts.ctx
        if self._close_cost is None:
            p = ctx.partial
            base = ctx.views()
            if p is None:
                with_gen = ctx.measure(ctx.render(base, add_generation_prompt=True))
                closed = ctx.measure(ctx.render(base + [{"role": "assistant", "content": ""}]))
                self._close_cost = max(0, closed - with_gen) + 2
            else:
                closed = ctx.measure(ctx.render(base + [{"role": "assistant", "content": ctx.reply_text()}]))
                self._close_cost = max(0, closed - len(ctx)) + 2
        return self._close_cost

    def _record_lost(self, p) -> None:
        """The sequence cannot be read (the engine closed or failed): what was generated goes to the
        transcript from the tokens received, so the user's history keeps the partial reply."""
        s = self.parts
        if s.ctx.partial is not p:
            return  # close() got far enough to record it
        try:
            text = s.ctx.detok(p.tokens + list(self._got))
        except Exception:  # noqa: BLE001 - the tokenizer is gone with the engine
            text = s.ctx.reply_text()
        s.ctx.partial = None
        s.transcript.record({"role": "assistant", "content": text, "partial": True}, live=False)

    def close(self) -> dict:
        """The generated reply becomes a live message (the template's end-of-turn tokens appended)."""
        s = self.parts
        raw = s.ctx.reply_text()
        content = raw
        if self.stop:
            cut = min((raw.find(x) for x in self.stop if x in raw), default=-1)
            if cut >= 0:
                content = raw[:cut]
        parsed, calls = parse_tool_calls(content, s.ctx.tools)
        msg = {"role": "assistant", "content": parsed if calls else content}
        if calls:
            msg["tool_calls"] = calls
        s.append(msg, {"role": "assistant", "content": raw}, from_partial=True)
        return msg


__all__ = ["Turn", "TurnParts", "CHUNK_DONE"]
