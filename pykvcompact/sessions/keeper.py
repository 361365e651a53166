"""What a summary message carries verbatim: the user's own messages, pinned messages, earlier facts.

A summary that paraphrases "never modify billing.py" loses it.  So the rebased context keeps the user's
messages verbatim (newest first, within ``keep_user_tokens``; the first user message — the task — and
pinned messages always), and the summary of an earlier summary copies that summary's text forward instead
of summarizing it again (facts decay through summaries of summaries otherwise).  Pure functions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

USERS_HEADING = "User messages, verbatim (oldest first):"
CARRIED_HEADING = "Earlier summary, carried verbatim:"


@dataclass(frozen=True)
class Candidate:
    tidx: int          # transcript index
    role: str
    content: str
    tokens: int
    pinned: bool = False
    first: bool = False   # the first user message of the session (the task)


@dataclass
class SummaryMeta:
    """What a summary message holds besides the header: the kept messages and its summary text."""
    kept: List[Candidate] = field(default_factory=list)
    body: str = ""      # carried text + the new summary text (what the next summary carries forward)


def plan_kept(cands: Sequence[Candidate], budget: int, must_limit: Optional[int] = None
              ) -> Tuple[List[Candidate], List[Candidate]]:
    """``(kept, overflow)``: pinned messages and the first user message first (the first user message,
    then pinned ones oldest first, while they fit in ``must_limit`` tokens; None: no limit); then other
    user messages newest first while all fit in ``budget`` tokens. Both lists in transcript order; no
    duplicates. A message in neither list is not a user message (or a pinned one)."""
    seen, uniq = set(), []
    for c in cands:
        if c.tidx not in seen:
            seen.add(c.tidx)
            uniq.append(c)
    kept, overflow, used = [], [], 0
    for c in sorted((c for c in uniq if c.pinned or c.first), key=lambda c: (not c.first, c.tidx)):
        if must_limit is None or used + c.tokens <= must_limit:
            kept.append(c)
            used += c.tokens
        else:
            overflow.append(c)
    for c in reversed([c for c in uniq if not (c.pinned or c.first)]):
        if c.role == "user" and used + c.tokens <= budget:
            kept.append(c)
            used += c.tokens
        elif c.role == "user":
            overflow.append(c)
    order = lambda c: c.tidx  # noqa: E731
    return sorted(kept, key=order), sorted(overflow, key=order)


def trim_lines(text: str, budget: int, count: Callable[[str], int]) -> str:
    """``text`` within ``budget`` tokens, dropping its oldest lines first (headings stay when possible)."""
    if budget <= 0 or not text:
        return ""
    lines = text.split("\n")
    while lines and count("\n".join(lines)) > budget:
        lines.pop(0)
    return "\n".join(lines)


def compose(header: str, kept: Sequence[Candidate], carried: str, text: str) -> str:
    """The summary message's content."""
    parts = [header]
    if kept:
        parts.append(USERS_HEADING + "\n" + "\n".join(
            (f"[{c.role}, pinned] " if c.pinned and c.role != "user" else "") + c.content for c in kept))
    if carried.strip():
        parts.append(CARRIED_HEADING + "\n" + carried.strip())
    parts.append(text.strip())
    return "\n\n".join(parts)


__all__ = ["Candidate", "SummaryMeta", "plan_kept", "trim_lines", "compose", "USERS_HEADING", "CARRIED_HEADING"]
