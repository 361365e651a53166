"""Compaction events.

Every event is a small dataclass with a ``name`` (the event's type as a string, e.g. ``"probe"``) and
``t`` (``time.time()`` when it happened).  The session keeps them in ``session.events`` and yields them
from ``session.stream`` in the order they happen.  The spec'd fields come first, in the spec'd order:

- ``probe(verdict, p, tokens, ms)``
- ``summary_started(mark)``
- ``summary_ready(tokens, ms)``
- ``rebased(mode, tokens_before, tokens_after, stall_ms, catch_up_tokens)``: ``catch_up_tokens`` are the
  rows the swap decoded on the conversation's own sequence (foreground) while it waited: a prepared
  commit's last few tokens; the summary and the raw tail of a swap rebuilt in place; the whole new
  sequence of the last-resort fresh one.  A rebase prepared at the swap and waited for (splice, recurrent
  models, a remote engine) is decoded as background rows and counts only its commit's last tokens
- ``offloaded(path, messages)``
- ``tool_refused(fill)``

plus a few extra ones that make the policy observable (``summary_failed``, ``preparation_restarted``,
``dropped``, ``probe_skipped``, ``compaction_skipped``, ``history_searched``, ``recalled``).  Every due
probe is an event: ``probe`` when the model was asked, ``probe_skipped`` (with the reason) when it was not.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class Event:
    name = "event"

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["event"] = self.name
        return d

    @property
    def type(self) -> str:  # alias, handy in JSON-ish consumers
        return self.name


@dataclass
class Probe(Event):
    """A rubric probe: ``verdict`` is "COMPRESS" or "CONTINUE", ``p`` the probability of COMPRESS."""
    verdict: str
    p: float
    tokens: int
    ms: float
    reason: str = "model"          # "model" (label probabilities), "model+cue", or the rule that overrode it
    fill: float = 0.0
    trigger: str = "interval"      # "interval" | "tool_result"
    cue: bool = False              # a structural cue held (compaction/cue.py); Policy.cue_weight was added
    t: float = field(default_factory=time.time)
    name = "probe"


@dataclass
class SummaryStarted(Event):
    """A summary of the live messages before the cut ``mark`` (an index into the live messages; ``mark_tokens``
    its token position) has started.  (The field names predate the code's word for it, "cut"; they stay, being
    public.)"""
    mark: int
    mark_tokens: int = 0
    background: bool = True
    reason: str = ""
    t: float = field(default_factory=time.time)
    name = "summary_started"


@dataclass
class SummaryReady(Event):
    tokens: int
    ms: float
    fallback: bool = False
    attempts: int = 1
    text: str = ""                 # the summary's own text (the model's, or the fallback's)
    t: float = field(default_factory=time.time)
    name = "summary_ready"


@dataclass
class SummaryFailed(Event):
    reason: str                    # "exception" | "empty" | "over_length" | "timeout"
    attempt: int
    detail: str = ""
    t: float = field(default_factory=time.time)
    name = "summary_failed"


@dataclass
class Rebased(Event):
    mode: str
    tokens_before: int
    tokens_after: int
    stall_ms: float
    catch_up_tokens: int
    trigger: str = ""              # "hard" | "fixed" | "compress" | "tool" | "manual" | "window"
    prepared: bool = False         # the summary and rebased context were ready before the swap (no wait)
    engine_stall_ms: Optional[float] = None
    wait_ms: float = 0.0           # time spent waiting for an unfinished summary (at most max_stall_ms)
    fallback: bool = False         # the deterministic fallback summary was used
    worst_stall_ms: float = 0.0    # the session's worst stall so far, this one included
    summary_tokens: int = 0        # tokens of the summary message that replaced the history
    kept_tokens: int = 0           # of which: messages carried verbatim (the user's, pinned ones)
    # of which: leading tokens already in place (an extended summary: the previous one's tokens, kept as
    # they were, their KV not computed again)
    summary_reused: int = 0
    t: float = field(default_factory=time.time)
    name = "rebased"


@dataclass
class Offloaded(Event):
    path: str
    messages: int
    t: float = field(default_factory=time.time)
    name = "offloaded"


@dataclass
class ToolRefused(Event):
    """The compaction tool refused: below ``tool_min_fill`` x the mode's trigger, or mode ``none``."""
    fill: float
    reason: str = "below_min_fill"
    t: float = field(default_factory=time.time)
    name = "tool_refused"


@dataclass
class HistorySearched(Event):
    """The session ran ``search_history`` (for the model, or the caller): the query and the offloaded lines
    the result shows."""
    query: str
    lines: int
    tokens: int
    fill: float = 0.0
    t: float = field(default_factory=time.time)
    name = "history_searched"


@dataclass
class Recalled(Event):
    """A new message named things (``names``) that only the offloaded history held: the session placed
    ``lines`` of it (``tokens`` tokens, the ``search_history`` ranking) in the live context before the reply,
    as a ``tool`` message flagged ``"recall": True`` (``compaction/recall.py``)."""
    names: List[str]
    lines: int
    tokens: int
    fill: float = 0.0
    t: float = field(default_factory=time.time)
    name = "recalled"


