"""Building summaries of the live history: the summarizer prompt on a fork, the summary message that
replaces the history (kept user messages, carried facts, the new summary: planned in ``plan.py``) and its
tokens."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

from ... import events as ev
from ...chat.template import common_prefix_len
from ..policy import summary_budget
from .summarizer import SUMMARY_HEADER, answer_head, summarizer_request, without_repeated_requests
from ...session.context import Context
from .keeper import (STANDING_HEADING, Candidate, SummaryMeta, budget_items, compose, merge_standing,
                     split_standing, trim_lines, trim_standing)
from ...session.transcript import Transcript
from .novelty import says_something_new
from ...chat.messages import view_of
from . import results as res
from ...models.registry import notes_help
from .notes import NoteTaker
from .job import Summary, SummaryJob
from ...engine.port import free_cells
from ..swap import Replacement
from .shares import SummaryShares
from .plan import Plan, first_user, plan_summary
from .standing import StandingCheck
from .fallback import fallback_text, give_up, trim_lines_end, users_words
from .extension import extend, previous_summary


MAX_SHRINK = 3   # smaller plans a swap may fall back to when its rebased context does not fit the pool
SEARCH_POINTER = " search_history looks up any detail not listed here."
MIN_MODEL_TOKENS = 32   # a model summary shorter than this is not worth its prompt's prefill
# A model whose summaries say nothing new (novelty.py) is not asked after this many in a row, and asked again
# after ASK_AGAIN_AFTER summaries without it (the history may hold more by then); each re-ask that says
# nothing again doubles the wait, up to ASK_AGAIN_MAX.  Measured on Qwen2.5-Coder-1.5B: each of its summaries
# slowed the conversation's steps about threefold for three to five steps, and 21 of 21 said nothing new.
SAID_NOTHING_LIMIT = 2
ASK_AGAIN_AFTER = 3
ASK_AGAIN_MAX = 24


class SummaryMaker:
    def __init__(self, ctx: Context, transcript: Transcript, policy, limits, summarizer, emit,
                 searchable: bool = False):
        """``searchable``: the session offers ``search_history`` (the summary says so)."""
        self.ctx, self.transcript, self.policy, self.limits = ctx, transcript, policy, limits
        self.summarizer, self.emit = summarizer, emit
        self.meta: Dict[int, SummaryMeta] = {}     # id(summary message) -> what it holds
        self.summarized_users: List[int] = []      # transcript indices handed to a summarizer (over budget)
        self.tight = False   # keep nothing verbatim (the kept messages made a needed summary gain nothing)
        self.budget = summary_budget(policy, limits.window)   # the reservation's numbers (one source)
        self.shares = SummaryShares(ctx, limits, self.budget)
        self.searchable = searchable
        self.said_nothing = 0     # the model's summaries in a row that said nothing new (novelty.py)
        self.not_asked = 0        # summaries written without the model since it was last asked
        self._judged: Optional[Summary] = None   # the model summary last counted in said_nothing
        self.standing = StandingCheck(transcript, self.shares)
        # what the model noted of each tool result (journaled: kept across save/load)
        # (Policy(notes=None) takes none on a model measured to note nothing useful: registry.notes_help)
        takes = policy.takes_notes and (policy.notes is True or notes_help(ctx.engine))
        self.notes = NoteTaker(ctx, emit, takes, lambda tidx, lines: transcript.journal.note(tidx, lines), self._task)

    def describe(self, msg: dict) -> Optional[dict]:
        """What summary ``msg`` holds, for the log (JSON)."""
        meta = self.meta.get(id(msg))
        if meta is None:
            return None
        return {"kept": [dataclasses.asdict(c) for c in meta.kept], "body": meta.body, "standing": meta.standing,
                "results": meta.results, "left_out": meta.left_out,
                "model": {"said_nothing": self.said_nothing, "not_asked": self.not_asked}}

    def restore(self, msg: dict, described: Optional[dict]) -> None:
        if described:
            self.meta[id(msg)] = SummaryMeta([Candidate(**c) for c in described.get("kept", [])],
                                             described.get("body", ""), list(described.get("standing") or []),
                                             [str(x) for x in described.get("results") or []],
                                             int(described.get("left_out") or 0))
            model = described.get("model")
            if isinstance(model, dict):   # (the newest summary's counters win: restored in log order)
                self.said_nothing = int(model.get("said_nothing") or 0)
                self.not_asked = int(model.get("not_asked") or 0)

    # ------------------------------------------------------------------ what is kept
    def _task(self) -> str:
        """The first user message's text (the task a note is asked about), "" before there is one."""
        i = first_user(self.transcript.messages)
        content = self.transcript.messages[i].get("content") if i is not None else ""
        return content if isinstance(content, str) else ""

    def plan(self, cut: int) -> Plan:
        """What a summary of ``entries[n_prefix:cut]`` carries (:func:`~.plan.plan_summary`)."""
        return plan_summary(self.ctx, self.transcript, self.meta, cut, shares=self.shares, notes=self.notes.notes,
                            tight=self.tight)

    # ------------------------------------------------------------------ the job
    def start(self, cut: int, instructions: Optional[str], *, background: bool,
              affordable: Optional[int] = None, trigger: str = "") -> SummaryJob:
        """A summary of ``entries[n_prefix:cut]``.  ``affordable``: the summary tokens the model can write
        in the time left (background mode, measured); the model writes at most that many, and none when
        that is below :data:`MIN_MODEL_TOKENS` (the extractive summary then serves at once).  A ``manual``
        or ``tool`` compaction, or one with ``instructions``, always asks the model (its summary is the
        point of the call: only the model can follow the instructions)."""
        ctx = self.ctx
        cut_token = ctx.cut_token(cut)
        plan = self.plan(cut)
        kept, overflow, carried, standing = plan.kept, plan.overflow, plan.carried, plan.standing
        self.summarized_users.extend(c.tidx for c in overflow)
        musts = [c for c in overflow if c.pinned or c.first]
        if musts:   # (tight: the window is full and keeping them left no gain; they come back next time)
            limit, why = (0, "no_gain") if self.tight else (self.shares.musts(), "over_budget")
            shown = {c.tidx for c in kept}
            # "clipped": kept with their middle cut (keeper.clipped), and handed whole to the summarizer
            for group, reason in (([c for c in musts if c.tidx in shown], "clipped"),
                                  ([c for c in musts if c.tidx not in shown], why)):
                if group:
                    self.emit(ev.KeptOverBudget([c.tidx for c in group], sum(c.tokens for c in group), limit,
                                                reason))
        count = lambda t: len(ctx.tok(t))  # noqa: E731
        listed, omitted = budget_items([c.content for c in overflow], self.shares.listed(), count)
        base = ctx.views()[:cut]

        def prompt(shorter: bool) -> List[int]:
            req = {"role": "user", "content": summarizer_request(
                self.transcript.path, writes, instructions, shorter, overflow_users=listed, omitted=omitted,
                has_earlier=bool(carried or standing))}
            before = ctx.render(base)
            after = ctx.render(base + [req], True) + answer_head(listed)
            common = len(before) if after.startswith(before) else common_prefix_len(before, after)
            return ctx.tok(after[common:])

        def fork_at():
            f = ctx.seq.fork()
            f.truncate(cut_token)
            return f

        # (an earlier summary is carried on its own: the fallback does not quote it again)
        msgs = [e.msg for e in ctx.entries[ctx.n_prefix:cut] if not e.summary]
        budget = self.shares.text()   # the model writes first; the copied lines fit in what is left
        writes = budget if affordable is None else min(budget, affordable)
        skip, skip_reason = "", ""
        if affordable is not None and writes < MIN_MODEL_TOKENS:   # only the paced background path
            skip, skip_reason = (f"at the measured pace the model can write {max(0, writes)} summary tokens before "
                                 f"the window edge (fewer than {MIN_MODEL_TOKENS}): the extractive summary is used",
                                 "no_time")
        elif not (instructions or trigger in ("manual", "tool") or self.asks_model()):
            skip, skip_reason = (f"the model's last {self.said_nothing} summaries said nothing the summary message "
                                 "does not carry anyway: the extractive summary is used", "uninformative")
        over, spare = [c.content for c in overflow], self.shares.spare(kept)
        # a fallback's standing instructions beyond its budget only while the swap still gains clearly
        p_tok, m_tok = ctx.span(cut)[:2]
        spare = max(0, min(spare, (m_tok - p_tok) // 2 - sum(c.tokens for c in kept) - self.shares.text() - 64))
        return SummaryJob(summarizer=self.summarizer, fork_at=fork_at, prompt=prompt,
                          fallback=lambda reason: fallback_text(msgs, reason, budget, count, over, spare),
                          detok=ctx.detok,
                          max_tokens=max(writes, 1), timeout=self.policy.summary_timeout,
                          retries=self.policy.summary_retries, background=background, emit=self.emit,
                          head=answer_head(listed), count=count,
                          room=lambda n: free_cells(ctx.engine) >= n + 8, skip=skip, skip_reason=skip_reason)

    def asks_model(self) -> bool:
        """Will the next summary ask the model?  Not after SAID_NOTHING_LIMIT summaries in a row that said
        nothing, until :meth:`ask_again_after` have been written without it (the schedule asks: without the
        model a preparation only has the rebased context to prefill).  The counters change when a summary is
        used (:meth:`_judge`)."""
        return self.said_nothing < SAID_NOTHING_LIMIT or self.not_asked >= self.ask_again_after()

    def ask_again_after(self) -> int:
        """Summaries written without the model before it is asked again: ASK_AGAIN_AFTER, doubled by each
        re-ask that said nothing new again (3, 6, 12, 24)."""
        extra = max(0, self.said_nothing - SAID_NOTHING_LIMIT)
        return min(ASK_AGAIN_MAX, ASK_AGAIN_AFTER << min(extra, 8))

    # ------------------------------------------------------------------ the replacement
    def replacement(self, cut: int, summary: Summary, level: int = 0) -> Replacement:
        """The summary message for ``entries[n_prefix:cut]``.  ``level`` > 0: a smaller plan, for a swap
        whose rebased context did not fit the pool (1: no carried text, a shorter summary; 2: only the
        user budget kept verbatim; 3: the standing instructions and a short summary only)."""
        plan = self.plan(cut)
        kept, carried, old_standing = plan.kept, plan.carried, plan.standing
        count = lambda t: len(self.ctx.tok(t))  # noqa: E731
        new_standing, rest = split_standing(summary.text)
        if not summary.fallback:   # (the fallback's standing instructions are the user's words)
            new_standing = self.standing.checked(new_standing, summary, plan, level, count)
        self._judge(summary, rest, plan)
        if level == 0:
            extended = self._extended(cut, plan, summary, new_standing, rest, count)
            if extended is not None:
                return extended
        share = self.shares.results(plan.results)
        model = self.shares.text() - share      # the model's (or the fallback's) share of the text budget
        carry = self.shares.carried() + max(0, model - summary.tokens)
        # the standing instructions may also take what the kept messages leave of their budget (less what a
        # fallback summary's own standing instructions took of it beyond the text budget)
        extra = max(0, self.shares.spare(kept) - max(0, summary.tokens - model))
        if level >= 1:
            carry //= 2 ** level
            share //= 2 ** level
            rest = trim_lines_end(rest, self.shares.text() // (2 * level), count)
        if level >= 2:
            budget = self.shares.users() if level == 2 else 0
            fit, used, over = [], 0, []
            for c in kept:
                (fit if used + c.tokens <= budget else over).append(c)
                used += c.tokens if used + c.tokens <= budget else 0
            if over:
                self.emit(ev.KeptOverBudget([c.tidx for c in over], sum(c.tokens for c in over), budget, "no_room"))
            kept = fit
        if level >= 1:
            extra //= 2 ** level
        # what the text budget and the kept messages leave, in order: the standing instructions, the
        # assistant's own statements, the earlier summaries' text (what the model wrote, within the text
        # budget only), then the tools' outputs (copied lines: results.py).  The copied lines take at most a
        # quarter of what the span held, so a short span still gains, unless the earlier summaries listed
        # more: those lines are in the span already.
        p_tok, m_tok = self.ctx.span(cut)[:2]
        cap = max(0, (m_tok - p_tok) // 4)
        if level == 0 and plan.prior:
            cap = max(cap, count(res.section(plan.prior)))
        statements = [x for x in plan.results if res.tier_of(x) == 1]
        old_standing = trim_standing(old_standing, carry + extra, count)
        used = count(STANDING_HEADING + "\n" + "\n".join(old_standing)) if old_standing else 0
        room = share + max(0, carry + extra - used)
        # what a summary built without the model says besides the user's words (the files mentioned, the
        # next step) is worth less than what the assistant itself stated: the statements may take its room
        spare_lines = [ln for ln in rest.split("\n") if ln.strip() and not users_words(ln)] if summary.fallback else []
        bonus = count("\n".join(spare_lines)) if spare_lines else 0
        said, _ = res.fit(statements, min(room + bonus, cap), count)
        said_cost = count(res.section(said)) if said else 0
        if bonus and said_cost > room:
            rest = give_up(rest, said_cost - room, count)
        used += max(0, said_cost - share)
        carried = trim_lines(carried, carry - max(0, used - extra), count) if level == 0 else ""
        used += count(carried) if carried else 0
        listing = min(max(said_cost, share) + max(0, carry + extra - used), cap)
        kept_lines = set(said)
        results, dropped = res.fit([x for x in plan.results if res.tier_of(x) > 1 or x in kept_lines], listing,
                                   count, plan.left_out + len(statements) - len(said))
        standing = merge_standing(old_standing, new_standing)
        if summary.fallback:   # against what the message finally carries (a smaller context drops some)
            rest = without_repeated_requests(rest, [c.content for c in kept if c.role == "user"] + standing)
        header = SUMMARY_HEADER.format(path=self.transcript.path)
        header = header[:-1] + SEARCH_POINTER + "]" if self.searchable else header
        limit = self.budget.total if level == 0 else None
        while True:
            content = compose(header, kept, carried, rest, standing, res.section(results, dropped, self.searchable))
            msg = {"role": "user", "content": content, "summary": True}
            replacement = self._rendered(cut, msg)
            if limit is None or len(replacement.tokens) <= limit or not (results or dropped):
                break
            if results:   # a long header (the history path): fewer results, the last tier first
                drop = min(range(len(results)), key=lambda i: (-res.tier_of(results[i]), i))
                results, dropped = results[:drop] + results[drop + 1:], dropped + 1
            else:         # not even the note that some were left out
                dropped = 0
        # what the next summary carries forward: the model's text (a fallback's counts of messages describe a
        # span that is gone: its standing instructions and results are carried on their own)
        body = carried + "\n" + ("" if summary.fallback else rest)
        self.meta[id(msg)] = SummaryMeta(kept, body.strip(), standing, results, dropped)
        if level < MAX_SHRINK:
            replacement.smaller = lambda: self.replacement(cut, summary, level + 1)
        return replacement

    def _extended(self, cut: int, plan: Plan, summary: Summary, standing: List[str], rest: str, count
                  ) -> Optional[Replacement]:
        """The previous summary extended by what the rest of the span adds (extension.py), when the span
        begins with it and the extension fits the budget; None otherwise (the summary is rewritten)."""
        ctx = self.ctx
        previous = previous_summary(ctx.entries, ctx.n_prefix, cut)
        meta = self.meta.get(id(previous.msg)) if previous is not None else None
        if meta is None or not isinstance(previous.msg.get("content"), str):
            return None
        new_span = ctx.cut_token(cut) - ctx.cut_token(ctx.n_prefix + 1)
        extended = extend(previous.msg["content"], meta, kept=plan.kept, standing=standing,
                          text="" if summary.fallback else rest, results=plan.results, cap=max(0, new_span // 4),
                          limit=self.budget.total, count=count, searchable=self.searchable)
        if extended is None:
            return None
        content, new_meta = extended
        msg = {"role": "user", "content": content, "summary": True}
        replacement = self._rendered(cut, msg)
        if len(replacement.tokens) > self.budget.total:
            return None
        self.meta[id(msg)] = new_meta
        replacement.smaller = lambda: self.replacement(cut, summary, 1)   # (no room for it: a smaller rewrite)
        return replacement

    def _judge(self, summary: Summary, rest: str, plan: Plan) -> None:
        """Count, once per summary used, whether the model said something the summary message does not
        carry anyway (the user's messages, the instructions, the carried text, the key results:
        novelty.says_something_new) — the measure of whether to ask it next time.  Its text is kept either
        way (a restated fact can still be news to the agent: "the failing tests pass now")."""
        if summary is self._judged:
            return
        self._judged = summary
        if summary.fallback:
            if summary.skipped and summary.reason == "uninformative":   # its summaries said nothing new
                self.not_asked += 1
            return
        # (the assistant's own statements are not counted as known: condensing them is the model's job,
        # and a summary that restates them in fewer words is not one that says nothing)
        known = "\n".join([c.content for c in plan.kept] + list(plan.standing) + [plan.carried]
                          + [x for x in plan.results if res.tier_of(x) > 1])
        self.said_nothing = 0 if says_something_new(rest, known) else self.said_nothing + 1
        self.not_asked = 0

    def _rendered(self, cut: int, msg: dict) -> Replacement:
        """The replacement of ``entries[n_prefix:cut]`` by ``msg``, rendered after the prefix."""
        view = view_of(msg)
        ctx = self.ctx
        pre = ctx.views()[:ctx.n_prefix]
        before = ctx.render(pre)
        after = ctx.render(pre + [view])
        r_text = after[len(before):] if after.startswith(before) else after[common_prefix_len(before, after):]
        return Replacement(cut, msg, view, r_text, ctx.tok(r_text))

    def kept_tokens(self, msg) -> int:
        """Tokens of the messages a summary message carries verbatim (the cost of keeping them)."""
        meta = self.meta.get(id(msg))
        return sum(c.tokens for c in meta.kept) if meta else 0

    def ready_event(self, summary: Summary, ms: float) -> ev.SummaryReady:
        return ev.SummaryReady(summary.tokens, ms, fallback=summary.fallback, attempts=summary.attempts,
                               text=summary.text)


__all__ = ["SummaryMaker"]
