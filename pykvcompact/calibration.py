"""What the rubric probe is worth on each registry model, measured, and what the session does with it.

``bench/eval/calibrate.py`` runs labelled episodes (kept apart from the evaluation's) and measures how
well p(COMPRESS) separates sub-goal boundaries (good moments to compact) from points inside a sub-goal:
its ROC AUC, and the threshold that best separates them.  The registry ships the result per model
(``ModelSpec.probe``).  A session whose ``Policy.threshold`` is ``None`` (the default) takes the model's
calibrated threshold; where the probe carries no signal (AUC below :data:`MIN_AUC`) it does not ask the
probe at all and compacts on the schedule (``hard``, and in ``background`` the preparation schedule),
and says so.  Where no calibration point *without* the result cue reached the threshold (``needs_cue``), a
probe asked without the cue rarely says COMPRESS, and mostly at the wrong moment (in the 15 stored
evaluation runs at window 2048, 11 of 996 cue-less probes did, 10 of them mid-sub-goal): the session asks
it only after a tool output that states a result (``probe_skipped`` reason ``no_cue`` otherwise), which
saves the prefill and suppresses those rare mid-sub-goal verdicts.  An explicit ``Policy.threshold``
always asks the probe and uses that threshold.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

DEFAULT_THRESHOLD = 0.5   # uncalibrated models (a path, a remote server)
MIN_AUC = 0.6             # below: boundaries and mid-sub-goal points are not told apart


@dataclass(frozen=True)
class ProbeCalibration:
    threshold: float          # p(COMPRESS) at or above this says COMPRESS (at most 10% of mid points do)
    auc: float                # ROC AUC of p(COMPRESS), boundary against mid-sub-goal points
    points: int               # labelled points measured
    source: str               # the result file in the repository (bench/results/...)
    rubric: str = "boundary"  # the built-in rubric it was measured with (it applies to that one only)
    # no calibration point without the result cue reached the threshold (bench/eval/calibrate.py: "without_cue")
    needs_cue: bool = False

    @property
    def has_signal(self) -> bool:
        return self.auc >= MIN_AUC


def for_engine(engine) -> Optional[ProbeCalibration]:
    """The calibration of the registry model a local ``engine`` runs (by registry name or file name), or
    None (a model file of another name; a remote server, whatever its model is called: not measured)."""
    from .models import REGISTRY

    path = getattr(engine, "model_path", None)
    if path is None:
        return None
    name = getattr(engine, "model_name", None)
    if isinstance(name, str) and name in REGISTRY:
        return REGISTRY[name].probe
    base = os.path.basename(str(path))
    for spec in REGISTRY.values():
        names = {os.path.basename(f) for f in spec.files} | ({spec.cache_name} if spec.cache_name else set())
        if base in names:
            return spec.probe
    return None


@dataclass(frozen=True)
class ProbeSettings:
    """What one session's prober does: ask the model or not, and the threshold it applies."""
    ask: bool
    threshold: float
    why: str                  # "" when asking; else the reason the probe is not asked
    needs_cue: bool = False   # ask only after a tool output that states a result (ProbeCalibration.needs_cue)

    @classmethod
    def of(cls, policy, engine, labels=None) -> "ProbeSettings":
        """The calibration applies to what was measured: its rubric, asked with the default labels."""
        from .sessions.prober import LABELS

        if policy.threshold is not None:
            return cls(True, float(policy.threshold), "")
        cal = for_engine(engine) if labels is None or tuple(labels) == LABELS else None
        if cal is not None and cal.rubric != policy.rubric:
            cal = None
        if cal is None:
            return cls(True, DEFAULT_THRESHOLD, "")
        if not cal.has_signal:
            return cls(False, cal.threshold,
                       f"the probe carries no signal on this model (AUC {cal.auc:.2f} < {MIN_AUC} on {cal.points} "
                       f"labelled points, {cal.source}): the session compacts on the schedule instead; pass "
                       "Policy(threshold=...) to ask the probe anyway")
        # without the cue to add (result_cue 0) the probability alone decides, wherever it is asked
        return cls(True, cal.threshold, "", needs_cue=cal.needs_cue and policy.result_cue > 0)


__all__ = ["ProbeCalibration", "ProbeSettings", "for_engine", "MIN_AUC", "DEFAULT_THRESHOLD"]
