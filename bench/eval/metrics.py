"""Aggregates per policy and family: accuracy with a 95% Wilson interval, tokens evaluated, wall time,
compactions (fill, phase), summary fact recall, stalls, and the probe's ROC AUC (Mann-Whitney)."""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Tuple

Z95 = 1.959963984540054


def wilson(k: int, n: int, z: float = Z95) -> Tuple[float, float]:
    """The 95% Wilson score interval of k successes in n trials ((0, 1) when n == 0)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    # exact ends when every trial failed or succeeded (the formula leaves rounding dust, e.g. 5.6e-17)
    return (0.0 if k == 0 else max(0.0, mid - half)), (1.0 if k == n else min(1.0, mid + half))


def auc(positives: Iterable[float], negatives: Iterable[float]) -> Optional[float]:
    """ROC AUC as the Mann-Whitney probability that a positive scores above a negative (ties count 1/2)."""
    pos, neg = list(positives), list(negatives)
    if not pos or not neg:
        return None
    wins = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def _counts(xs: Iterable[str]) -> Dict[str, int]:
    out: Dict[str, int] = defaultdict(int)
    for x in xs:
        out[x] += 1
    return dict(out)


def _mean(xs: List[float]) -> Optional[float]:
    return statistics.fmean(xs) if xs else None


def boundary_use(results: List[dict]) -> dict:
    """How the compactions met the sub-goal boundaries.  ``boundaries_compacted``: boundaries at which at
    least one compaction happened, of ``boundaries``.  ``compactions_boundary_ceiling``: the most of the
    compactions that could have been at distinct boundaries, as many per episode as the policy made (min(its
    compactions, its boundaries) per episode, the questions phase's included): where a sub-goal holds more
    tokens than a compaction frees, some compactions must fall inside it, whatever decides when.  It bounds
    ``boundaries_compacted``, not ``compactions_at_boundary`` (two compactions can meet one boundary)."""
    if any("boundaries" not in r for r in results):   # a result file written before they were recorded
        return {"boundaries": None, "boundaries_compacted": None, "compactions_boundary_ceiling": None}
    # a swap before the first step's output (at -1) is at no sub-goal boundary the episode counts
    used = sum(len({at for c in r["compactions"] if c["phase"] == "boundary" and (at := c.get("at", c["step"])) >= 0})
               for r in results)
    return {"boundaries": sum(r["boundaries"] for r in results), "boundaries_compacted": used,
            "compactions_boundary_ceiling": sum(min(len(r["compactions"]), r["boundaries"]) for r in results)}


def summarize(results: List[dict]) -> dict:
    """One row of metrics for a group of episode results."""
    answers = [a for r in results for a in r["answers"]]
    k, n = sum(a["correct"] for a in answers), len(answers)
    lo, hi = wilson(k, n)
    tok = {key: sum(r["tokens"][key] for r in results) for key in ("prefill", "decode", "probe", "background",
                                                                   "total")}
    comps = [c for r in results for c in r["compactions"]]
    recalls = [s["recall"] for r in results for s in r["summaries"] if s["recall"] is not None]
    probes = [p for r in results for p in r["probes"] if p["label"] in ("boundary", "mid")]
    stalls = [s for r in results for s in r["stalls_ms"]]
    return {
        "episodes": len(results), "questions": n, "correct": k,
        "accuracy": k / n if n else None, "ci95": [lo, hi],
        "tokens": tok, "tokens_per_episode": tok["total"] / len(results) if results else None,
        "wall_s": sum(r["wall_s"] for r in results),
        "wall_s_per_episode": _mean([r["wall_s"] for r in results]),
        "compactions": len(comps),
        "compactions_at_boundary": sum(c["phase"] == "boundary" for c in comps),
        "compactions_mid": sum(c["phase"] == "mid" for c in comps),
        **boundary_use(results),
        "compaction_fill_mean": _mean([c["fill"] for c in comps]),
        # the cost of keeping the user's messages verbatim: tokens per rebased context (issue 12)
        "summary_tokens_mean": _mean([c.get("summary_tokens", 0) for c in comps if c["kind"] == "rebased"]),
        "kept_tokens_mean": _mean([c.get("kept_tokens", 0) for c in comps if c["kind"] == "rebased"]),
        "summaries": sum(len(r["summaries"]) for r in results),
        "fact_recall_mean": _mean(recalls),
        "stalls_ms_max": max(stalls) if stalls else None,
        "stalls_ms_median": statistics.median(stalls) if stalls else None,
        "probes": len(probes),
        # due but not asked, by reason (no_signal: the model's probe is not trusted; below_floor, ...)
        "probes_skipped": dict(sorted(_counts(e.get("reason") or "unknown" for r in results for e in r.get("events", [])
                                              if e["name"] == "probe_skipped").items())),
        "search_calls": sum(r.get("search_calls", 0) for r in results),
        "search_found": sum(r.get("search_found", 0) for r in results),
        "probe_auc": auc([p["p"] for p in probes if p["label"] == "boundary"],
                         [p["p"] for p in probes if p["label"] == "mid"]),
        # what the verdict compares: p(COMPRESS) plus Policy.cue_weight at a structural cue (sessions/cue.py)
        "probe_auc_cue": auc([p.get("score", p["p"]) for p in probes if p["label"] == "boundary"],
                             [p.get("score", p["p"]) for p in probes if p["label"] == "mid"]),
        "compactions_by_trigger": dict(sorted(_counts(c["trigger"] for c in comps).items())),
    }


def table(results: List[dict]) -> Dict[str, Dict[str, dict]]:
    """metrics[policy][family], with an "all" family per policy."""
    groups: Dict[str, Dict[str, List[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        groups[r["policy"]][r["family"]].append(r)
        groups[r["policy"]]["all"].append(r)
    return {pol: {fam: summarize(rs) for fam, rs in fams.items()} for pol, fams in groups.items()}
