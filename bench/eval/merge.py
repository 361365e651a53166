"""``python -m bench.eval.merge OUT A.json B.json ...``: one report from runs made separately (families on
separate machines or one after another), as if one run had made them all.

The episodes are pooled and every metric is recomputed from them (nothing is averaged from the runs'
tables). The runs must agree on the model and the settings that change what an episode is (window,
ratio, reply and summary sizes, probe cadence, rubric); a mismatch is refused, naming the setting. The
same (family, seed, policy) in two runs is refused too: it would count one episode twice."""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from typing import List

from . import metrics, report

# settings that change what an episode measures (threads are reported, not compared); a run written
# before a setting existed ran with its default
COMPARED = {"window": None, "ratio": None, "reply_tokens": None, "answer_tokens": None,
            "summary_max_tokens": None, "probe_every": None, "compact_tool": None, "rubric": None,
            "tool_latency": 0.0, "rebase": "exact", "keep_recent": None, "sub_goals": None, "steps": None}
REQUIRED_META = ("model", "date", "families", "policies", "duration_s", "settings")
REQUIRED_EPISODE = ("family", "seed", "policy")


def _setting(settings: dict, key: str, default):
    """A run's value of a compared setting; keep_recent None is the policy's default (the same episodes)."""
    value = settings.get(key, default)
    if key == "keep_recent" and value is None:
        from pykvcompact.compaction.policy import Policy
        return Policy().keep_recent
    return value


def check(run, name: str) -> None:
    """``run`` has the shape of an eval JSON, else a ValueError naming the file and what is missing."""
    if not isinstance(run, dict) or not isinstance(run.get("meta"), dict) or not isinstance(run.get("episodes"), list):
        raise ValueError(f"{name}: not an eval JSON (an object with 'meta' and 'episodes')")
    meta = run["meta"]
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing or not isinstance(meta["settings"], dict):
        raise ValueError(f"{name}: meta lacks {', '.join(missing) or 'a settings object'}")
    for i, ep in enumerate(run["episodes"]):
        if not isinstance(ep, dict) or any(k not in ep for k in REQUIRED_EPISODE):
            raise ValueError(f"{name}: episode {i} lacks one of {', '.join(REQUIRED_EPISODE)}")


def compatible(first: dict, meta: dict, first_name: str, name: str) -> None:
    """A ValueError naming the difference when two runs' metas measured different things."""
    if meta["model"] != first["model"]:
        raise ValueError(f"runs of different models: {first['model']!r} in {first_name} and {meta['model']!r} in {name}")
    if bool(meta.get("quick")) != bool(first.get("quick")):
        raise ValueError(f"a --quick run and a full one ({first_name}, {name}): their episodes differ in shape")
    for key, default in COMPARED.items():
        a, b = (_setting(run_meta["settings"], key, default) for run_meta in (first, meta))
        if a != b:
            raise ValueError(f"runs with different settings: {key} is {a!r} in {first_name} and {b!r} in {name}")


def merge(runs: List[dict], names: List[str] = ()) -> dict:
    """The pooled {"meta", "metrics", "episodes"} of ``runs`` (each a loaded eval JSON; ``names`` for
    the messages, default run1, run2, ...)."""
    if not runs:
        raise ValueError("nothing to merge: give at least one eval JSON")
    names = list(names) or [f"run{i + 1}" for i in range(len(runs))]
    for run, name in zip(runs, names):
        check(run, name)
    first = runs[0]["meta"]
    seen = set()
    episodes: List[dict] = []
    for run, name in zip(runs, names):
        compatible(first, run["meta"], names[0], name)
        for ep in run["episodes"]:
            key = (ep["family"], ep["seed"], ep["policy"])
            if key in seen:
                raise ValueError(f"episode {key} is in two runs (again in {name}): merge each episode once")
            seen.add(key)
            episodes.append(ep)
    per_cell = Counter((e["family"], e["policy"]) for e in episodes)
    meta = dict(first, families=_union(r["meta"]["families"] for r in runs),
                policies=_union(r["meta"]["policies"] for r in runs),
                episodes_per_family=max(per_cell.values(), default=0),
                seed=min((e["seed"] for e in episodes), default=first.get("seed")),
                date=max(r["meta"]["date"] for r in runs),
                duration_s=sum(r["meta"]["duration_s"] for r in runs),
                threads=sorted({t for r in runs for t in _as_list(r["meta"].get("threads"))}),
                skipped={k: v for r in runs for k, v in (r["meta"].get("skipped") or {}).items()},
                merged_from=[dict(file=name, date=r["meta"]["date"], families=r["meta"]["families"],
                                  policies=r["meta"]["policies"], duration_s=r["meta"]["duration_s"])
                             for r, name in zip(runs, names)])
    try:
        table = metrics.table(episodes)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"an episode lacks a field the metrics need ({exc!r}): was it written by an older bench.eval?")
    return {"meta": meta, "metrics": table, "episodes": episodes}


def _as_list(x) -> list:
    """A run's threads: a number, or a merged run's list of them."""
    return [] if x is None else list(x) if isinstance(x, (list, tuple)) else [x]


def _union(lists) -> list:
    """Every item once, in the order first seen."""
    return list(dict.fromkeys(x for xs in lists for x in xs))


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
        merged = merge(runs, args.runs)
    except ValueError as exc:
        raise SystemExit(f"cannot merge: {exc}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
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
