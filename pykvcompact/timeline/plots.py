"""A PNG timeline of a session (matplotlib, Agg backend: no display needed).

Top: KV fill (tokens / window) over time, with the soft and hard thresholds, probes (verdict), summary
start and ready, rebases (swaps, with their stall) and offloads marked. Bottom: the latency between
streamed tokens and from each turn's start to its first token, so a stall at a swap (or its absence) is
visible under the event that caused it."""
from __future__ import annotations

import os
from typing import Optional

from .record import Timeline

MARKS = {  # event -> (colour, line style, legend label)
    "summary_started": ("tab:green", ":", "summary started"),
    "summary_ready": ("tab:green", "-", "summary ready"),
    "rebased": ("tab:red", "-", "swap (rebase)"),
    "dropped": ("tab:orange", "-", "oldest turns dropped"),
}


def plot_timeline(timeline: Timeline, path, title: Optional[str] = None, dpi: int = 100) -> str:
    """Draw ``timeline`` into the PNG file ``path``; returns the path."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError('plots need matplotlib: pip install "pykvcompact[plots]"') from exc
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if not timeline.samples:
        raise ValueError("the timeline is empty: nothing was recorded")
    t0 = min(s[0] for s in timeline.samples)
    fig, (ax, lat) = plt.subplots(2, 1, figsize=(11, 5.2), sharex=True, gridspec_kw={"height_ratios": [3, 1.4]})
    try:
        xs = [t - t0 for t, _ in timeline.samples]
        ax.step(xs, [f for _, f in timeline.samples], where="post", color="tab:blue", lw=1.4, label="KV fill")
        for y, name in ((timeline.soft, "soft"), (timeline.hard, "hard")):
            if y:
                ax.axhline(y, color="grey", lw=0.8, ls="--")
                ax.text(0, y, f" {name} {y:.2f}", va="bottom", fontsize=7, color="grey")
        ax.axhline(1.0, color="black", lw=0.8)
        _mark_events(ax, timeline, t0)
        ax.set_ylabel("fill (tokens / window)")
        ax.set_ylim(0, 1.2)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, framealpha=0.9)
        ax.set_title(title or ("pykvcompact session timeline " + timeline.label).strip(), fontsize=10)

        itl, ttft = timeline.inter_token_ms(), timeline.first_token_ms()
        if itl:
            lat.plot([t - t0 for t, _ in itl], [ms for _, ms in itl], ".", ms=2, color="tab:purple",
                     label="between tokens")
        if ttft:
            lat.plot([t - t0 for t, _ in ttft], [ms for _, ms in ttft], "s", ms=3, color="tab:orange",
                     label="turn start to first token")
        if itl or ttft:
            lat.set_yscale("log")
            lat.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, framealpha=0.9)
        for e in timeline.events:
            if e.get("event") == "rebased":
                lat.axvline(e["t"] - t0, color="tab:red", lw=0.8, alpha=0.6)
        lat.set_ylabel("latency ms")
        lat.set_xlabel("seconds")
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
    return str(path)


def _fill_at(timeline: Timeline, t: float) -> float:
    fill = 0.0
    for ts, f in timeline.samples:
        if ts > t:
            break
        fill = f
    return fill


def _mark_events(ax, timeline: Timeline, t0: float) -> None:
    labelled = set()

    def once(label):
        if label in labelled:
            return None
        labelled.add(label)
        return label

    for e in timeline.events:
        name, x = e.get("event"), e.get("t", t0) - t0
        if name in MARKS:
            colour, style, label = MARKS[name]
            ax.axvline(x, color=colour, ls=style, lw=1.0, alpha=0.8, label=once(label))
            if name == "rebased" and e.get("stall_ms") is not None:
                ax.text(x, 1.01, f"{e['stall_ms']:.0f} ms", fontsize=6, color=colour, ha="center", va="bottom",
                        rotation=90)
        elif name == "probe":
            hit = e.get("verdict") == "COMPRESS"
            ax.plot([x], [_fill_at(timeline, e["t"])], "v" if hit else ".", ms=6 if hit else 4,
                    color="tab:red" if hit else "tab:grey",
                    label=once("probe: COMPRESS" if hit else "probe: CONTINUE"))
        elif name in ("offloaded", "session_offloaded"):
            ax.plot([x], [0.04], "^", ms=7, color="tab:brown", label=once("offloaded to disk"))
