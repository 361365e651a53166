"""The rubric probe (SelfCompact): at its cadence, ask the model on a fork whether this is a good moment to
compact; every due probe is an event — ``probe`` when the model was asked, ``probe_skipped`` and why when
it was not.  The verdict adds ``Policy.cue_weight`` at a structural cue (``compaction/cue.py``: the assistant
just answered without calling a tool, or a user message arrived since the last probe); the wording of a
tool's output never counts.  Whether the model is asked at all, and at which threshold, follows its
measured calibration (:class:`ProbeSettings`, ``models/calibration.py``)."""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from .. import events as ev
from ..models.calibration import DEFAULT_THRESHOLD, MIN_AUC, MIN_HELD_OUT_J
from ..models.registry import for_engine
from .policy import probe_due, probe_skip_reason, verdict
from ..engine.port import engine_errors, free_cells
from .cue import structural_cue

PROBE_PROMPT = ("Context check. {rubric}\n"
                "Is this a good moment to compact the conversation? Answer with one word: COMPRESS or CONTINUE.")
LABELS = ("COMPRESS", "CONTINUE")


@dataclass(frozen=True)
class ProbeSettings:
    """What one session's prober does: ask the model or not, and the threshold it applies."""
    ask: bool
    threshold: float
    why: str                  # "" when asking; else the reason the probe is not asked

    @classmethod
    def of(cls, policy, engine, labels=None) -> "ProbeSettings":
        """The calibration applies to what was measured: its rubric, asked with the default labels."""
        if policy.threshold is not None:
            return cls(True, float(policy.threshold), "")
        cal = for_engine(engine) if labels is None or tuple(labels) == LABELS else None
        if cal is not None and cal.rubric != policy.rubric:
            cal = None
        if cal is None:
            return cls(True, DEFAULT_THRESHOLD, "")
        if not cal.has_signal:
            held = "" if cal.held_out_j is None else (
                f", held-out TPR-FPR {cal.held_out_j:.2f} < {MIN_HELD_OUT_J} at 10% false COMPRESS")
            return cls(False, cal.threshold,
                       f"the probe carries no signal on this model (AUC {cal.auc:.2f}, minimum {MIN_AUC}{held}; "
                       f"{cal.points} labelled points, {cal.source}): the session compacts on the schedule instead; "
                       "pass Policy(threshold=...) to ask the probe anyway")
        return cls(True, cal.threshold, "")


class Prober:
    def __init__(self, ctx, policy, limits, rubric: str, labels: Sequence[str], emit: Callable[[ev.Event], None]):
        self.ctx, self.policy, self.limits, self.rubric, self.labels, self.emit = ctx, policy, limits, rubric, tuple(labels), emit
        self.gen_since = 0
        self.tools_since = 0
        self.seen_tidx = -1   # the newest transcript index the last due probe saw (its cue's "since")
        # ask the model or not, and at which threshold: the policy's, else the model's calibration
        self.settings = ProbeSettings.of(policy, ctx.engine, self.labels)
        # a warning where the probe is the mode's whole point (rubric); background mode has its schedule, and
        # each due probe says why it was not asked (probe_skipped, no_signal)
        if policy.mode == "rubric" and not self.settings.ask:  # stacklevel: Session(...)'s caller
            warnings.warn(f"Policy(mode={policy.mode!r}): {self.settings.why}", RuntimeWarning, stacklevel=3)

    def generated(self, n: int) -> None:
        self.gen_since += n

    def tool_results(self, n: int) -> None:
        self.tools_since += n

    def due(self) -> Optional[str]:
        """The trigger of a due probe ("interval" or "tool_result"), or None."""
        if not self.policy.probes:
            return None
        if self.tools_since and probe_due(self.policy, tool_results_since_probe=self.tools_since):
            return "tool_result"
        if probe_due(self.policy, generated_since_probe=self.gen_since):
            return "interval"
        return None

    def prompt_tokens(self) -> List[int]:
        ctx = self.ctx
        views = ctx.views()
        if ctx.partial is not None:
            views = views + [{"role": "assistant", "content": ctx.reply_text()}]
        question = {"role": "user", "content": PROBE_PROMPT.format(rubric=self.rubric)}
        rendered = ctx.render(views + [question], True)
        if rendered.startswith(ctx.text):
            return ctx.tok(rendered[len(ctx.text):])
        return ctx.tok("\n\n" + question["content"] + "\nAnswer: ")

    def cue(self) -> str:
        """The structural cue now ("answered", "user" or ""), and mark what this probe has seen: messages are
        new if their transcript index is above the last due probe's (summary messages are not turns)."""
        live = [e for e in self.ctx.entries if not e.summary]
        new = sum(e.tidx > self.seen_tidx for e in live)
        self.seen_tidx = max([self.seen_tidx] + [e.tidx for e in live])
        return structural_cue([e.msg for e in live], new, replying=self.ctx.partial is not None)

    def run(self, trigger: str, *, has_cut: bool, committing: bool) -> str:
        """Probe now (the cadence said so); returns the verdict ("COMPRESS"/"CONTINUE")."""
        self.gen_since = 0
        if trigger == "tool_result":
            self.tools_since = 0
        n = len(self.ctx)
        fill = n / self.limits.window
        cue = bool(self.cue())
        why = ("" if self.settings.ask else "no_signal") or probe_skip_reason(self.policy, self.limits, n) or \
            ("" if has_cut else "no_cut_point") or ("committing" if committing else "")
        toks = [] if why else self.prompt_tokens()
        if not why and len(toks) + 8 > free_cells(self.ctx.engine):
            why = "no_room"  # a summary fork or a prepared context holds the pool right now
        if why:
            self.emit(ev.ProbeSkipped(why, fill, trigger))
            return "CONTINUE"
        t0 = time.perf_counter()
        try:
            probs = self.ctx.seq.probe(toks, labels=self.labels)
        except engine_errors() as e:
            warnings.warn(f"probe failed ({e}); CONTINUE", RuntimeWarning)
            self.emit(ev.ProbeSkipped("failed", fill, trigger))
            return "CONTINUE"
        p = float(probs.get(self.labels[0], float("nan")))
        v, reason = verdict(self.policy, self.limits, p, n, self.settings.threshold, cue=cue)
        self.emit(ev.Probe(v, p, len(toks), (time.perf_counter() - t0) * 1000.0, reason=reason, fill=fill,
                           trigger=trigger, cue=cue))
        return v


__all__ = ["Prober", "ProbeSettings", "PROBE_PROMPT", "LABELS"]
