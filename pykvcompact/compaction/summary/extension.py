"""A summary extended instead of rewritten.

When the span a swap replaces begins with the summary of the previous swap, the new summary message is that
summary's text, unchanged, followed by what the rest of the span added: the user's new messages kept
verbatim, new standing instructions, the model's new text, and the new lines of the replaced history.  The
old text's tokens are then the same tokens at the same positions after the same prefix, so the rebase keeps
their KV instead of computing it again (``Engine.prepare_rebase`` shares a replacement's leading tokens
that equal the ones they replace): a swap costs the addition and the raw tail, not the whole summary.

A summary is extended while the addition fits its budget and lists every new line a rewrite would rank
above the last lines of long outputs (results.py's tiers); otherwise it is rewritten whole
(``SummaryMaker``), which chooses among all the lines.  Pure: what it reads of the session is passed in.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

from . import results as res
from .keeper import STANDING_HEADING, Candidate, SummaryMeta, merge_standing, same_text, users_section

LATER_HEADING = "[Later, before this point:]"


def addition(kept: Sequence[Candidate], standing: Sequence[str], text: str, listed: str) -> str:
    """The text appended to the summary: the heading, then the parts that hold anything."""
    parts = [LATER_HEADING]
    if kept:
        parts.append(users_section(kept))
    if standing:
        parts.append(STANDING_HEADING + "\n" + "\n".join(standing))
    if text.strip():
        parts.append(text.strip())
    if listed:
        parts.append(listed)
    return "\n\n".join(parts) if len(parts) > 1 else ""


def extend(previous: str, meta: SummaryMeta, *, kept: Sequence[Candidate], standing: Sequence[str], text: str,
           results: Sequence[str], cap: int, limit: int, count: Callable[[str], int], searchable: bool
           ) -> Optional[Tuple[str, SummaryMeta]]:
    """``previous`` (a summary's content, described by ``meta``) extended by what a new span adds, or None
    when the extension does not fit ``limit`` tokens (the caller rewrites the summary).

    ``kept``: the span's messages a rewrite would keep verbatim (those ``meta`` already holds are left out);
    ``standing``: standing instructions (the same); ``text``: the model's new text (empty for a summary
    built without it: its other lines are the user's words, kept already, or counts of a span that is
    gone); ``results``: the rewrite's list of lines (those ``meta`` lists are left out); ``cap``: the
    tokens the new lines may take (a share of what the new span held)."""
    had, said = {c.tidx for c in meta.kept}, {same_text(c.content) for c in meta.kept}
    kept = [c for c in kept if c.tidx not in had and same_text(c.content) not in said]   # (a repeat is kept once)
    standing = merge_standing(meta.standing, standing)[len(merge_standing(meta.standing)):]
    listed_before = set(meta.results)
    fresh = [x for x in results if x not in listed_before]
    if res.supersedes(meta.results, fresh):
        return None   # a newer output of a call the summary lists: a rewrite lists only the newer one
    base = previous + "\n\n" + addition(kept, standing, text, "")
    room = min(cap, limit - count(base) - 2)
    if room < 0:
        return None
    lines, left_out = res.fit(fresh, room, count) if fresh else ([], 0)
    if any(res.tier_of(x) < res.LAST_TIER and x not in lines for x in fresh):
        return None   # (a rewrite would make room for it by leaving out an older long output's last line)
    more = addition(kept, standing, text, res.section(lines, left_out, searchable) if lines else "")
    if not more:   # nothing new besides what the raw history held: the summary stays as it was
        return previous, meta
    content = previous + "\n\n" + more
    if count(content) > limit:
        return None
    body = (meta.body + "\n" + text.strip()).strip() if text.strip() else meta.body
    return content, SummaryMeta(list(meta.kept) + kept, body, merge_standing(meta.standing, standing),
                                list(meta.results) + lines, meta.left_out + left_out)


def previous_summary(entries: List, n_prefix: int, cut: int):
    """The summary entry the span ``entries[n_prefix:cut]`` begins with, when it holds no other summary;
    None otherwise."""
    span = entries[n_prefix:cut]
    if not span or not span[0].summary or any(e.summary for e in span[1:]):
        return None
    return span[0]


__all__ = ["LATER_HEADING", "addition", "extend", "previous_summary"]
