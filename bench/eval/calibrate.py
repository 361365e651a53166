"""Does the rubric probe discriminate?  ``python -m bench.eval.calibrate --model M``

On episodes kept apart from the evaluation (seeds 1.., the evaluation starts at 1000), the session runs
with the whole episode in view (mode ``none``, nothing compacted, so every point sees the same history a
compacting run would have summarized) and, after every tool result, asks the probe of every variant on a
fork of the live sequence (only the probe is prefilled, then dropped).  A point after a step that closes
a sub-goal is a *boundary* (a good moment to compact), any other a *mid* point.  Reported per variant and
family: ROC AUC of p(COMPRESS) for boundary against mid points, and the threshold that best separates
them (Youden's J).  Variants: each rubric's wording (the family's own, ``default``, ``boundary``), the
score relative to the episode's running mean of earlier probes instead of the raw probability, and the
score the session's verdict compares (``+cue``): p(COMPRESS) plus ``Policy.cue_weight`` at a structural cue
(``pykvcompact/compaction/cue.py``: the assistant answered without a tool call, or a user message arrived
since the last probe; never the wording of a tool's output).  The cue depends only on the episode's
script, so ``--rescore`` adds it to an earlier run's points without any model.

``--lofo FILE``: leave-one-family-out on stored points (no model): for each family, the threshold (Youden's
J) is fit on the other families and the held-out family's AUC and TPR/FPR at that threshold are reported,
then pooled over the held-out families; for p alone and for p + the structural cue.  Its JSON goes to
``bench/results/<name>-lofo.json``; the registry (``pykvcompact/models/registry.py``) takes its figures by hand.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence

from .families import FAMILIES
from .metrics import auc
from .policies import RUBRIC_OF_FAMILY, full_window, Settings
from .sizing import fit

VARIANTS = ("family", "default", "boundary")
CUE_WEIGHTS = (0.1, 0.2)   # the ``+cue`` variants' weights when the policy's default is 0 (cue off)


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
    from pykvcompact.compaction import rubrics
    from pykvcompact.compaction.prober import LABELS, PROBE_PROMPT
    from pykvcompact.compaction.cue import structural_cue

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
        new = 1   # messages since the last point (the task, before the first)
        for i, step in enumerate(ep.steps):
            add = pending + env.step_messages(i, step)
            s.add(add)
            new += len(add)
            ctx = s._ctx
            live = [e.msg for e in ctx.entries if not e.summary]
            point = {"family": ep.family, "seed": ep.seed, "step": i, "tokens": len(ctx),
                     "label": "boundary" if step.closes else "mid", "p": {},
                     "structural": structural_cue(live, new)}
            new = 0
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


def _cue_weight() -> float:
    import pykvcompact as pk
    return pk.Policy().cue_weight


def cue_weights() -> List[float]:
    """The weights the ``+cue`` variants add: the policy's default, or (when that is 0) :data:`CUE_WEIGHTS`."""
    w = _cue_weight()
    return [w] if w > 0 else list(CUE_WEIGHTS)


def report(points: List[dict]) -> dict:
    out: dict = {"variants": {}}
    families = sorted({p["family"] for p in points})
    asked = [v for v in VARIANTS if points and v in points[0]["p"]]
    has_cue = bool(points) and all("structural" in p for p in points)
    cued = [(f"{x}+cue{w:g}", x, w) for x in asked for w in cue_weights()] if has_cue else []
    for v, base, w in [(x, x, 0.0) for x in asked] + [(f"{x}-relative", x, 0.0) for x in asked] + cued:
        scores = []
        for fam in families:
            for seed in sorted({p["seed"] for p in points if p["family"] == fam}):
                ps = [p for p in points if p["family"] == fam and p["seed"] == seed]
                raw = [p["p"][base] for p in ps]
                vals = relative(raw) if v.endswith("-relative") else raw
                vals = [x + (w if p.get("structural") else 0.0) for p, x in zip(ps, vals)]
                scores += [(p["family"], p["label"], x) for p, x in zip(ps, vals)]
        row = {}
        for fam in families + ["all"]:
            pos = [x for f, lab, x in scores if lab == "boundary" and fam in (f, "all")]
            neg = [x for f, lab, x in scores if lab == "mid" and fam in (f, "all")]
            row[fam] = {"auc": auc(pos, neg), "n_boundary": len(pos), "n_mid": len(neg),
                        "mean_boundary": statistics.fmean(pos) if pos else None,
                        "mean_mid": statistics.fmean(neg) if neg else None,
                        **({"youden": youden(pos, neg), "fpr_0.1": at_fpr(pos, neg)} if pos and neg else {})}
        out["variants"][v] = row
    return out


