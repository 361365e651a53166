"""The compaction policy: *when* to compact and *what* to cut (pure: no engine, no I/O).

Modes (``Policy.mode``), as in the SelfCompact paper plus our background preparation:

``none``
    truncation: no summary; when the window is full the oldest turns after the system prompt are
    dropped (llama.cpp's context shift).  ``/compact`` still summarizes on request.
``fixed``
    summarize synchronously whenever fill crosses ``fixed_at`` (the fixed-interval baseline).
``hard``
    summarize synchronously at ``hard`` (what agent harnesses do today; Deep Agents' 85%).
``tool``
    the compaction tool alone, no probes (the paper's ablation); ``hard`` is the safety net.
``rubric``
    SelfCompact: a rubric probe every ``probe_every`` generated tokens and after every
    ``probe_every_tools`` tool results; COMPRESS (p >= ``threshold``, by default the model's calibrated
    one) summarizes synchronously; ``hard`` is the safety net.  On a model whose probe carries no signal
    (``calibration.py``) the probe is not asked and the mode compacts at ``hard``.
``background`` (default)
    ``rubric``, but the summary is prepared in the background (``compaction/scheduler.py`` decides when:
    predicted time to ``hard`` against predicted preparation time, never later than ``soft``) and the
    rebased context is prefilled; COMPRESS, the tool or ``hard`` commits it.

In the probing modes a *structural* cue adds ``cue_weight`` to p(COMPRESS): the assistant just answered
without calling a tool, or a user message arrived since the last probe (``compaction/cue.py``; true of every
agent, never the wording of a tool's output).  Its default weight is 0: on the stored calibration points of
the default model the cue did not separate boundaries better than p alone (``bench/eval/calibrate.py
--lofo``); the session still reports it on every ``probe`` event (``cue``).  ``result_cue`` is the
deprecated name of ``cue_weight`` (accepted, no error).  At the window edge an unfinished summary is waited
for at most ``max_stall_ms``, then the deterministic fallback is used.

Thresholds are fractions of each mode's own trigger (``fixed_at`` in ``fixed``, ``hard`` otherwise, the
window in ``none``): the tool refuses below ``tool_min_fill`` x trigger, probes are skipped below
``probe_min_fill`` x trigger.  The summary budget defaults to 1/8 of the window (at most 512 tokens); the
user's own messages are kept verbatim within ``keep_user_tokens`` (default 1/8 of the window).

Cells: ``n_ctx`` is one pool shared by every sequence, so the window is not the whole pool: the forks
(probe, summary, prepared context) need room too.  :func:`reserve_cells` says how much and
:func:`resolve_window` picks the largest window that fits (or rejects one that cannot).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Optional

# cells: what a session's summary message and forks take (budgets.py), re-exported here
from .budgets import (PROBE_SLACK, SUMMARY_MESSAGE_OVERHEAD, SummaryBudget, reserve_cells,  # noqa: F401
                      resolve_window, shadow_budget, summary_budget, summary_message_budget)
from .cut_rules import MsgInfo, choose_cut, cut_allowed, drop_plan, starts  # noqa: F401 (re-exported)

MODES = ("none", "fixed", "hard", "rubric", "background", "tool")
REBASE_MODES = ("exact", "splice")
PROBING_MODES = ("rubric", "background")
SUMMARIZING_MODES = ("fixed", "hard", "rubric", "background", "tool")
TOOL_MODES = ("fixed", "hard", "rubric", "background", "tool")

# fixed token overheads (chat-template headers of the summary message, probe label tokens, slack)
MAX_DEFAULT_SUMMARY = 512
SEARCH_MIN_WINDOW = 1024   # history_tool=None offers search_history from this window up


@dataclass
class Policy:
    mode: str = "background"
    window: Optional[int] = None
    hard: float = 0.85
    soft: float = 2 / 3
    fixed_at: float = 0.30
    keep_recent: float = 0.10
    probe_every: int = 256
    probe_on_tool_result: bool = True
    rubric: str = "boundary"             # the rubric measured best on the default model (calibration.py)
    threshold: Optional[float] = None    # None: the model's calibrated threshold (calibration.py)
    cue_weight: float = 0.0              # added to p(COMPRESS) at a structural cue (compaction/cue.py); see above
    rebase: str = "exact"
    compact_tool: bool = True
    history_tool: Optional[bool] = None  # offer search_history (None: when the window is None or >= 1024)
    tool_min_fill: float = 0.5           # x the mode's trigger: the tool refuses below
    summary_max_tokens: Optional[int] = None  # None: window // 8 (at most 512)
    # extras (all have defaults)
    max_stall_ms: float = 500.0          # at the window edge, wait this long for a summary, then fall back
    keep_user_tokens: Optional[int] = None  # user messages kept verbatim through compaction (None: window // 8)
    probe_every_tools: int = 1           # probe after every N tool results
    probe_min_fill: float = 0.25         # x the mode's trigger: probes below are skipped (nothing to gain)
    early_start: float = 0.15            # the schedule may start a preparation this much below soft
    summary_timeout: float = 300.0       # seconds before a summary attempt counts as failed
    summary_retries: int = 1             # retries after a failed attempt before the deterministic fallback
    chunk_tokens: int = 16               # generation chunk between fill checks / probe checks
    min_summary_span: Optional[int] = None  # min non-summary tokens a summary must cover (None: auto)
    notes: Optional[bool] = None         # the model notes each tool result's lines the task needs, in the
                                         # background (compaction/summary/notes.py); None: in background mode

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"Policy.mode must be one of {MODES}, got {self.mode!r}")
        if self.rebase not in REBASE_MODES:
            raise ValueError(f"Policy.rebase must be one of {REBASE_MODES}, got {self.rebase!r}")
        for name in ("hard", "soft", "fixed_at", "keep_recent", "tool_min_fill", "threshold", "probe_min_fill",
                     "early_start", "cue_weight"):
            v = getattr(self, name)
            if v is None and name == "threshold":
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not (0.0 <= float(v) <= 1.0):
                raise ValueError(f"Policy.{name} must be a fraction in [0, 1], got {v!r}")
        if not 0 < self.hard <= 1:
            raise ValueError(f"Policy.hard must be in (0, 1], got {self.hard!r}")
        if not 0 < self.fixed_at <= 1:
            raise ValueError(f"Policy.fixed_at must be in (0, 1], got {self.fixed_at!r}")
        if self.keep_recent >= self.hard:
            raise ValueError("Policy.keep_recent must be smaller than Policy.hard")
        if self.mode == "background" and not (0 < self.soft < self.hard):
            raise ValueError(f"Policy.soft must be in (0, hard) in background mode, got soft={self.soft!r}, "
                             f"hard={self.hard!r}")
        if self.mode == "fixed" and self.keep_recent >= self.fixed_at:
            raise ValueError("Policy.keep_recent must be smaller than Policy.fixed_at in fixed mode")
        for name in ("window", "keep_user_tokens"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < (1 if name == "window" else 0)):
                raise ValueError(f"Policy.{name} must be a positive int or None, got {v!r}")
        for name in ("probe_every", "probe_every_tools", "chunk_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Policy.{name} must be a positive int, got {v!r}")
        if self.summary_max_tokens is not None and (not isinstance(self.summary_max_tokens, int)
                                                    or self.summary_max_tokens < 8):
            raise ValueError(f"Policy.summary_max_tokens must be an int >= 8 or None, got {self.summary_max_tokens!r}")
        if not isinstance(self.max_stall_ms, (int, float)) or self.max_stall_ms < 0:
            raise ValueError(f"Policy.max_stall_ms must be a number >= 0, got {self.max_stall_ms!r}")
        if not isinstance(self.compact_tool, bool):
            raise ValueError(f"Policy.compact_tool must be True or False, got {self.compact_tool!r}")
        if self.notes is not None and not isinstance(self.notes, bool):
            raise ValueError(f"Policy.notes must be True, False or None (in background mode), got {self.notes!r}")
        if self.notes is True and self.mode != "background":
            raise ValueError(f"Policy.notes=True needs mode='background' (a synchronous mode would wait for each "
                             f"note), got mode={self.mode!r}; leave notes=None")
        if self.history_tool is not None and not isinstance(self.history_tool, bool):
            raise ValueError(f"Policy.history_tool must be True, False or None (auto), got {self.history_tool!r}")
        from . import rubrics
        rubrics.load(self.rubric)  # ValueError for an unknown name
        if self.summary_retries < 0:
            raise ValueError("Policy.summary_retries must be >= 0")

    # ------------------------------------------------------------------ derived quantities
    @property
    def probes(self) -> bool:
        return self.mode in PROBING_MODES

    @property
    def summarizes(self) -> bool:
        return self.mode in SUMMARIZING_MODES

    @property
    def takes_notes(self) -> bool:
        """The model notes tool results in the background: only in background mode (a synchronous mode
        would wait for each note), unless ``notes=False``."""
        return self.mode == "background" and self.notes is not False

    @property
    def offers_tool(self) -> bool:
        return self.compact_tool and self.mode in TOOL_MODES

    @property
    def offers_search(self) -> bool:
        """search_history is offered: explicitly, or by default where its ~90-token schema is a small share
        of the window (a window of at least SEARCH_MIN_WINDOW, or None: the largest that fits)."""
        if self.history_tool is not None:
            return self.history_tool
        return self.window is None or self.window >= SEARCH_MIN_WINDOW

    def with_(self, **kw) -> "Policy":
        if "result_cue" in kw:  # the deprecated name
            kw["cue_weight"] = kw.pop("result_cue")
        return replace(self, **kw)

    @property
    def result_cue(self) -> float:
        """Deprecated name of :attr:`cue_weight` (it meant a cue read from a tool output's wording; it is now
        the structural cue's weight)."""
        return self.cue_weight

    @result_cue.setter
    def result_cue(self, value: float) -> None:
        self.cue_weight = value

    def summary_tokens(self, window: int) -> int:
        """The summary budget: the explicit value, or 1/8 of the window (at most 512, at least 32)."""
        if self.summary_max_tokens is not None:
            return self.summary_max_tokens
        return max(32, min(MAX_DEFAULT_SUMMARY, window // 8))

    def user_tokens(self, window: int) -> int:
        """Tokens of the user's own messages kept verbatim in a rebased context (newest first): the explicit
        value, at most a quarter of the window (more could never fit beside the raw tail), or 1/8 of it."""
        if self.keep_user_tokens is not None:
            return min(self.keep_user_tokens, window // 4)
        return window // 8

    def limits(self, window: int) -> "Limits":
        return Limits.of(self, window)


def _accept_result_cue(init):
    """``Policy(result_cue=x)`` (the deprecated name) means ``Policy(cue_weight=x)``; it wins over a
    ``cue_weight`` passed with it (``dataclasses.replace(p, result_cue=x)`` passes both)."""
    @functools.wraps(init)
    def __init__(self, *args, result_cue=None, **kw):
        if result_cue is not None:
            kw["cue_weight"] = result_cue
        init(self, *args, **kw)
    return __init__


Policy.__init__ = _accept_result_cue(Policy.__init__)


@dataclass(frozen=True)
class Limits:
    """The policy's fractions turned into token counts for one window."""
    window: int
    hard: int
    soft: int
    fixed: int
    keep_recent: int
    tool_min: int
    min_span: int
    trigger: int = 0
    probe_min: int = 0
    summary: int = 0
    keep_user: int = 0
    earliest: int = 0     # the schedule never starts a preparation below this

    @classmethod
    def of(cls, p: Policy, window: int) -> "Limits":
        hard = max(1, math.floor(p.hard * window))
        fixed = max(1, math.floor(p.fixed_at * window))
        trigger = window if p.mode == "none" else fixed if p.mode == "fixed" else hard
        summary = p.summary_tokens(window)
        keep_recent = math.ceil(p.keep_recent * window)
        if p.summarizes and summary + SUMMARY_MESSAGE_OVERHEAD + keep_recent >= hard:
            what = f"hard limit ({hard} tokens)"
            if p.summary_max_tokens is None:
                raise ValueError(
                    f"window={window} is too small for mode {p.mode!r}: the default summary ({summary} tokens), "
                    f"its {SUMMARY_MESSAGE_OVERHEAD}-token message and keep_recent ({keep_recent}) must stay below "
                    f"the {what}; use a larger window")
            raise ValueError(
                f"Policy.summary_max_tokens={summary} does not fit a window of {window}: the summary, its "
                f"{SUMMARY_MESSAGE_OVERHEAD}-token message and keep_recent must stay below the {what}; "
                f"use summary_max_tokens <= {max(8, hard - SUMMARY_MESSAGE_OVERHEAD - keep_recent - 1)}, "
                "None (1/8 of the window) or a larger window")
        # a summary must cover clearly more than the summary message costs, or compacting gains nothing
        min_span = p.min_summary_span if p.min_summary_span is not None else \
            max(64, summary // 2 + SUMMARY_MESSAGE_OVERHEAD // 2)
        soft = math.floor(p.soft * window)
        return cls(window=window, hard=hard, soft=soft, fixed=fixed, keep_recent=keep_recent,
                   tool_min=math.floor(p.tool_min_fill * trigger), min_span=min_span, trigger=trigger,
                   probe_min=math.floor(p.probe_min_fill * trigger), summary=summary,
                   keep_user=p.user_tokens(window), earliest=max(0, soft - math.ceil(p.early_start * window)))

    def trigger_for(self, mode: str) -> int:
        return self.window if mode == "none" else self.fixed if mode == "fixed" else self.hard


# ------------------------------------------------------------------------------- decisions
def sync_due(p: Policy, limits: Limits, tokens_after: int) -> bool:
    """Is a synchronous compaction (or, in background mode, a commit) due before reaching ``tokens_after``?"""
    if p.mode == "none":
        return tokens_after > limits.window
    return tokens_after >= limits.trigger_for(p.mode)


def preparation_due(p: Policy, limits: Limits, tokens: int) -> bool:
    """The latest point a background preparation may start: ``soft`` (the scheduler starts earlier)."""
    return p.mode == "background" and tokens >= limits.soft


def needs_restart(p: Policy, window: int, *, summary_tokens: int, tail_tokens: int, prefix_tokens: int = 0,
                  overhead: int = SUMMARY_MESSAGE_OVERHEAD) -> str:
    """Restart rule for a background preparation (``prefix + summary + raw tail`` is what committing it
    gives).  ``"tail_outgrew_hard"``: committing would no longer bring the fill below ``hard``;
    ``"tail_outgrew_budget"``: the shadow outgrew its reserved cells plus the headroom above ``hard``.
    (The session also restarts with ``"tail_outgrew_window"`` when committing would leave no room for the
    next turn, by the largest recent one, and a later cut would.)
    ``""``: the preparation still helps.  ``overhead``: template tokens not counted in ``summary_tokens``."""
    if p.mode != "background":
        return ""
    shadow = summary_tokens + overhead + tail_tokens
    if prefix_tokens + shadow >= math.floor(p.hard * window):
        return "tail_outgrew_hard"
    if shadow > shadow_budget(p, window) + math.floor(max(0.0, 1.0 - p.hard) * window):
        return "tail_outgrew_budget"
    return ""


def probe_due(p: Policy, *, generated_since_probe: int = 0, tool_results_since_probe: int = 0,
              after_tool_result: bool = False) -> bool:
    """Cadence: every ``probe_every`` generated tokens, and after every ``probe_every_tools`` tool results."""
    if not p.probes:
        return False
    if p.probe_on_tool_result and (tool_results_since_probe >= p.probe_every_tools
                                   or (after_tool_result and p.probe_every_tools == 1)):
        return True
    return generated_since_probe >= p.probe_every


def probe_skip_reason(p: Policy, limits: Limits, tokens: int) -> str:
    """Why a due probe need not ask the model ("" when it should): below the floor nothing is worth it."""
    if tokens < limits.probe_min:
        return "below_floor"
    return ""


def verdict(p: Policy, limits: Limits, p_compress: float, tokens: int, threshold: Optional[float] = None,
            cue: bool = False) -> tuple:
    """(verdict, reason). The label probability decides, above the probe floor (``probe_min_fill`` x the
    mode's trigger): below it there is nothing worth compacting, whatever the model says.  ``threshold``:
    the session's (the policy's, else the model's calibrated one, else 0.5).  ``cue``: a structural cue
    (``compaction/cue.py``) holds, which adds ``cue_weight`` to p(COMPRESS) (reason ``model+cue`` when that
    decided it)."""
    if tokens < limits.probe_min:
        return "CONTINUE", "below_floor"
    if p_compress != p_compress:  # NaN
        return "CONTINUE", "no_probability"
    t = threshold if threshold is not None else p.threshold if p.threshold is not None else 0.5
    if p_compress >= t:
        return "COMPRESS", "model"
    if cue and p.cue_weight > 0 and p_compress + p.cue_weight >= t:
        return "COMPRESS", "model+cue"
    return "CONTINUE", "model"


def tool_allowed(p: Policy, limits: Limits, tokens: int) -> bool:
    """The compaction tool refuses below ``tool_min_fill`` x the mode's trigger ("Nothing to compact yet")."""
    return p.mode != "none" and tokens >= limits.tool_min


__all__ = ["Policy", "Limits", "MsgInfo", "MODES", "reserve_cells", "resolve_window", "shadow_budget",
           "choose_cut", "cut_allowed", "drop_plan", "sync_due", "preparation_due", "needs_restart",
           "probe_due", "probe_skip_reason", "verdict", "tool_allowed", "starts", "summary_message_budget",
           "SummaryBudget", "summary_budget"]
