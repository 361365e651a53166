"""``python -m bench.eval.merge OUT A.json B.json ...``: one report from runs made separately (families on
separate machines or one after another), as if one run had made them all.

The episodes are pooled and every metric is recomputed from them (nothing is averaged from the runs'
tables). The runs must agree on the model and the settings that change what an episode is (window,
ratio, reply and summary sizes, probe cadence, rubric); a mismatch is refused, naming the setting. The
same (family, seed, policy) in two runs is refused too: it would count one episode twice."""
from __future__ import annotations

import argparse
import json
import sys
from typing import List

from . import metrics, report

# settings that change what an episode measures; threads and tool latency are reported, not compared
COMPARED = ("window", "ratio", "reply_tokens", "answer_tokens", "summary_max_tokens", "probe_every",
            "compact_tool", "rubric", "tool_latency")


def merge(runs: List[dict]) -> dict:
    """The pooled {"meta", "metrics", "episodes"} of ``runs`` (each a loaded eval JSON)."""
    if not runs:
        raise ValueError("nothing to merge: give at least one eval JSON")
    first = runs[0]["meta"]
    seen = set()
    episodes: List[dict] = []
    for run in runs:
        meta = run["meta"]
        if meta["model"] != first["model"]:
            raise ValueError(f"runs of different models: {first['model']!r} and {meta['model']!r}")
        for key in COMPARED:
            a, b = first["settings"].get(key), meta["settings"].get(key)
            if a != b:
                raise ValueError(f"runs with different settings: {key} is {a!r} in one and {b!r} in another")
        for ep in run["episodes"]:
            key = (ep["family"], ep["seed"], ep["policy"])
            if key in seen:
                raise ValueError(f"episode {key} is in two runs: merge each episode once")
            seen.add(key)
            episodes.append(ep)
    families = _union(r["meta"]["families"] for r in runs)
    policies = _union(r["meta"]["policies"] for r in runs)
    meta = dict(first, families=families, policies=policies,
                date=max(r["meta"]["date"] for r in runs),
                duration_s=sum(r["meta"]["duration_s"] for r in runs),
                threads=sorted({r["meta"]["threads"] for r in runs}),
                skipped={k: v for r in runs for k, v in r["meta"].get("skipped", {}).items()},
                merged_from=[dict(date=r["meta"]["date"], families=r["meta"]["families"],
                                  policies=r["meta"]["policies"], duration_s=r["meta"]["duration_s"])
                             for r in runs])
    return {"meta": meta, "metrics": metrics.table(episodes), "episodes": episodes}


def _union(lists) -> list:
    out: list = []
    for xs in lists:
        out += [x for x in xs if x not in out]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.eval.merge", description=__doc__.splitlines()[0])
    ap.add_argument("out", help="output prefix (writes OUT.json, OUT.md and, unless --no-plots, the plots)")
    ap.add_argument("runs", nargs="+", help="eval JSON files")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    runs = []
    for path in args.runs:
        try:
            with open(path) as f:
                runs.append(json.load(f))
        except (OSError, ValueError) as exc:
            raise SystemExit(f"cannot read eval JSON {path}: {exc}")
    try:
        merged = merge(runs)
    except (ValueError, KeyError) as exc:
        raise SystemExit(f"cannot merge: {exc}")
    meta, table, episodes = merged["meta"], merged["metrics"], merged["episodes"]
    policies = [p for p in meta["policies"] if p in table]
    files = report.write(args.out, meta, episodes, table, meta["families"], policies)
    if not args.no_plots and episodes:
        from . import plots

        files += plots.write_both(table, episodes, args.out, meta["model"])
    print("wrote " + ", ".join(files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