# ------------------------------------------------------------------ leave one family out
def _rates(scores: Sequence[tuple], t: float) -> Dict[str, float]:
    pos = [x for lab, x in scores if lab == "boundary"]
    neg = [x for lab, x in scores if lab == "mid"]
    return {"tp": sum(x >= t for x in pos), "fp": sum(x >= t for x in neg), "n_boundary": len(pos), "n_mid": len(neg)}


def lofo(points: List[dict], score: Callable[[dict], float], rule: Callable = None) -> dict:
    """Leave one family out: for each family, the threshold ``rule(pos, neg)`` (default Youden's J) is fit on
    the other families' scores, and the held-out family gets its AUC (threshold-free) and its TPR/FPR at that
    threshold.  ``pooled``: the AUC of all held-out scores together (boundaries of one family against mid
    points of another count too: an offset between families costs here), the mean and worst family AUC, and
    TPR/FPR summed over the held-out families at their own fold's threshold."""
    rule = rule or youden
    families = sorted({p["family"] for p in points})
    per, tp = {}, {"tp": 0, "fp": 0, "n_boundary": 0, "n_mid": 0}
    held: List[tuple] = []
    for fam in families:
        train = [(p["label"], score(p)) for p in points if p["family"] != fam]
        test = [(p["label"], score(p)) for p in points if p["family"] == fam]
        pos_tr = [x for lab, x in train if lab == "boundary"]
        neg_tr = [x for lab, x in train if lab == "mid"]
        pos = [x for lab, x in test if lab == "boundary"]
        neg = [x for lab, x in test if lab == "mid"]
        if not (pos_tr and neg_tr):
            continue
        fit = rule(pos_tr, neg_tr)
        r = _rates(test, fit["threshold"])
        for k in tp:
            tp[k] += r[k]
        held += test
        per[fam] = {"auc": auc(pos, neg) if pos and neg else None, "threshold": fit["threshold"],
                    "train_tpr": fit["tpr"], "train_fpr": fit["fpr"],
                    "tpr": r["tp"] / r["n_boundary"] if r["n_boundary"] else None,
                    "fpr": r["fp"] / r["n_mid"] if r["n_mid"] else None,
                    "n_boundary": r["n_boundary"], "n_mid": r["n_mid"],
                    "tuned_on": [f for f in families if f != fam]}
    aucs = [r["auc"] for r in per.values() if r["auc"] is not None]
    pos = [x for lab, x in held if lab == "boundary"]
    neg = [x for lab, x in held if lab == "mid"]
    pooled = {"auc": auc(pos, neg) if pos and neg else None,
              "auc_mean": statistics.fmean(aucs) if aucs else None, "auc_min": min(aucs) if aucs else None,
              "tpr": tp["tp"] / tp["n_boundary"] if tp["n_boundary"] else None,
              "fpr": tp["fp"] / tp["n_mid"] if tp["n_mid"] else None,
              "n_boundary": tp["n_boundary"], "n_mid": tp["n_mid"]}
    if pooled["tpr"] is not None and pooled["fpr"] is not None:
        pooled["j"] = pooled["tpr"] - pooled["fpr"]
    return {"families": per, "pooled": pooled}


def lofo_report(points: List[dict], weights: Optional[List[float]] = None) -> dict:
    """:func:`lofo` for every stored rubric variant, alone and with the structural cue at each weight (Youden's
    threshold, and the 10%-false-COMPRESS threshold as a second operating point); plus the threshold fit on
    every family (what a registry entry ships)."""
    weights = cue_weights() if weights is None else weights
    out: dict = {"variants": {}}
    for base in [v for v in VARIANTS if points and v in points[0]["p"]]:
        cands = [(base, lambda p, b=base: p["p"][b])]
        if all("structural" in p for p in points):
            cands += [(f"{base}+cue{w:g}", lambda p, b=base, w=w: p["p"][b] + (w if p["structural"] else 0.0))
                      for w in weights]
        for name, score in cands:
            pos = [score(p) for p in points if p["label"] == "boundary"]
            neg = [score(p) for p in points if p["label"] == "mid"]
            out["variants"][name] = {"youden": lofo(points, score), "fpr_0.1": lofo(points, score, at_fpr),
                                     "all_families": {"auc": auc(pos, neg), "youden": youden(pos, neg),
                                                      "tuned_on": sorted({p["family"] for p in points})}}
    return out


