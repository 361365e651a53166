"""What the rubric probe is worth on each registry model, measured, and when that counts as a signal.

``bench/eval/calibrate.py`` runs labelled episodes (kept apart from the evaluation's) and measures how
well p(COMPRESS) separates sub-goal boundaries (good moments to compact) from points inside a sub-goal:
its ROC AUC, and the threshold that best separates them.  The registry ships the result per model
(``ModelSpec.probe``).  A session whose ``Policy.threshold`` is ``None`` (the default) takes the model's
calibrated threshold; where the probe carries no signal (AUC below :data:`MIN_AUC`) it does not ask the
probe at all and compacts on the schedule (``hard``, and in ``background`` the preparation schedule),
and says so.  An explicit ``Policy.threshold`` always asks the probe and uses that threshold.  That
decision is the prober's (``compaction/prober.py``: ``ProbeSettings``); the registry finds the entry of
the model an engine runs (``registry.for_engine``).  This module, below both, holds only the measurement.

The figures that decide are measured *out of family*: ``bench/eval/calibrate.py --lofo`` fits the threshold
(Youden's J) on all families but one and scores the held-out one, for each family in turn; ``auc`` is the
pooled AUC of the held-out scores, ``lofo_tpr``/``lofo_fpr`` the held-out rates at the thresholds fit
without them, ``tuned_on`` the families the shipped threshold was fit on.  No cue read from the wording of
a tool's output enters a calibration (the structural cue of ``compaction/cue.py`` has its own weight,
``Policy.cue_weight``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

DEFAULT_THRESHOLD = 0.5   # uncalibrated models (a path, a remote server)
MIN_AUC = 0.6             # below: boundaries and mid-sub-goal points are not told apart
# held out, at a threshold that keeps false COMPRESS to 10% on the families it was fit on, the probe must
# find boundaries this much more often than it says COMPRESS mid-sub-goal (TPR - FPR); a false COMPRESS
# summarizes work in progress, so a probe useful only at a high false-COMPRESS rate is not used
MIN_HELD_OUT_J = 0.2


@dataclass(frozen=True)
class ProbeCalibration:
    threshold: float          # p(COMPRESS) at or above this says COMPRESS (Youden's J on the tuned_on families)
    auc: float                # ROC AUC of p(COMPRESS), boundary against mid points (pooled, held-out families)
    points: int               # labelled points measured
    source: str               # the result file in the repository (bench/results/...)
    rubric: str = "boundary"  # the built-in rubric it was measured with (it applies to that one only)
    tuned_on: Tuple[str, ...] = ()   # the task families the threshold was fit on
    lofo_tpr: Optional[float] = None  # leave-one-family-out: boundaries said COMPRESS, pooled over held-out families
    lofo_fpr: Optional[float] = None  # ... and mid-sub-goal points said COMPRESS
    note: str = ""                   # what the measurement means for the session, in words
    # leave-one-family-out TPR - FPR at the threshold that keeps false COMPRESS <= 10% on the other families
    held_out_j: Optional[float] = None

    @property
    def has_signal(self) -> bool:
        return self.auc >= MIN_AUC and (self.held_out_j is None or self.held_out_j >= MIN_HELD_OUT_J)


__all__ = ["ProbeCalibration", "MIN_AUC", "MIN_HELD_OUT_J", "DEFAULT_THRESHOLD"]
