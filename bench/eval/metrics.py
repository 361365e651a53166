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


def by_place(answers: List[dict]) -> Dict[str, dict]:
    """Accuracy per place where the asked fact lived (the agent families' questions carry one)."""
    groups: Dict[str, List[dict]] = defaultdict(list)
    for a in answers:
        if a.get("place"):
            groups[a["place"]].append(a)
    out = {}
    for place, xs in sorted(groups.items()):
        k = sum(a["correct"] for a in xs)
        out[place] = {"questions": len(xs), "correct": k, "accuracy": k / len(xs), "ci95": list(wilson(k, len(xs)))}
    return out


def _of_span(summaries: List[dict]):
    judged = [s for s in summaries if s.get("model_text") is not None and s.get("span_facts")]
    need = sum(len(s["span_facts"]) for s in judged)
    if not judged:
        return None, None
    return (sum(bool(s["model_carried"]) for s in judged) / len(judged),
            sum(len(s["model_carried"]) for s in judged) / need)


def model_text(results: List[dict]) -> dict:
    """What the model itself wrote: its notes (how many, how many carried an asked fact of the output
    they noted, of those whose output held one), the notes skipped by reason, and the summaries it was
    asked for that came back (summary_ready) or failed (summary_failed, by reason)."""
    notes = [n for r in results for n in r.get("notes", [])]
    asked = [n for n in notes if n["required"]]
    events = [e for r in results for e in r.get("events", [])]
    need = sum(len(n["required"]) for n in asked)
    return {"notes": len(notes), "notes_on_fact_outputs": len(asked),
            "notes_informative": sum(bool(n["carried"]) for n in asked),
            "note_fact_recall": sum(len(n["carried"]) for n in asked) / need if need else None,
            "notes_skipped": dict(sorted(_counts(e.get("reason") or "unknown" for e in events
                                                 if e["name"] == "note_skipped").items())),
            "model_summaries": sum(s.get("model_text") is not None for r in results for s in r["summaries"]),
            # of the model's summaries used for a swap whose span established asked facts: the share that
            # carried at least one, and the share of those facts its text alone carried
            "model_summaries_informative": _of_span([s for r in results for s in r["summaries"]])[0],
            "model_text_fact_recall": _of_span([s for r in results for s in r["summaries"]])[1],
            "model_summaries_failed": dict(sorted(_counts(e.get("reason") or "unknown" for e in events
                                                          if e["name"] == "summary_failed").items()))}


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
        "accuracy": k / n if n else None, "ci95": [lo, hi], "by_place": by_place(answers),
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
        # of which already in place (an extended summary's previous text: its KV not computed again)
        "summary_reused_mean": _mean([c.get("summary_reused", 0) for c in comps if c["kind"] == "rebased"]),
        "summaries": sum(len(r["summaries"]) for r in results),
        "fact_recall_mean": _mean(recalls),
        **model_text(results),
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
        # what the verdict compares: p(COMPRESS) plus Policy.cue_weight at a structural cue (compaction/cue.py)
        "probe_auc_cue": auc([p.get("score", p["p"]) for p in probes if p["label"] == "boundary"],
                             [p.get("score", p["p"]) for p in probes if p["label"] == "mid"]),
        "compactions_by_trigger": dict(sorted(_counts(c["trigger"] for c in comps).items())),
    }


HELD_OUT = "held-out"   # the pooled row of the families no heuristic was tuned on (families.HELD_OUT)


def table(results: List[dict]) -> Dict[str, Dict[str, dict]]:
    """metrics[policy][family], with an "all" family per policy and a "held-out" one pooling the families
    nothing was tuned on (when the run has any)."""
    from .families import HELD_OUT_FAMILIES

    groups: Dict[str, Dict[str, List[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        groups[r["policy"]][r["family"]].append(r)
        groups[r["policy"]]["all"].append(r)
        if r["family"] in HELD_OUT_FAMILIES:
            groups[r["policy"]][HELD_OUT].append(r)
    return {pol: {fam: summarize(rs) for fam, rs in fams.items()} for pol, fams in groups.items()}
