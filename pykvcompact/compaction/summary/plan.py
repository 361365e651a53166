"""What a summary of the live history is made of besides the model's text (:class:`Plan`): the messages
kept verbatim, the user messages over budget, and what the earlier summaries in the span carry forward
(their text, standing instructions and key results), then the span's own key results.

Apart from ``summaries.py`` because it only reads (the live context, the transcript, what each earlier
summary holds), while the summary maker keeps the state that changes as summaries are made.  The maker
plans twice per summary: when it starts the job, and when it composes the message that replaces the span.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional

from ...session.context import Context
from ...session.transcript import Transcript
from . import results as res
from .keeper import Candidate, SummaryMeta, merge_standing, message_text, plan_kept, split_standing
from .novelty import informative
from .shares import SummaryShares


@dataclass
class Plan:
    """What a summary of ``entries[n_prefix:cut]`` is made of, besides the model's text."""
    kept: list        # messages kept verbatim (Candidates)
    overflow: list    # user messages over budget (handed to the summarizer)
    carried: str      # the earlier summaries' text, carried forward
    standing: list    # the earlier summaries' standing instructions (carried with priority)
    results: list     # key results: the earlier summaries' list, then the span's own (results.py)
    left_out: int = 0  # results the earlier summaries left out for space (the next one still says so)
    prior: list = dataclasses.field(default_factory=list)   # the lines the earlier summaries listed


def first_user(transcript: List[dict]) -> Optional[int]:
    """The transcript index of the first user message that is not a summary, None before there is one."""
    return next((i for i, m in enumerate(transcript)
                 if m.get("role") == "user" and not m.get("summary")), None)


def plan_summary(ctx: Context, transcript: Transcript, meta: Dict[int, SummaryMeta], cut: int, *,
                 shares: SummaryShares, notes: Dict[int, List[str]], tight: bool) -> Plan:
    """What a summary of ``entries[n_prefix:cut]`` carries: the messages kept verbatim, the user
    messages over budget (handed to the summarizer), the earlier summaries' text, their standing
    instructions and their key results (carried forward with priority), then the span's own results.
    ``meta``: what each summary message holds, by ``id`` of the message; ``notes``: the model's notes of
    tool results, by transcript index; ``tight``: keep nothing verbatim."""
    first = first_user(transcript.messages)
    cands, carried, standing, results, span, left_out = [], [], [], [], [], 0
    for e in ctx.entries[ctx.n_prefix:cut]:
        if e.summary:
            summary_meta = meta.get(id(e.msg), SummaryMeta())
            # a message kept here as a plain user message may have been pinned since: it is one now
            cands.extend(dataclasses.replace(c, pinned=True) if transcript.is_pinned(c.tidx) else c
                         for c in summary_meta.kept)
            old, body = split_standing(summary_meta.body)  # (a body logged before standing was kept apart)
            standing.extend(summary_meta.standing + old)
            results.extend(summary_meta.results)
            left_out += summary_meta.left_out
            carried.append(body)
            continue
        if not transcript.is_pinned(e.tidx):   # a pinned message is kept whole: no need to list its lines
            span.append((e.tidx, e.msg))
        if e.msg.get("role") in ("user", "system") or transcript.is_pinned(e.tidx):
            text = message_text(e.msg)
            pinned = transcript.is_pinned(e.tidx) or e.msg.get("role") == "system"
            cands.append(Candidate(e.tidx, e.msg["role"], text, len(ctx.tok(text)) + 4,
                                   pinned, e.tidx == first))
    cands.extend(_musts_elsewhere(ctx, transcript, meta, cands))
    if tight:
        kept, overflow = plan_kept(cands, 0, must_limit=0)
    else:
        kept, overflow = plan_kept(cands, shares.users(), must_limit=shares.musts(),
                                   count=lambda text: len(ctx.tok(text)))
    found = res.extract(span, [e.msg for e in ctx.entries[:cut]], notes)
    carried = informative("\n".join(c for c in carried if c.strip()))   # (a body logged before novelty.py)
    return Plan(kept, overflow, carried, merge_standing(standing), res.merge(results, found), left_out,
                list(results))


def _musts_elsewhere(ctx: Context, transcript: Transcript, meta: Dict[int, SummaryMeta], cands) -> List[Candidate]:
    """The first user message and the pinned messages that neither the live context nor its summaries
    hold (pinned after they left it, or dropped by a swap that had no room for them): they come back
    verbatim in this summary."""
    held = {c.tidx for c in cands} | {e.tidx for e in ctx.entries if not e.summary}
    for e in ctx.entries:
        if e.summary:
            held.update(c.tidx for c in meta.get(id(e.msg), SummaryMeta()).kept)
    first = first_user(transcript.messages)
    out = []
    for i in sorted((transcript.pinned | ({first} if first is not None else set())) - held):
        m = transcript.messages[i]
        text = message_text(m)
        out.append(Candidate(i, m["role"], text, len(ctx.tok(text)) + 4, transcript.is_pinned(i),
                             i == first))
    return out


__all__ = ["Plan", "first_user", "plan_summary"]
