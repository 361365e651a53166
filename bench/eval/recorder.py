"""What the harness learns from a session while an episode runs: the phase of each compaction, the
labels of probe points, the fact recall of each summary, and the fill over time."""
from __future__ import annotations

import time
from typing import List, Optional

from .episode import Episode
from .scoring import carries

# triggers that commit after the step's output is in the context; the others make room for what arrives
AFTER_OUTPUT = ("compress", "tool", "manual")


class Recorder:
    def __init__(self, episode: Episode, window: int):
        self.ep, self.window = episode, window
        self.t0 = time.time()
        self.compactions: List[dict] = []
        self.probes: List[dict] = []
        self.summaries: List[dict] = []
        self.stalls_ms: List[float] = []
        self.timeline: List[dict] = []
        self.events: List[dict] = []
        self.notes: List[dict] = []      # the model's notes (compaction/summary/notes.py) and the facts they carried
        self._ready_text: Optional[str] = None   # the model's last summary, until a swap uses it
        self._gone_facts: set = set()
        self._swaps: List[tuple] = []            # per swap not yet read: (the model's text or None, span facts)
        self._seen_events = 0
        self._seen_summaries = 0

    def phase(self, step: int) -> str:
        """The state of the work once step ``step``'s output is in: at a boundary when it closed a
        sub-goal (or no step has run yet), in the middle of a sub-goal otherwise."""
        if step < 0:
            return "boundary"
        if step >= len(self.ep.steps):
            return "questions"
        return "boundary" if self.ep.steps[step].closes else "mid"

    def after(self, session, step: int, adding: bool) -> None:
        """Read the events since the last call. ``adding``: the step's messages were being added (a
        compaction that makes room for them happened before its output was in)."""
        new = session.events[self._seen_events:]
        self._seen_events = len(session.events)
        last_fill = self.timeline[-1]["fill"] if self.timeline else session.fill
        for e in new:
            self.events.append({"t": e.t - self.t0, "name": e.name, "step": step,
                                "reason": getattr(e, "reason", None), "phase": self.phase(step)})
            if e.name == "noted":
                self._read_note(session, e)
            elif e.name == "summary_ready":
                self._ready_text = None if e.fallback else e.text   # the next swap that is no fallback uses it
            elif e.name == "preparation_restarted":
                self._ready_text = None
            elif e.name == "probe":
                cue = bool(getattr(e, "cue", False))
                self.probes.append({"step": step, "p": e.p, "verdict": e.verdict, "trigger": e.trigger,
                                    "reason": e.reason, "label": self.phase(step), "cue": cue,
                                    "score": e.p + (session.policy.cue_weight if cue else 0.0)})
            elif e.name in ("rebased", "dropped"):
                trig = getattr(e, "trigger", "window")
                at = step - 1 if (adding and trig not in AFTER_OUTPUT) else step
                fill = e.tokens_before / self.window if e.name == "rebased" else last_fill
                self.compactions.append({"step": step, "at": at, "phase": self.phase(at), "fill": round(fill, 4),
                                         "trigger": trig, "kind": e.name,
                                         "stall_ms": getattr(e, "stall_ms", 0.0),
                                         "fallback": bool(getattr(e, "fallback", False)),
                                         "summary_tokens": getattr(e, "summary_tokens", 0),
                                         "kept_tokens": getattr(e, "kept_tokens", 0),
                                         "summary_reused": getattr(e, "summary_reused", 0)})
                if e.name == "rebased":
                    self.stalls_ms.append(e.stall_ms)
                    model = None if e.fallback else self._ready_text
                    self._ready_text = None
                    # the facts of the span it replaced: offloaded now and not at the previous swap (two swaps
                    # read in one go: the first gets them all, the second none, and is not judged)
                    gone = {m.get("content") for m in session.offloaded}
                    now = [f.text for f in self.ep.facts if self.ep.source_text(f) in gone]
                    self._swaps.append((model, [f for f in now if f not in self._gone_facts]))
                    self._gone_facts.update(now)
        self._read_summaries(session)
        self.timeline.append({"t": time.time() - self.t0, "fill": session.fill, "step": step})

    def _read_note(self, session, e) -> None:
        """What the model's note of a tool output carried of the asked facts that output states."""
        content = session.transcript[e.message].get("content") if 0 <= e.message < len(session.transcript) else None
        required = [f.text for f in self.ep.facts if content and self.ep.source_text(f) == content]
        text = "\n".join(e.lines)
        self.notes.append({"lines": list(e.lines), "required": required,
                           "carried": [f for f in required if carries(text, f)], "ms": e.ms})

    def _read_summaries(self, session) -> None:
        summaries = [m for m in session.transcript if m.get("summary")]
        if len(summaries) <= self._seen_summaries:
            return
        gone = {m.get("content") for m in session.offloaded}
        required = [f for f in self.ep.facts if self.ep.source_text(f) in gone]
        for m in summaries[self._seen_summaries:]:
            text = m.get("content") or ""
            carried = [f.text for f in required if carries(text, f.text)]
            model, span = self._swaps.pop(0) if self._swaps else (None, [])
            self.summaries.append({"required": [f.text for f in required], "carried": carried,
                                   "recall": (len(carried) / len(required)) if required else None,
                                   "chars": len(text), "text": text,   # whole: the key results come last
                                   # the model's own text, if it wrote the one this swap used, judged on the
                                   # facts of the span the swap replaced
                                   "model_text": model, "span_facts": span,
                                   "model_carried": None if model is None else [f for f in span if carries(model, f)]})
        self._seen_summaries = len(summaries)

    def result(self) -> dict:
        return {"compactions": self.compactions, "probes": self.probes, "summaries": self.summaries,
                "stalls_ms": self.stalls_ms, "timeline": self.timeline, "events": self.events, "notes": self.notes,
                "boundaries": self.ep.boundaries()}


def recall_mean(summaries: List[dict]) -> Optional[float]:
    vals = [s["recall"] for s in summaries if s["recall"] is not None]
    return sum(vals) / len(vals) if vals else None
