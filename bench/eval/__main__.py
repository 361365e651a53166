"""``python -m bench.eval`` (and ``pykvcompact eval``): the long-horizon evaluation of issue 8.

    python -m bench.eval --model smollm2-135m --episodes 2 --quick          # the CI smoke run
    python -m bench.eval --standard                                         # every family, 2 seeds, ~2 h
    python -m bench.eval --episodes 10                                      # the full run (see README.md)
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import sys
import tempfile
import time

from .families import FAMILIES
from .policies import (NO_PROBE, POLICIES, SEARCH, STANDARD_POLICIES, Settings, full_window, is_known, make_policy,
                       standard)

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "results"


def parse(argv=None) -> argparse.Namespace:
    # no abbreviations: --standard fills in --policies and --episodes unless they are named in full
    ap = argparse.ArgumentParser(prog="python -m bench.eval", description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="registry name or GGUF path")
    ap.add_argument("--episodes", type=int, default=10, help="episodes per family")
    ap.add_argument("--quick", action="store_true", help="small window and episodes (smoke run)")
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated subset")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="comma-separated subset; NAME+search adds the search_history tool (e.g. background+search)")
    ap.add_argument("--window", type=int, default=None, help="override the window (tokens)")
    ap.add_argument("--ratio", type=float, default=None, help="episode history / window (default 4, quick 3)")
    ap.add_argument("--seed", type=int, default=1000, help="first episode seed (kept apart from calibration)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--tool-latency", type=float, default=0.0, metavar="S",
                    help="seconds each scripted tool call takes (0: instant; the engine is idle meanwhile)")
    ap.add_argument("--rebase", choices=("exact", "splice"), default="exact",
                    help="Policy.rebase of the summarizing modes (splice: only where the model can shift)")
    ap.add_argument("--keep-recent", type=float, default=None, metavar="F",
                    help="Policy.keep_recent of the summarizing modes: the share of the window kept raw")
    ap.add_argument("--out", default=None, help="output prefix (default bench/results/eval-MODEL[-quick])")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--peer-timeout", type=float, default=6 * 3600)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--standard", action="store_true",
                    help="the standard run: every family, 2 seeds, full/hard/background/peer, window 2048, "
                         "shorter episodes; resumes from its own output (see README.md)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the episodes already in OUT.json (same model and settings) and run the rest")
    args = ap.parse_args(argv)
    if args.standard:
        if args.quick:
            ap.error("--standard and --quick are two different runs: choose one")
        given = argv if argv is not None else sys.argv[1:]
        named = lambda option: any(a == option or a.startswith(option + "=") for a in given)  # noqa: E731
        args.policies = args.policies if named("--policies") else ",".join(STANDARD_POLICIES)
        args.episodes = args.episodes if named("--episodes") else 2
        args.resume = True
    for name, allowed in (("families", FAMILIES), ("policies", POLICIES)):
        vals = [v for v in getattr(args, name).split(",") if v]
        bad = [v for v in vals if not (v in allowed or (name == "policies" and is_known(v)))]
        if bad or not vals:
            extra = (f" (suffixes: {SEARCH} on any but full and peer, {NO_PROBE} on background; both: "
                     f"background{NO_PROBE}{SEARCH})"
                     if name == "policies" else "")
            ap.error(f"--{name}: unknown {bad or 'empty'}; choose from {', '.join(allowed)}{extra}")
        setattr(args, name, vals)
    return args


def main(argv=None) -> int:
    args = parse(argv)
    from .run import run_all

    settings = Settings.quick() if args.quick else standard() if args.standard else Settings()
    if args.window:
        settings.window = args.window
    if args.ratio:
        settings.ratio = args.ratio
    if not (math.isfinite(args.tool_latency) and args.tool_latency >= 0):
        raise SystemExit(f"--tool-latency must be a finite number of seconds >= 0, got {args.tool_latency}")
    settings.tool_latency = args.tool_latency
    settings.rebase = args.rebase
    settings.keep_recent = args.keep_recent
    try:  # every policy's own checks and its window's budget, before any model is loaded
        for name in args.policies:
            if name != "peer":
                policy = make_policy(name, args.families[0], settings)
                policy.limits(policy.window)
    except ValueError as exc:
        raise SystemExit(f"invalid settings for policy {name!r}: {exc}")
    tag = ("-quick" if args.quick else "-standard" if args.standard else "") + (
        "-splice" if args.rebase == "splice" else "")
    out = args.out or str(RESULTS / f"eval-{pathlib.Path(args.model).stem}{tag}")
    log = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))
    previous, earlier_s = _resumed(args, settings, out) if args.resume else ([], 0.0)
    if previous:
        log(f"resuming {out}.json: {len(previous)} episode(s) kept")
    t0 = time.time() - earlier_s
    written: list = []

    def save(results):
        written[:] = _write(args, settings, out, results, time.time() - t0)

    with tempfile.TemporaryDirectory(prefix="pkv-eval-") as hist:
        results = run_all(args, settings, hist, log, checkpoint=save, previous=previous)
    save(results)
    log(open(out + ".md").read())
    log("wrote " + ", ".join(written))
    return 0


def _resumed(args, settings, out: str):
    """The episodes of an earlier run at ``out`` that this one would run too, and its duration; a run of
    another model or other settings is refused, naming the difference (never mixed in silently)."""
    from . import metrics
    from .merge import check, compatible

    path = out + ".json"
    if not os.path.exists(path):
        return [], 0.0
    try:
        with open(path) as f:
            run = json.load(f)
        check(run, path)
        compatible(run["meta"], {"model": args.model, "quick": args.quick, "settings": vars(settings)},
                   path, "this run")
        metrics.table(run["episodes"])   # episodes the report cannot read would stop every checkpoint
        for r in run["episodes"]:
            if not isinstance(r["seed"], int):
                raise ValueError(f"episode {r['family']}/{r['policy']} has seed {r['seed']!r}, not a number")
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise SystemExit(f"cannot resume from {path}: {exc!r} (use another --out, or move the file away)")
    # every earlier episode is kept (and written back): those of other families, policies or seeds too
    return run["episodes"], float(run["meta"].get("duration_s") or 0.0)


def _write(args, settings, out: str, results: list, duration_s: float) -> list:
    """JSON, markdown and plots of the results so far."""
    from . import metrics, report

    meta = {"model": args.model, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "episodes_per_family": args.episodes, "window": settings.window, "full_window": full_window(settings),
            "ratio": settings.ratio, "quick": args.quick, "families": args.families, "policies": args.policies,
            "seed": args.seed, "duration_s": duration_s, "settings": vars(settings), "driven_by": "environment",
            "threads": args.threads, "cpu_count": os.cpu_count(), "skipped": getattr(args, "skipped", {})}
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    try:
        table = metrics.table(results)
    except Exception:   # never lose hours of episodes to a report's bug: keep them, then fail
        report.write_json(out + ".json", {"meta": meta, "episodes": results})
        raise
    # a resumed file may hold other families and policies too: they stay in the report
    families = [f for f in dict.fromkeys(list(args.families) + [r["family"] for r in results])
                if any(r["family"] == f for r in results)]
    policies = [p for p in dict.fromkeys(list(args.policies) + [r["policy"] for r in results]) if p in table]
    meta.update(families=families, policies=policies)
    files = report.write(out, meta, results, table, families, policies)
    if not args.no_plots and results:
        from . import plots

        files += plots.write_both(table, results, out, args.model)
    return files


if __name__ == "__main__":
    sys.exit(main())
