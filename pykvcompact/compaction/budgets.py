"""How many KV cells a session's compaction needs beside its window: the summary message (one budget,
:func:`summary_budget`, for what it keeps and what is reserved for it), the prepared context, the forks
of the probe and the summarizer — and the largest window that fits a pool.  Pure functions of a
:class:`~.policy.Policy` (what they read of it: :class:`BudgetPolicy`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Protocol


class BudgetPolicy(Protocol):
    """What the budgets read of a :class:`~.policy.Policy`.  A protocol, not the class: ``policy.py`` sits
    above this module (its limits and its restart rule are built on these budgets)."""
    mode: str
    window: Optional[int]
    hard: float
    soft: float
    early_start: float
    keep_recent: float

    @property
    def probes(self) -> bool: ...

    def summary_tokens(self, window: int) -> int: ...

    def user_tokens(self, window: int) -> int: ...


SUMMARY_MESSAGE_OVERHEAD = 96   # the summary message's header, headings and template
PROBE_SLACK = 8


@dataclass(frozen=True)
class SummaryBudget:
    """What one summary message may hold, in tokens: the one source of truth for the cells reserved for
    a rebased context (:func:`summary_message_budget`) and for what the session puts in a summary message
    (``SummaryMaker``, which may only use less: it also caps each part by the room left below ``hard``)."""
    text: int        # the new summary text (the summarizer's output budget)
    users: int       # user messages kept verbatim, newest first (``keep_user_tokens``)
    kept: int        # every message kept verbatim: the first user message, pinned ones, the users above
    carried: int     # an earlier summary's standing instructions and text, carried forward
    overhead: int = SUMMARY_MESSAGE_OVERHEAD   # the header, the headings and the template
    listed: int = 0  # over-budget user messages quoted in the summarizer's prompt (the fork's cells)

    @property
    def total(self) -> int:
        return self.text + self.kept + self.carried + self.overhead


def summary_budget(p: BudgetPolicy, window: int) -> SummaryBudget:
    text = p.summary_tokens(window)
    users = p.user_tokens(window)
    # the carried text has no cells of its own: it takes what the new summary text and the kept messages
    # leave of theirs (the standing instructions first); the prompt lists the over-budget user messages
    # within half the summary budget (what the summarizer can copy, beside the rest of its summary)
    return SummaryBudget(text=text, users=users, kept=max(users, window // 8), carried=0, listed=max(16, text // 2))


def summary_message_budget(p: BudgetPolicy, window: int) -> int:
    """Tokens a summary message may take: the summary, the messages kept verbatim, the carried text, the
    template (:class:`SummaryBudget`)."""
    return summary_budget(p, window).total


def shadow_budget(p: BudgetPolicy, window: int) -> int:
    """Cells reserved for the prepared (shadow) context beyond the shared prefix: summary + raw tail."""
    tail = math.ceil(p.keep_recent * window)
    if p.mode == "background":  # the tail grows from the cut (from soft - early_start) up to hard
        tail += math.ceil(max(0.0, p.hard - p.soft + p.early_start) * window)
    else:
        # synchronous modes cut at the trigger, leaving keep_recent raw (+ one message of slack)
        tail += math.ceil(0.05 * window)
    return summary_message_budget(p, window) + tail


def reserve_cells(p: BudgetPolicy, window: int, *, probe_tokens: int = 0, summarizer_tokens: int = 0) -> int:
    """Cells the session needs beyond its window at the worst moment.

    The probe fork holds ``probe_tokens`` new cells (briefly); the summary fork holds the summarizer prompt
    and the summary (its history cells are shared with the live sequence); the shadow holds the summary
    message and the raw tail up to ``hard`` (its prefix cells are shared).  The summary fork is closed
    before the shadow is prepared, so they never coexist — except in background mode, where the fallback
    summary's context is prefilled while the fork writes; a probe is skipped (and says so) when the pool
    has no room for it at that moment.  So reserve = max(probe, summary fork (+ fallback context), shadow).  Mode ``none``
    reserves the summary fork only (for ``/compact``): it never prepares a shadow.
    """
    summ = summarizer_tokens + p.summary_tokens(window) + PROBE_SLACK
    if p.mode == "none":
        return summ
    probe = (probe_tokens + PROBE_SLACK) if p.probes else 0
    if p.mode == "background":
        # while the model writes the summary, the fallback summary's context is prefilled beside it (so
        # the window edge never waits for a synchronous prefill): fork + that context coexist
        fallback = summary_message_budget(p, window) + math.ceil(p.keep_recent * window)
        return max(probe, summ + fallback, shadow_budget(p, window))
    return max(probe, summ, shadow_budget(p, window))


def resolve_window(p: BudgetPolicy, free_cells: int, *, probe_tokens: int = 0, summarizer_tokens: int = 0,
                   min_window: int = 64) -> int:
    """The window for ``p`` given ``free_cells`` in the engine's pool.

    ``p.window=None`` picks the largest window that fits; an explicit window that cannot fit (or a pool
    too small for any useful window) raises ``ValueError`` — at session creation, not at a failed decode.
    """
    def need(w: int) -> int:
        return w + reserve_cells(p, w, probe_tokens=probe_tokens, summarizer_tokens=summarizer_tokens)

    if p.window is not None:
        n = need(p.window)
        if p.mode == "none" and p.window <= free_cells:
            n = p.window  # truncation needs no fork; /compact summarizes only when the pool has room then
        if n > free_cells:
            raise ValueError(
                f"window={p.window} does not fit: mode {p.mode!r} needs {n} KV cells (window + "
                f"{n - p.window} for probe/summary/rebase forks) but the engine has {free_cells} free; "
                f"use a larger n_ctx, a smaller window, a smaller summary_max_tokens, or window=None")
        if p.window < min_window:
            raise ValueError(f"window={p.window} is too small (minimum {min_window})")
        return p.window
    lo, hi = 0, free_cells
    while lo < hi:  # need() is monotonic in w
        mid = (lo + hi + 1) // 2
        if need(mid) <= free_cells:
            lo = mid
        else:
            hi = mid - 1
    if lo < min_window:
        raise ValueError(f"the engine has {free_cells} free KV cells: not enough for any window in mode "
                         f"{p.mode!r} (needs at least {need(min_window)}); use a larger n_ctx")
    return lo


__all__ = ["BudgetPolicy", "SummaryBudget", "summary_budget", "summary_message_budget", "shadow_budget",
           "reserve_cells", "resolve_window", "SUMMARY_MESSAGE_OVERHEAD", "PROBE_SLACK"]
