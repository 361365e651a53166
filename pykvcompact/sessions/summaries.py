"""Building summaries of the live history: the summarizer prompt on a fork, the summary message that
replaces the history (kept user messages, carried facts, the new summary) and its tokens."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

from .. import events as ev
from ..chat_template import common_prefix_len
from ..summarizer import (FIRST_HEADING, SUMMARY_HEADER, fallback_summary, looks_like_tool_call,
                          summarizer_request)
from .context import Context
from .keeper import Candidate, SummaryMeta, compose, plan_kept, trim_lines
from .ledger import Ledger
from .messages import view_of
from .summary_job import Summary, SummaryJob
from .port import free_cells
from .swap import Replacement


class SummaryMaker:
    def __init__(self, ctx: Context, ledger: Ledger, policy, limits, summarizer, emit):
        self.ctx, self.ledger, self.policy, self.limits = ctx, ledger, policy, limits
        self.summarizer, self.emit = summarizer, emit
        self.meta: Dict[int, SummaryMeta] = {}     # id(summary message) -> what it holds
        self.summarized_users: List[int] = []      # transcript indices handed to a summarizer (over budget)
        self.tight = False   # keep nothing verbatim (the kept messages made a needed summary gain nothing)

    def describe(self, msg: dict) -> Optional[dict]:
        """What summary ``msg`` holds, for the log (JSON)."""
        meta = self.meta.get(id(msg))
        if meta is None:
            return None
        return {"kept": [dataclasses.asdict(c) for c in meta.kept], "body": meta.body}

    def restore(self, msg: dict, described: Optional[dict]) -> None:
        if described:
            self.meta[id(msg)] = SummaryMeta([Candidate(**c) for c in described.get("kept", [])],
                                             described.get("body", ""))

    # ------------------------------------------------------------------ what is kept
    def _first_user(self) -> Optional[int]:
        return next((i for i, m in enumerate(self.ledger.transcript)
                     if m.get("role") == "user" and not m.get("summary")), None)

    def plan(self, mark: int):
        """``(kept, overflow, carried)`` for a summary of ``entries[n_prefix:mark]``."""
        first = self._first_user()
        cands, carried = [], []
        for e in self.ctx.entries[self.ctx.n_prefix:mark]:
            if e.summary:
                meta = self.meta.get(id(e.msg), SummaryMeta())
                cands.extend(meta.kept)
                carried.append(meta.body)
            elif e.msg.get("role") == "user" or self.ledger.is_pinned(e.tidx):
                text = e.msg.get("content") or ""
                cands.append(Candidate(e.tidx, e.msg["role"], text, len(self.ctx.tok(text)) + 4,
                                       self.ledger.is_pinned(e.tidx), e.tidx == first))
        cands.extend(self._pinned_elsewhere(cands))
        if self.tight:
            kept, overflow = plan_kept(cands, 0, must_limit=0)
        else:
            kept, overflow = plan_kept(cands, self.user_budget(), must_limit=self.must_budget())
        return kept, overflow, "\n".join(c for c in carried if c.strip())

    def _pinned_elsewhere(self, cands) -> List[Candidate]:
        """Messages pinned after they left the live context: they come back verbatim in this summary."""
        held = {c.tidx for c in cands} | {e.tidx for e in self.ctx.entries if not e.summary}
        for e in self.ctx.entries:
            if e.summary:
                held.update(c.tidx for c in self.meta.get(id(e.msg), SummaryMeta()).kept)
        out = []
        for i in sorted(self.ledger.pinned - held):
            m = self.ledger.transcript[i]
            text = m.get("content") if isinstance(m.get("content"), str) else ""
            out.append(Candidate(i, m["role"], text, len(self.ctx.tok(text)) + 4, True, False))
        return out

    def room(self) -> int:
        """Tokens between the prefix plus keep_recent and hard.  A summary message takes at most half of
        it (a quarter for the summary text, an eighth each for kept user messages and carried facts), so
        that a swap always leaves room to work (small windows, long system prompts)."""
        return max(0, self.limits.hard - self.ctx.prefix_tok() - self.limits.keep_recent)

    def user_budget(self) -> int:
        return min(self.limits.keep_user, self.room() // 8)

    def must_budget(self) -> int:
        """The first user message and pinned messages are kept beyond the user budget, but not beyond half
        of the room: a summary message bigger than what it replaces would gain nothing (those over
        it are summarized with the instruction to keep every constraint verbatim)."""
        return max(self.user_budget(), self.room() // 2)

    def text_budget(self) -> int:
        return max(16, min(self.limits.summary, self.room() // 4))

    # ------------------------------------------------------------------ the job
    def start(self, mark: int, instructions: Optional[str], *, background: bool) -> SummaryJob:
        ctx = self.ctx
        mark_tok = ctx.mark_tok(mark)
        kept, overflow, carried = self.plan(mark)
        self.summarized_users.extend(c.tidx for c in overflow)
        base = ctx.views()[:mark]

        def prompt(shorter: bool) -> List[int]:
            req = {"role": "user", "content": summarizer_request(
                self.ledger.path, budget, instructions, shorter,
                overflow_users=[c.content for c in overflow], has_earlier=bool(carried))}
            B = ctx.render(base)
            N = ctx.render(base + [req], True) + FIRST_HEADING
            c = len(B) if N.startswith(B) else common_prefix_len(B, N)
            return ctx.tok(N[c:])

        def fork_at():
            f = ctx.seq.fork()
            f.truncate(mark_tok)
            return f

        msgs = [e.msg for e in ctx.entries[ctx.n_prefix:mark]]
        budget = self.text_budget()
        return SummaryJob(summarizer=self.summarizer, fork_at=fork_at, prompt=prompt,
                          fallback=lambda reason: self.fallback_text(msgs, reason, budget), detok=ctx.detok,
                          max_tokens=budget, timeout=self.policy.summary_timeout,
                          retries=self.policy.summary_retries, background=background, emit=self.emit,
                          head=FIRST_HEADING, count=lambda t: len(ctx.tok(t)),
                          room=lambda n: free_cells(ctx.engine) >= n + 8)

    def fallback_text(self, msgs, reason: str, budget: int) -> str:
        budget = max(16, budget)
        text = fallback_summary([m for m in msgs if not looks_like_tool_call(m.get("content") or "")],
                                reason=reason, max_chars=budget * 6)
        lines = text.split("\n")
        while len(lines) > 2 and len(self.ctx.tok("\n".join(lines))) > budget:
            lines.pop()  # least important last
        text = "\n".join(lines)
        while len(self.ctx.tok(text)) > budget and len(text) > 40:
            text = text[: int(len(text) * 0.85)] + "…"
        return text

    # ------------------------------------------------------------------ the replacement
    def replacement(self, mark: int, summary: Summary) -> Replacement:
        kept, _, carried = self.plan(mark)
        count = lambda t: len(self.ctx.tok(t))  # noqa: E731
        carry = min(max(self.limits.summary // 2, self.limits.summary - summary.tokens), self.room() // 8)
        carried = trim_lines(carried, carry, count)
        header = SUMMARY_HEADER.format(path=self.ledger.path)
        content = compose(header, kept, carried, summary.text)
        msg = {"role": "user", "content": content, "summary": True}
        self.meta[id(msg)] = SummaryMeta(kept, (carried + "\n" + summary.text).strip())
        view = view_of(msg)
        ctx = self.ctx
        pre = ctx.views()[:ctx.n_prefix]
        B = ctx.render(pre)
        N = ctx.render(pre + [view])
        r_text = N[len(B):] if N.startswith(B) else N[common_prefix_len(B, N):]
        return Replacement(mark, msg, view, r_text, ctx.tok(r_text))

    def kept_tokens(self, msg) -> int:
        """Tokens of the messages a summary message carries verbatim (the cost of keeping them)."""
        meta = self.meta.get(id(msg))
        return sum(c.tokens for c in meta.kept) if meta else 0

    def ready_event(self, summary: Summary, ms: float) -> ev.SummaryReady:
        return ev.SummaryReady(summary.tokens, ms, fallback=summary.fallback, attempts=summary.attempts)


__all__ = ["SummaryMaker"]
