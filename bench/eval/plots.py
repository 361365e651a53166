"""PNG plots (matplotlib, Agg): accuracy against tokens evaluated (one point per policy), and the fill
over time of one episode with its compactions."""
from __future__ import annotations

from typing import Dict, List


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def accuracy_vs_tokens(metrics: Dict[str, Dict[str, dict]], path: str, title: str) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for pol, fams in metrics.items():
        m = fams.get("all")
        if not m or m["accuracy"] is None:
            continue
        x = m["tokens_per_episode"]
        lo, hi = max(0.0, m["accuracy"] - m["ci95"][0]), max(0.0, m["ci95"][1] - m["accuracy"])
        ax.errorbar([x], [m["accuracy"]], yerr=[[lo], [hi]],
                    fmt="o", capsize=3)
        ax.annotate(pol, (x, m["accuracy"]), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel("tokens evaluated per episode (prefill + decode + probe + background)")
    ax.set_ylabel("accuracy (95% Wilson interval)")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fill_over_time(episode: dict, path: str, title: str) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.2, 3.6))
    tl: List[dict] = episode["timeline"]
    ax.plot([p["t"] for p in tl], [p["fill"] for p in tl], lw=1.2, label="fill (tokens / window)")
    at_step = {}
    for p in tl:
        at_step.setdefault(p["step"], p["t"])
    for c in episode["compactions"]:
        t = at_step.get(c["step"], 0.0)
        ax.axvline(t, color="tab:green" if c["phase"] == "boundary" else "tab:red", lw=0.8, ls="--")
    for p in episode["probes"]:
        t = at_step.get(p["step"], 0.0)
        ax.plot([t], [p["p"]], "x", color="tab:purple", ms=4)
    ax.axhline(0.85, color="grey", lw=0.6, ls=":")
    ax.set_xlabel("seconds")
    ax.set_ylabel("fill / p(COMPRESS) (x)")
    ax.set_title(title + "  (dashed: compactions, green at a boundary, red mid-sub-goal)", fontsize=8)
    ax.set_ylim(0, 1.1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_both(metrics: Dict[str, Dict[str, dict]], episodes: List[dict], prefix: str, model: str) -> List[str]:
    """Both plots of a run (the fill of its first compacting episode of ours); a plot that fails is
    reported and skipped: the JSON and tables are written before, and an hours-long run is never lost
    to a figure."""
    import sys

    shown = next((r for r in episodes if r["compactions"] and r["policy"] != "peer"), episodes[0])
    jobs = [(accuracy_vs_tokens, (metrics, prefix + "-accuracy.png", f"{model}: accuracy vs cost")),
            (fill_over_time, (shown, prefix + "-fill.png", f"{shown['family']} seed {shown['seed']}, {shown['policy']}"))]
    files = []
    for plot, args in jobs:
        try:
            files.append(plot(*args))
        except Exception as exc:  # noqa: BLE001 - a plot is never worth the run
            print(f"warning: {args[1]} not written ({type(exc).__name__}: {exc})", file=sys.stderr)
    return files
