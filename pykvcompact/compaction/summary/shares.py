"""How the room of a summary message is shared among its parts: the messages kept verbatim, the other
user messages, the summary text, the carried text, the copied lines of results, and the over-budget
user messages quoted in the summarizer's prompt."""
from __future__ import annotations

from typing import List

from . import results as res


class SummaryShares:
    """The token budgets of one session's summary messages: ``limits`` (the session's window limits) and
    ``budget`` (the policy's :class:`~..policy.SummaryBudget`) are read at each call, as the prefix grows."""

    def __init__(self, ctx, limits, budget):
        self.ctx, self.limits, self.budget = ctx, limits, budget

    def results(self, results: List[str]) -> int:
        """Tokens of the summary text budget the copied lines take from the model's summary (at most a
        quarter: the model writes the rest; the lines also get what the other parts leave)."""
        if not results:
            return 0
        need = len(self.ctx.tok(res.section(results)))
        return min(need, self.text() // 4)

    def room(self) -> int:
        """Tokens between the prefix plus keep_recent and hard.  A summary message takes at most the
        policy's :class:`~..policy.SummaryBudget` (the cells reserved for it), and each part at most a
        share of the room (a quarter for the summary text, half for the messages kept verbatim, an eighth
        each for other user messages and the carried text), so that a swap always leaves room to work."""
        return max(0, self.limits.hard - self.ctx.prefix_tok() - self.limits.keep_recent)

    def users(self) -> int:
        return min(self.budget.users, self.limits.keep_user, self.room() // 8)

    def musts(self) -> int:
        """The first user message and pinned messages are kept beyond the user budget, within the policy's
        ``kept`` budget (what the reservation counts) and half of the room: a summary message bigger than
        what it replaces would gain nothing (those over it are handed to the summarizer, listed in its
        prompt with the instruction to copy every constraint, and a ``kept_over_budget`` event says so)."""
        return max(self.users(), min(self.budget.kept, self.room() // 2))

    def text(self) -> int:
        return max(16, min(self.budget.text, self.limits.summary, self.room() // 4))

    def carried(self) -> int:
        return min(self.budget.carried, self.room() // 8)

    def listed(self) -> int:
        """Tokens of over-budget user messages quoted in the summarizer's prompt (the fork's cells)."""
        return max(16, min(self.budget.listed, self.room() // 4))

    def spare(self, kept) -> int:
        """What the messages kept verbatim leave of their budget: standing instructions may use it."""
        return max(0, self.musts() - sum(c.tokens for c in kept))


__all__ = ["SummaryShares"]