@dataclass
class Noted(Event):
    """The model noted, on a fork in the background, which lines of the tool result at transcript index
    ``message`` the task will need (``lines``, copied verbatim: ``compaction/summary/notes.py``); a summary replacing
    that result keeps them with the priority of the assistant's own statements."""
    message: int
    lines: List[str]
    prompt_tokens: int
    tokens: int
    ms: float
    t: float = field(default_factory=time.time)
    name = "noted"


@dataclass
class NoteSkipped(Event):
    """No note for the tool result at ``message``: ``reason`` is no_room (the pool's cells are in use),
    superseded (newer outputs came before it started), gone (a swap replaced it before its turn), moved_on
    (other messages followed it and the engine cannot fork a prefix), no_cut (the next message starts inside
    a token: no place to cut right after the output), template (the chat template re-renders
    earlier turns), empty (the model copied no line of the output),
    unsupported: ... (the backend takes no grammar: notes stop for the session) or failed: ... (the engine
    refused the job)."""
    message: int
    reason: str
    t: float = field(default_factory=time.time)
    name = "note_skipped"


@dataclass
class ReplyFollows(Event):
    """The session answered the model's own tool calls (``tools``: their names) and the model replies
    again within the same call: a stream's text so far was one reply, the next begins now."""
    tools: list
    t: float = field(default_factory=time.time)
    name = "reply_follows"


@dataclass
class PreparationRestarted(Event):
    """A background preparation was dropped (and maybe started again at a later cut); ``old_mark``: its cut."""
    reason: str
    old_mark: int
    tail_tokens: int = 0
    t: float = field(default_factory=time.time)
    name = "preparation_restarted"


@dataclass
class Dropped(Event):
    """The oldest turns after the system prompt were dropped (context shift): mode ``none``, or a
    summarizing mode with no cut point left to summarize (``reason`` says which)."""
    messages: int
    tokens: int
    reason: str = "truncation"
    t: float = field(default_factory=time.time)
    name = "dropped"


@dataclass
class ProbeSkipped(Event):
    """A probe was due but the model was not asked (``reason``: no_signal (its probe is not trusted on this
    model: calibration.py) (on this model the probe says COMPRESS only after a tool output that
    states a result, and the last one did not), below_floor, no_cut_point, no_room, committing, failed)."""
    reason: str
    fill: float = 0.0
    trigger: str = "interval"
    t: float = field(default_factory=time.time)
    name = "probe_skipped"


@dataclass
class CompactionSkipped(Event):
    """A compaction was asked for but did not happen (``reason``: no_cut_point, no_gain)."""
    reason: str
    trigger: str = ""
    fill: float = 0.0
    t: float = field(default_factory=time.time)
    name = "compaction_skipped"


@dataclass
class KeptOverBudget(Event):
    """Messages that are always kept verbatim (the first user message, pinned ones) did not fit their
    budget: ``reason`` ``"clipped"`` (kept with their middle cut, their head and end verbatim, and handed
    whole to the summarizer), ``"over_budget"`` (too little room even for that: handed to the summarizer,
    whose prompt lists them) or
    ``"no_room"`` (a smaller summary message was needed for the swap to fit; they stay in the history) or
    ``"no_gain"`` (the window was full and a summary keeping them freed nothing: this one summary hands them
    to the summarizer, and the next keeps them again)."""
    messages: List[int]            # transcript indices
    tokens: int
    budget: int
    reason: str = "over_budget"
    t: float = field(default_factory=time.time)
    name = "kept_over_budget"


# lower-case aliases matching the names used in the spec: events.probe(...), events.rebased(...)
probe = Probe
summary_started = SummaryStarted
summary_ready = SummaryReady
summary_failed = SummaryFailed
rebased = Rebased
offloaded = Offloaded
tool_refused = ToolRefused
preparation_restarted = PreparationRestarted
dropped = Dropped
probe_skipped = ProbeSkipped
compaction_skipped = CompactionSkipped
kept_over_budget = KeptOverBudget
history_searched = HistorySearched
recalled = Recalled
noted = Noted
note_skipped = NoteSkipped
reply_follows = ReplyFollows

ALL = {c.name: c for c in (Probe, SummaryStarted, SummaryReady, SummaryFailed, Rebased, Offloaded,
                           ToolRefused, PreparationRestarted, Dropped, ProbeSkipped, CompactionSkipped,
                           KeptOverBudget, HistorySearched, Recalled, Noted, NoteSkipped, ReplyFollows)}

__all__ = ["Event", "Probe", "SummaryStarted", "SummaryReady", "SummaryFailed", "Rebased", "Offloaded",
           "ToolRefused", "PreparationRestarted", "Dropped", "ProbeSkipped",
           "CompactionSkipped", "KeptOverBudget", "HistorySearched", "Recalled", "Noted", "NoteSkipped", "ReplyFollows", "ALL"]
