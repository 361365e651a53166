"""The compaction policy: *when* to compact and *what* to cut.

Everything here is pure (no engine, no I/O) so that it can be tested exhaustively; the session executes
the decisions through sequence operations only.

Modes (``Policy.mode``):

``none``
    no summarization; when the window is full the oldest turns after the system prompt are dropped
    (llama.cpp's context shift: about half of what follows the system prompt goes).
``fixed``
    summarize synchronously whenever fill crosses ``fixed_at`` (SelfCompact's fixed-interval baseline).
``hard``
    summarize synchronously at ``hard`` (what agent harnesses do today; Deep Agents' 85%).
``rubric``
    SelfCompact: every ``probe_every`` generated tokens and after each tool result, the rubric is probed on
    a fork; a COMPRESS verdict (p >= ``threshold``) summarizes synchronously and rebases; ``hard`` is the
    safety net.
``background`` (default)
    ``rubric`` plus: from ``soft`` fill a summary is prepared in the background from a snapshot mark and
    the rebased context is prefilled with ``prepare_rebase``; a COMPRESS verdict, the compaction tool or
    reaching ``hard`` commits it.  If the summary is still being written (or the rebased context is still
    catching up) when ``hard`` is reached, the session keeps going in the headroom between ``hard`` and
    the window and commits as soon as it is ready; only if the window itself is about to be exceeded does
    it wait.

Cells.  With ``kv_unified`` the engine's ``n_ctx`` is one pool shared by every sequence, so the window is
not the whole pool: the session's forks need room too.  :func:`reserve_cells` says how much, and
:func:`resolve_window` picks the largest window that fits (or rejects one that cannot).

Restart rule (background mode).  A preparation summarizes the history up to its mark; everything after
the mark is carried raw, and that raw tail keeps growing while the preparation waits for a COMPRESS
verdict or ``hard``.  The prepared context is ``prefix + summary + raw tail``.  The preparation is
cancelled and restarted from a new mark at the current end (:func:`needs_restart`) when

- committing it would no longer bring the fill below ``hard`` (``prefix + summary + tail >= hard x
  window``): the raw tail alone has grown too large for the prepared summary to help; or
- the shadow (``summary + tail``; its prefix cells are shared) outgrows ``summary budget +
  (keep_recent + 1 - soft) x window`` (the cells reserved for it up to ``hard`` plus the headroom);

and only if the current history allows a later mark whose prepared context would pass both checks (the
session checks that), so a restart always summarizes more and never churns.  A restart throws away work
in progress, so the rule is deliberately loose: a prepared context that lands between ``soft`` and
``hard`` is still committed (a new preparation then starts at once).  Before the summary is ready its size is taken as ``summary_max_tokens``.
The summary messages' own template tokens count as ``SUMMARY_MESSAGE_OVERHEAD``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import List, Optional, Sequence

MODES = ("none", "fixed", "hard", "rubric", "background")
REBASE_MODES = ("exact", "splice")
PROBING_MODES = ("rubric", "background")
SUMMARIZING_MODES = ("fixed", "hard", "rubric", "background")

# fixed token overheads (chat-template headers of the summary message, probe label tokens, slack)
SUMMARY_MESSAGE_OVERHEAD = 96
PROBE_SLACK = 8


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
    rubric: str = "default"
    threshold: float = 0.5
    rebase: str = "exact"
    compact_tool: bool = True
    tool_min_fill: float = 0.5
    summary_max_tokens: int = 512
    # extras (not in the spec'd signature; all have defaults)
    summary_timeout: float = 300.0       # seconds before a summary attempt counts as failed
    summary_retries: int = 1             # retries after a failed attempt before the deterministic fallback
    chunk_tokens: int = 16               # generation chunk between fill checks / probe checks
    min_summary_span: Optional[int] = None  # min non-summary tokens a summary must cover (None: auto)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"Policy.mode must be one of {MODES}, got {self.mode!r}")
        if self.rebase not in REBASE_MODES:
            raise ValueError(f"Policy.rebase must be one of {REBASE_MODES}, got {self.rebase!r}")
        for name in ("hard", "soft", "fixed_at", "keep_recent", "tool_min_fill", "threshold"):
            v = getattr(self, name)
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
        if self.window is not None and (not isinstance(self.window, int) or isinstance(self.window, bool)
                                        or self.window <= 0):
            raise ValueError(f"Policy.window must be a positive int or None, got {self.window!r}")
        if not isinstance(self.probe_every, int) or self.probe_every < 1:
            raise ValueError(f"Policy.probe_every must be a positive int, got {self.probe_every!r}")
        if not isinstance(self.summary_max_tokens, int) or self.summary_max_tokens < 8:
            raise ValueError(f"Policy.summary_max_tokens must be an int >= 8, got {self.summary_max_tokens!r}")
        from . import rubrics
        rubrics.load(self.rubric)  # ValueError for an unknown name
        if self.chunk_tokens < 1:
            raise ValueError("Policy.chunk_tokens must be >= 1")
        if self.summary_retries < 0:
            raise ValueError("Policy.summary_retries must be >= 0")

    # ------------------------------------------------------------------ derived quantities
    @property
    def probes(self) -> bool:
        return self.mode in PROBING_MODES

    @property
    def summarizes(self) -> bool:
        return self.mode in SUMMARIZING_MODES

    def with_(self, **kw) -> "Policy":
        return replace(self, **kw)

    def limits(self, window: int) -> "Limits":
        return Limits.of(self, window)


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

    @classmethod
    def of(cls, p: Policy, window: int) -> "Limits":
        hard = max(1, math.floor(p.hard * window))
        # a summary must cover clearly more than the summary message costs, or compacting gains nothing
        min_span = p.min_summary_span if p.min_summary_span is not None else \
            max(64, p.summary_max_tokens // 2 + SUMMARY_MESSAGE_OVERHEAD // 2)
        return cls(window=window, hard=hard, soft=math.floor(p.soft * window),
                   fixed=max(1, math.floor(p.fixed_at * window)),
                   keep_recent=math.ceil(p.keep_recent * window),
                   tool_min=math.floor(p.tool_min_fill * p.hard * window), min_span=min_span)

    def trigger(self, mode: str) -> int:
        """Token count at which a synchronous compaction is due (``none``: the window itself)."""
        if mode == "none":
            return self.window
        if mode == "fixed":
            return self.fixed
        return self.hard


# ---------------------------------------------------------------------------------------- cells
def shadow_budget(p: Policy, window: int) -> int:
    """Cells reserved for the prepared (shadow) context beyond the shared prefix: summary + raw tail."""
    tail = math.ceil(p.keep_recent * window)
    if p.mode == "background":  # the tail grows from the mark (at soft) up to hard
        tail += math.ceil(max(0.0, p.hard - p.soft) * window)
    else:
        # synchronous modes cut at the trigger, leaving keep_recent raw (+ one message of slack)
        tail += math.ceil(0.05 * window)
    return p.summary_max_tokens + SUMMARY_MESSAGE_OVERHEAD + tail


def reserve_cells(p: Policy, window: int, *, probe_tokens: int = 0, summarizer_tokens: int = 0) -> int:
    """Cells the session needs beyond its window at the worst moment.

    The probe fork holds ``probe_tokens`` new cells (briefly); the summary fork holds the summarizer prompt
    and the summary (its history cells are shared with the live sequence); the shadow holds the summary
    message and the raw tail up to ``hard`` (its prefix cells are shared).  The summary fork is closed
    before the shadow is prepared, so they never coexist; a probe is skipped (CONTINUE) when the pool has
    no room for it at that moment, and the headroom above ``hard`` in background mode is used only while
    the pool has room for the larger shadow (both checked against the engine's free cells at run time).
    So reserve = max(probe, summary fork, shadow).
    """
    if p.mode == "none":
        return 0
    probe = (probe_tokens + PROBE_SLACK) if p.probes else 0
    summ = summarizer_tokens + p.summary_max_tokens + PROBE_SLACK
    return max(probe, summ, shadow_budget(p, window))


def resolve_window(p: Policy, free_cells: int, *, probe_tokens: int = 0, summarizer_tokens: int = 0,
                   min_window: int = 64) -> int:
    """The window for ``p`` given ``free_cells`` in the engine's pool.

    ``p.window=None`` picks the largest window that fits; an explicit window that cannot fit (or a pool
    too small for any useful window) raises ``ValueError`` — at session creation, not at a failed decode.
    """
    def need(w: int) -> int:
        return w + reserve_cells(p, w, probe_tokens=probe_tokens, summarizer_tokens=summarizer_tokens)

    if p.window is not None:
        n = need(p.window)
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


# ------------------------------------------------------------------------------ mark selection
@dataclass(frozen=True)
class MsgInfo:
    """What the cut rules need to know about one live message."""
    role: str
    tokens: int                  # tokens this message occupies in the live sequence
    tool_call: bool = False      # assistant message carrying tool calls
    summary: bool = False        # a summary produced by an earlier compaction
    cut_ok: bool = True          # a clean token boundary exists at this message's start


def starts(msgs: Sequence[MsgInfo], base: int = 0) -> List[int]:
    out, s = [], base
    for m in msgs:
        out.append(s)
        s += m.tokens
    out.append(s)
    return out


def cut_allowed(msgs: Sequence[MsgInfo], m: int) -> bool:
    """May the history be cut before message ``m`` (``m == len(msgs)``: after the last one)?

    A cut never separates an assistant tool call from its results: not before a tool message, and not
    right after a tool call whose results have not arrived yet.
    """
    if m <= 0 or m > len(msgs):
        return False
    if m == len(msgs):
        return not msgs[-1].tool_call
    return msgs[m].role != "tool" and msgs[m].cut_ok


def choose_mark(msgs: Sequence[MsgInfo], n_prefix: int, keep_recent_tokens: int, *, min_span: int = 1,
                extra_tail: int = 0) -> Optional[int]:
    """The snapshot mark: summarize ``msgs[n_prefix:mark]``, keep ``msgs[mark:]`` raw.

    The largest allowed cut that leaves at least ``keep_recent_tokens`` raw (``extra_tail`` counts tokens
    after the last message, e.g. a reply being generated) and covers at least ``min_span`` tokens of
    non-summary history.  ``None`` when there is no such cut (nothing worth summarizing yet).
    """
    st = starts(msgs)
    total = st[-1] + extra_tail
    best = None
    for m in range(n_prefix + 1, len(msgs) + 1):
        if total - st[m] < keep_recent_tokens:
            break
        if not cut_allowed(msgs, m):
            continue
        best = m
    if best is None:
        return None
    span = sum(x.tokens for x in msgs[n_prefix:best] if not x.summary)
    if span < max(1, min_span):
        return None
    return best


def drop_plan(msgs: Sequence[MsgInfo], n_prefix: int, need_tokens: int) -> Optional[int]:
    """Mode ``none`` (context shift): drop ``msgs[n_prefix:m]``; returns ``m``.

    Drops at least ``need_tokens`` and about half of what follows the prefix (as llama.cpp's context
    shift does), at an allowed cut. ``None`` if even dropping everything allowed does not free enough.
    """
    st = starts(msgs)
    after_prefix = st[-1] - st[n_prefix]
    goal = max(need_tokens, after_prefix // 2)
    last_ok = None
    for m in range(n_prefix + 1, len(msgs) + 1):
        if not cut_allowed(msgs, m):
            continue
        last_ok = m
        if st[m] - st[n_prefix] >= goal:
            return m
    if last_ok is not None and st[last_ok] - st[n_prefix] >= need_tokens:
        return last_ok
    return None


# ------------------------------------------------------------------------------- decisions
def sync_due(p: Policy, lim: Limits, tokens_after: int) -> bool:
    """Is a synchronous compaction (or, in background mode, a commit) due before reaching ``tokens_after``?"""
    if p.mode == "none":
        return tokens_after > lim.window
    return tokens_after >= lim.trigger(p.mode)


def preparation_due(p: Policy, lim: Limits, tokens: int) -> bool:
    return p.mode == "background" and tokens >= lim.soft


def needs_restart(p: Policy, window: int, *, summary_tokens: int, tail_tokens: int, prefix_tokens: int = 0,
                  overhead: int = SUMMARY_MESSAGE_OVERHEAD) -> str:
    """Restart rule (module docstring). Returns the reason ("" when the preparation still helps):
    ``"tail_outgrew_hard"`` or ``"tail_outgrew_budget"``. ``overhead``: template tokens of the summary
    message not counted in ``summary_tokens`` (0 when ``summary_tokens`` is the rendered message)."""
    if p.mode != "background":
        return ""
    shadow = summary_tokens + overhead + tail_tokens
    if prefix_tokens + shadow >= math.floor(p.hard * window):
        return "tail_outgrew_hard"
    if shadow > shadow_budget(p, window) + math.floor(max(0.0, 1.0 - p.hard) * window):
        return "tail_outgrew_budget"
    return ""


def probe_due(p: Policy, *, generated_since_probe: int = 0, after_tool_result: bool = False) -> bool:
    if not p.probes:
        return False
    if after_tool_result and p.probe_on_tool_result:
        return True
    return generated_since_probe >= p.probe_every


def verdict(p: Policy, lim: Limits, p_compress: float, tokens: int) -> tuple:
    """(verdict, reason). The label probability decides, above a rule floor: below ``tool_min_fill`` x
    ``hard`` there is nothing worth compacting, so the verdict is CONTINUE whatever the model says (small
    models judge poorly; see DESIGN.md)."""
    if tokens < lim.tool_min:
        return "CONTINUE", "below_min_fill"
    if p_compress != p_compress:  # NaN
        return "CONTINUE", "no_probability"
    return ("COMPRESS" if p_compress >= p.threshold else "CONTINUE"), "model"


def tool_allowed(p: Policy, lim: Limits, tokens: int) -> bool:
    """The compaction tool refuses below ``tool_min_fill`` x ``hard`` ("Nothing to compact yet")."""
    return tokens >= lim.tool_min


__all__ = ["Policy", "Limits", "MsgInfo", "MODES", "reserve_cells", "resolve_window", "shadow_budget",
           "choose_mark", "cut_allowed", "drop_plan", "sync_due", "preparation_due", "needs_restart",
           "probe_due", "verdict", "tool_allowed", "starts"]