def structural_cues(points: List[dict], window: int) -> Dict[tuple, str]:
    """Each stored point's structural cue, rebuilt from its episode's script without any model: at a point
    (after a step's tool output) the newest message is that output, so ``answered`` never holds there, and
    the messages since the previous point are the model's own calls' results (role ``tool``) and the step's
    messages (a user turn where the step opens a sub-goal).  Roles do not depend on the episode's sizing
    (rows per page), so the episode is built at its default size; its labels are checked against the
    points'."""
    from pykvcompact.compaction.cue import structural_cue

    from .environment import Environment
    from .episode import Size

    out: Dict[tuple, str] = {}
    for fam, seed in sorted({(p["family"], p["seed"]) for p in points}):
        ep = FAMILIES[fam](seed, Size.for_window(window))
        env = Environment(ep)
        msgs, new = [{"role": "user", "content": ep.task}], 1
        for i, step in enumerate(ep.steps):
            add = env.step_messages(i, step)
            msgs += add
            new += len(add)
            out[(fam, seed, i)] = structural_cue(msgs, new)
            new = 0
        for p in points:
            if (p["family"], p["seed"]) == (fam, seed):
                if p["step"] >= len(ep.steps) or ep.steps[p["step"]].closes != (p["label"] == "boundary"):
                    raise ValueError(f"{fam} seed {seed} step {p['step']}: the rebuilt episode does not match "
                                     "the stored point's label")
    return out


def with_structural(points: List[dict], window: int) -> List[dict]:
    cues = structural_cues(points, window)
    return [dict(p, structural=cues[(p["family"], p["seed"], p["step"])]) for p in points]


def main(argv=None) -> int:
    import pykvcompact as pk
    from pykvcompact.models.registry import resolve_model

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
                    help="add the structural cue to an earlier run's points (no model) and rewrite its report")
    ap.add_argument("--lofo", default=None, metavar="JSON",
                    help="leave-one-family-out report of an earlier run's points (no model); --out: its path "
                         "(default: JSON with -lofo before .json)")
    args = ap.parse_args(argv)
    if args.rescore:
        return rescore(args.rescore)
    if args.lofo:
        return lofo_main(args.lofo, args.out)
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
    """Add each point's structural cue (``structural``) to an earlier run's JSON, rebuilt from its episodes'
    script (no model), and rewrite its report."""
    with open(path) as f:
        data = json.load(f)
    data["points"] = with_structural(data["points"], data["meta"]["window"])
    data["report"] = report(data["points"])
    data["meta"]["rescored"] = f"structural cue added {time.strftime('%Y-%m-%d')}"
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    for v, row in data["report"]["variants"].items():
        print(f"{v:20} AUC {row['all']['auc']:.3f}  " + "  ".join(
            f"{fam} {r['auc']:.2f}" for fam, r in row.items() if fam != "all" and r["auc"] is not None))
    return 0


def _f(x, fmt="{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def lofo_table(rep: dict) -> str:
    """The LOFO report as a markdown table (Youden's threshold fit on the other families)."""
    lines = ["| variant | held-out family | AUC | threshold (fit on the others) | TPR | FPR |",
             "|---|---|---|---|---|---|"]
    for name, v in rep["variants"].items():
        for fam, r in v["youden"]["families"].items():
            lines.append(f"| {name} | {fam} | {_f(r['auc'])} | {_f(r['threshold'], '{:.4f}')} | "
                         f"{_f(r['tpr'], '{:.2f}')} | {_f(r['fpr'], '{:.2f}')} |")
        po = v["youden"]["pooled"]
        lines.append(f"| {name} | **pooled** | {_f(po['auc'])} (mean {_f(po['auc_mean'])}, worst "
                     f"{_f(po['auc_min'])}) | - | {_f(po['tpr'], '{:.2f}')} | {_f(po['fpr'], '{:.2f}')} |")
    return "\n".join(lines)


def lofo_main(path: str, out: Optional[str] = None) -> int:
    with open(path) as f:
        data = json.load(f)
    meta = data["meta"]
    points = with_structural(data["points"], meta["window"])
    rep = lofo_report(points)
    import pykvcompact as pk
    from pykvcompact.models.calibration import MIN_AUC
    out = out or (path[:-5] if path.endswith(".json") else path) + "-lofo.json"
    cues = {c: sum(p["structural"] == c for p in points) for c in ("answered", "user", "")}
    doc = {"meta": {"source": path, "model": meta.get("model"), "window": meta.get("window"),
                    "points": len(points), "date": time.strftime("%Y-%m-%d"), "min_auc": MIN_AUC,
                    "cue_weight_default": pk.Policy().cue_weight,
                    "structural_cues": {"answered": cues["answered"], "user": cues["user"], "none": cues[""]},
                    "structural_by_label": {lab: sum(bool(p["structural"]) for p in points if p["label"] == lab)
                                            for lab in ("boundary", "mid")},
                    "method": "threshold fit by Youden's J on the other families, scored on the held-out one; "
                              "fpr_0.1: the lowest threshold whose false-COMPRESS rate on the other families' "
                              "mid points is at most 10%"},
           "report": rep, "table": lofo_table(rep)}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(doc["table"])
    print(f"structural cues at the points: {doc['meta']['structural_cues']} (by label: "
          f"{doc['meta']['structural_by_label']}); written {out}")
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
