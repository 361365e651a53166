"""Compaction strategies side by side: the same scripted agent session (pykvcompact.cli.agent_demo) run
once per policy mode on one engine, in one process, so the figures are comparable.

For each mode: per-turn latency (median, p90, max: the max is the stall a user feels), the stall
measured at each swap, rebases and their triggers, probes and their cost, summaries, and the engine's
decode rows split by kind (foreground / background / probe), which shows where summary tokens were
generated: on the main path (foreground) or interleaved in the background.

    python bench/compaction.py --model smollm2-135m --turns 22 --window 1024 --out bench/results/compaction-smollm2.json
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

import pykvcompact as pk
from pykvcompact.cli.agent_demo import run_agent_demo

# run as a script only bench/ is on the path: the checkout goes at its end, so that pykvcompact stays the
# installed package
sys.path.append(str(pathlib.Path(__file__).resolve().parents[1]))
from bench.common import write_result  # noqa: E402


def run_mode(eng, mode: str, args, history: str, k: int) -> dict:
    before = eng.stats()
    turn_log = []
    t0 = time.perf_counter()
    summary = run_agent_demo(engine=eng, turns=args.turns, window=args.window, mode=mode, max_tokens=args.max_tokens,
                             summary_max_tokens=args.summary_max_tokens, history_dir=history,
                             session_id=f"bench-{mode}-{k}", out=turn_log.append)
    elapsed = time.perf_counter() - t0
    after = eng.stats()
    turn_ms = [float(line.split("s  ")[0].split()[-1]) * 1000 for line in turn_log if line.startswith("turn ")]
    summary.update({
        "elapsed_s": round(elapsed, 2),
        "turn_ms": {"median": round(statistics.median(turn_ms), 1),
                    "p90": round(statistics.quantiles(turn_ms, n=10)[-1], 1) if len(turn_ms) >= 2 else None,
                    "max": round(max(turn_ms), 1)},
        "decode_rows": {k: after["rows"][k] - before["rows"][k] for k in after["rows"]},
    })
    return summary


def spread(runs: list) -> dict:
    """Median [min-max] over the repeats of the figures the README shows."""
    def fig(f):
        xs = [f(r) for r in runs]
        med = statistics.median(xs)
        return med if len(xs) == 1 else {"median": med, "min": min(xs), "max": max(xs)}
    return {
        "elapsed_s": fig(lambda r: r["elapsed_s"]), "turn_ms_median": fig(lambda r: r["turn_ms"]["median"]),
        "turn_ms_max": fig(lambda r: r["turn_ms"]["max"]), "rebases": fig(lambda r: r["rebases"]),
        "rebases_prepared": fig(lambda r: r["rebases_prepared"]), "rebases_fallback": fig(lambda r: r["rebases_fallback"]),
        "dropped": fig(lambda r: r["dropped"]), "worst_stall_ms": fig(lambda r: r["worst_stall_ms"]),
        "wait_ms_max": fig(lambda r: r["wait_ms_max"]),
        "decode_rows": {k: fig(lambda r, k=k: r["decode_rows"][k]) for k in runs[0]["decode_rows"]},
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--modes", default="hard,background,rubric,tool,fixed,none")
    ap.add_argument("--turns", type=int, default=24)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--summary-max-tokens", type=int, default=None, help="default: the policy's (1/8 of the window)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per mode (median and spread of the figures)")
    ap.add_argument("--n-threads", type=int, default=None)
    ap.add_argument("--n-gpu-layers", type=int, default=0)
    ap.add_argument("--background-share", type=float, default=None,
                    help="the engine's background_share (default: by backend, 0.15 on a CPU; 1: every step)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    n_ctx = 2 * args.window + 1536
    eng = pk.Engine(args.model, n_ctx=n_ctx, n_seq_max=8, n_threads=args.n_threads, n_gpu_layers=args.n_gpu_layers,
                    background_share=args.background_share)
    result = {"model": args.model, "window": args.window, "turns": args.turns, "n_ctx": eng.n_ctx,
              "n_threads": eng.n_threads, "background_share": eng.stats()["background_share"],
              "max_tokens": args.max_tokens, "repeats": args.repeats,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": "2-core CPU", "modes": {}}
    history = tempfile.mkdtemp(prefix="pykvcompact-bench-")
    for mode in args.modes.split(","):
        try:
            runs = [run_mode(eng, mode, args, history, k) for k in range(args.repeats)]
        except ValueError as e:  # the mode cannot run at this window (e.g. fixed_at below the system prompt)
            result["modes"][mode] = {"error": str(e)}
            print(f"{mode:10s} cannot run: {e}", file=sys.stderr)
            continue
        result["modes"][mode] = {"runs": runs, **spread(runs)}
        m = result["modes"][mode]
        print(f"{mode:10s} elapsed {m['elapsed_s']}  turn median {m['turn_ms_median']} ms  slowest {m['turn_ms_max']} "
              f"ms  rebases {m['rebases']}  prepared {m['rebases_prepared']}  fallback {m['rebases_fallback']}  "
              f"dropped {m['dropped']}  worst stall {m['worst_stall_ms']} ms", file=sys.stderr)
        write_result(result, args.out)  # after each mode, so that a long run that is stopped keeps what it measured
    eng.close()
    print(write_result(result, args.out))
    return result


if __name__ == "__main__":
    main()
