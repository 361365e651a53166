"""Does the rubric probe discriminate?  ``python -m bench.eval.calibrate --model M``

On episodes kept apart from the evaluation (seeds 1.., the evaluation starts at 1000), the session runs
with the whole episode in view (mode ``none``, nothing compacted, so every point sees the same history a
compacting run would have summarized) and, after every tool result, asks the probe of every variant on a
fork of the live sequence (only the probe is prefilled, then dropped).  A point after a step that closes
a sub-goal is a *boundary* (a good moment to compact), any other a *mid* point.  Reported per variant and
family: ROC AUC of p(COMPRESS) for boundary against mid points, and the threshold that best separates
them (Youden's J).  Variants: each rubric's wording (the family's own, ``default``, ``boundary``), the
score relative to the episode's running mean of earlier probes instead of the raw probability, and the
score the session's verdict compares (``+cue``): p(COMPRESS) plus ``Policy.result_cue`` after a tool
output that states a result (``pykvcompact/sessions/results.py``; deterministic, so ``--rescore`` adds it
to an earlier run's points without asking the model again).

The calibrated threshold, AUC and ``needs_cue`` (the ``+cue`` variant's ``without_cue``: no point without
the cue reached its threshold) go into the registry (``pykvcompact/models.py``) by hand, with this run's
JSON in ``bench/results/``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List

from .families import FAMILIES
from .metrics import auc
from .policies import RUBRIC_OF_FAMILY, full_window, Settings
from .sizing import fit

VARIANTS = ("family", "default", "boundary")
CUE = __import__("pykvcompact").Policy().result_cue   # what the session adds after a stated result


def youden(pos: List[float], neg: List[float]) -> Dict[str, float]:
    """The threshold t maximising TPR - FPR for "score >= t means boundary", with its rates."""
    best = {"threshold": 0.5, "j": -1.0, "tpr": 0.0, "fpr": 0.0}
    for t in sorted(set(pos + neg)):
        tpr = sum(p >= t for p in pos) / len(pos)
        fpr = sum(q >= t for q in neg) / len(neg)
        if tpr - fpr > best["j"]:
            best = {"threshold": t, "j": tpr - fpr, "tpr": tpr, "fpr": fpr}
    return best


def at_fpr(pos: List[float], neg: List[float], max_fpr: float = 0.1) -> Dict[str, float]:
    """The lowest threshold whose false-positive rate on mid points is at most ``max_fpr``, with its rates:
    a COMPRESS inside a sub-goal costs a compaction at a bad moment, a missed boundary only defers it to a
    later one (or to ``hard``), so the shipped threshold bounds the false positives."""
    best = {"threshold": 1.0, "tpr": 0.0, "fpr": 0.0}
    for t in sorted(set(pos + neg), reverse=True):
        fpr = sum(q >= t for q in neg) / len(neg)
        if fpr > max_fpr:
            break
        best = {"threshold": t, "tpr": sum(p >= t for p in pos) / len(pos), "fpr": fpr}
    return best


def relative(series: List[float], k: int = 4) -> List[float]:
    """Each probe's p minus the mean of the episode's previous ``k`` probes (0 for the first)."""
    out = []
    for i, p in enumerate(series):
        prev = series[max(0, i - k):i]
        out.append(p - statistics.fmean(prev) if prev else 0.0)
    return out


def probe_points(engine, ep, settings: Settings, history_dir: str, variants=VARIANTS) -> List[dict]:
    import pykvcompact as pk
    from pykvcompact import rubrics
    from pykvcompact.sessions.prober import LABELS, PROBE_PROMPT
    from pykvcompact.sessions.results import states_result

    from .environment import Environment

    texts = {"family": rubrics.load(RUBRIC_OF_FAMILY.get(ep.family, "default")),
             "default": rubrics.load("default"), "boundary": rubrics.load("boundary")}
    texts = {k: v for k, v in texts.items() if k in variants}
    policy = pk.Policy(mode="none", window=full_window(settings), compact_tool=False, history_tool=False)
    s = pk.Session(engine, system=ep.system, policy=policy, tools=ep.tools, history_dir=history_dir,
                   session_id=f"cal-{ep.family}-{ep.seed}")
    env, pending, points = Environment(ep), [], []
    try:
        s.add({"role": "user", "content": ep.task})
        for i, step in enumerate(ep.steps):
            s.add(pending + env.step_messages(i, step))
            ctx = s._ctx
            point = {"family": ep.family, "seed": ep.seed, "step": i, "tokens": len(ctx),
                     "label": "boundary" if step.closes else "mid", "p": {},
                     "cue": states_result([e.msg for e in ctx.entries])}
            for name, text in texts.items():
                q = {"role": "user", "content": PROBE_PROMPT.format(rubric=text)}
                full = ctx.render(ctx.views() + [q], True)
                toks = ctx.tok(full[len(ctx.text):])
                point["p"][name] = float(s.sequence.probe(toks, labels=LABELS)[LABELS[0]])
            points.append(point)
            r = s.chat([], max_tokens=settings.reply_tokens)
            pending = env.answer(r["choices"][0]["message"])
    finally:
        s.close()
    return points


def report(points: List[dict]) -> dict:
    out: dict = {"variants": {}}
    families = sorted({p["family"] for p in points})
    asked = [v for v in VARIANTS if points and v in points[0]["p"]]
    cued = [f"{x}+cue" for x in asked] if points and all("cue" in p for p in points) else []
    for v in asked + [f"{x}-relative" for x in asked] + cued:
        base = v.replace("-relative", "").replace("+cue", "")
        scores = []
        for fam in families:
            for seed in sorted({p["seed"] for p in points if p["family"] == fam}):
                ps = [p for p in points if p["family"] == fam and p["seed"] == seed]
                raw = [p["p"][base] for p in ps]
                vals = relative(raw) if v.endswith("-relative") else raw
                if v.endswith("+cue"):
                    vals = [x + (CUE if p["cue"] else 0.0) for p, x in zip(ps, vals)]
                scores += [(p["family"], p["label"], x) for p, x in zip(ps, vals)]
        row = {}
        for fam in families + ["all"]:
            pos = [x for f, lab, x in scores if lab == "boundary" and fam in (f, "all")]
            neg = [x for f, lab, x in scores if lab == "mid" and fam in (f, "all")]
            row[fam] = {"auc": auc(pos, neg), "n_boundary": len(pos), "n_mid": len(neg),
                        "mean_boundary": statistics.fmean(pos) if pos else None,
                        "mean_mid": statistics.fmean(neg) if neg else None,
                        **({"youden": youden(pos, neg), "fpr_0.1": at_fpr(pos, neg)} if pos and neg else {})}
        if v.endswith("+cue") and "youden" in row["all"]:
            row["without_cue"] = without_cue(points, base, row["all"]["youden"]["threshold"])
        out["variants"][v] = row
    return out


def without_cue(points: List[dict], base: str, threshold: float) -> dict:
    """The points after a tool output that states no result, against the ``+cue`` score's threshold: where
    none of them reaches it (and there are some), the probe's COMPRESS comes only after a stated result
    (``ProbeCalibration.needs_cue``: the session then asks only there)."""
    ps = [p for p in points if not p["cue"]]
    at = [p for p in ps if p["p"][base] >= threshold]
    return {"threshold": threshold, "points": len(ps), "max_p": max((p["p"][base] for p in ps), default=None),
            "compress": {lab: sum(p["label"] == lab for p in at) for lab in ("boundary", "mid")},
            "needs_cue": bool(ps) and not at}


def main(argv=None) -> int:
    import pykvcompact as pk
    from pykvcompact.models import resolve_model

    ap = argparse.ArgumentParser(prog="python -m bench.eval.calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--families", default="ledger,search,code,math,instructions")
    ap.add_argument("--episodes", type=int, default=2, help="per family (seeds 1..N)")
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--ratio", type=float, default=4.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"rubrics to probe, of {', '.join(VARIANTS)}")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rescore", default=None, metavar="JSON",
                    help="add the result cue to an earlier run's points (no model call) and rewrite its report")
    args = ap.parse_args(argv)
    if args.rescore:
        return rescore(args.rescore)
    settings = Settings(window=args.window, ratio=args.ratio, reply_tokens=8)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or any(v not in VARIANTS for v in variants):
        ap.error(f"--variants: choose from {', '.join(VARIANTS)}")
    for f in families:
        if f not in FAMILIES:
            ap.error(f"unknown family {f!r}: choose from {sorted(FAMILIES)}")
    out = args.out or f"bench/results/calibration-{args.model}"
    t0 = time.time()
    engine = pk.Engine(str(resolve_model(args.model)), n_ctx=full_window(settings) + 512, n_seq_max=4,
                       n_threads=args.threads or os.cpu_count() or 1)
    points: List[dict] = []
    try:
        with tempfile.TemporaryDirectory(prefix="pykvcompact-cal-") as hist:
            for fam in families:
                for seed in range(1, args.episodes + 1):
                    ep = fit(FAMILIES[fam], seed, args.window, engine.tokenize, ratio=args.ratio)
                    points += probe_points(engine, ep, settings, hist, variants)
                    rep = report(points)
                    fam_row = rep["variants"]["family"]["all"]
                    print(f"{fam:12} seed {seed}: {len(points)} points, AUC(family rubric, all so far) "
                          f"{fam_row['auc']}", flush=True)
                    _write(out, args, points, rep, time.time() - t0)
    finally:
        engine.close()
    rep = report(points)
    for v, row in rep["variants"].items():
        a = row["all"]
        print(f"{v:20} AUC {a['auc'] if a['auc'] is None else round(a['auc'], 3)}  "
              f"boundary {a['mean_boundary']}  mid {a['mean_mid']}  {a.get('youden')}  {a.get('fpr_0.1')}")
    return 0


def rescore(path: str) -> int:
    """Add each point's ``cue`` (its step's tool output states a result) to an earlier run's JSON, rebuilding
    its episodes with the run's model tokenizer (the sizing depends on it), and rewrite its report."""
    import pykvcompact as pk
    from pykvcompact.models import resolve_model
    from pykvcompact.sessions.results import states_result

    from .environment import Environment

    with open(path) as f:
        data = json.load(f)
    meta = data["meta"]
    engine = pk.Engine(str(resolve_model(meta["model"])), n_ctx=512, n_seq_max=1)
    try:
        episodes = {}
        for p in data["points"]:
            key = (p["family"], p["seed"])
            if key not in episodes:
                episodes[key] = fit(FAMILIES[p["family"]], p["seed"], meta["window"], engine.tokenize,
                                    ratio=meta["ratio"])
            ep = episodes[key]
            p["cue"] = states_result(Environment(ep).step_messages(p["step"], ep.steps[p["step"]]))
    finally:
        engine.close()
    data["report"] = report(data["points"])
    meta["rescored"] = f"cue added {time.strftime('%Y-%m-%d')} (result_cue {CUE})"
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    for v, row in data["report"]["variants"].items():
        print(f"{v:20} AUC {row['all']['auc']:.3f}  " + "  ".join(
            f"{fam} {r['auc']:.2f}" for fam, r in row.items() if fam != "all" and r["auc"] is not None))
    return 0


def _write(out: str, args, points, rep, seconds: float) -> None:
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    meta = {"model": args.model, "window": args.window, "ratio": args.ratio, "episodes": args.episodes,
            "variants": args.variants, "families": args.families, "threads": args.threads,
            "seconds": round(seconds, 1), "date": time.strftime("%Y-%m-%d"), "argv": sys.argv[1:]}
    with open(out + ".json", "w") as f:
        json.dump({"meta": meta, "report": rep, "points": points}, f, indent=1)


if __name__ == "__main__":
    raise SystemExit(main())
