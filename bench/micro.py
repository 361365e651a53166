"""Micro-benchmarks of the sequence operations: fork, probe (100 tokens at 1k/2k/4k of context),
truncate, prepare/commit rebase, and the per-step cost of decoding: greedy ms/token alone, and while
a background generation shares every decode step. Each figure is the median over repeated runs, with the spread
(min, max, interquartile range). The probe is compared, in the same run, with what a client without
KV reuse pays for the same question: prefilling context + probe from scratch.

    python bench/micro.py --model smollm2-135m --repeats 7 --out bench/results/micro-smollm2.json
"""

from __future__ import annotations

import argparse
import pathlib
import platform
import random
import statistics
import sys
import time

import pykvcompact as pk

# run as a script only bench/ is on the path: the checkout goes at its end, so that pykvcompact stays the
# installed package
sys.path.append(str(pathlib.Path(__file__).resolve().parents[1]))
from bench.common import write_result  # noqa: E402


def summary(samples: list[float]) -> dict:
    s = sorted(samples)
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0]] * 3
    return {"median": statistics.median(s), "min": s[0], "max": s[-1], "iqr": q[2] - q[0], "n": len(s)}


def _loadavg() -> list[float]:
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return []


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000.0


def context_tokens(eng: pk.Engine, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    words = eng.tokenize(open(__file__, encoding="utf-8").read())
    return [words[rng.randrange(len(words))] for _ in range(n)]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--contexts", default="1024,2048,4096")
    ap.add_argument("--probe-tokens", type=int, default=100)
    ap.add_argument("--baseline-repeats", type=int, default=2, help="repeats of the full re-prefill baseline (slow)")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--n-threads", type=int, default=None)
    ap.add_argument("--n-gpu-layers", type=int, default=0)
    ap.add_argument("--background-share", type=float, default=None,
                    help="the engine's background_share (default: by backend, 0.15 on a CPU; 1: every step)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",")]
    n_ctx = max(contexts) * 2 + 1024

    eng = pk.Engine(args.model, n_ctx=n_ctx, n_seq_max=8, n_threads=args.n_threads, n_gpu_layers=args.n_gpu_layers,
                    background_share=args.background_share)
    result = {"model": args.model, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg": _loadavg(), "n_ctx": eng.n_ctx, "n_threads": eng.n_threads, "background_share": eng.stats()["background_share"], "machine": platform.machine(),
              "processor": platform.processor(), "python": sys.version.split()[0], "repeats": args.repeats,
              "unit": "ms", "ops": {}}
    ops = result["ops"]
    probe = context_tokens(eng, args.probe_tokens, seed=99)

    for L in contexts:
        base = context_tokens(eng, L, seed=L)
        t0 = time.perf_counter()
        seq = eng.sequence(base)
        prefill_ms = (time.perf_counter() - t0) * 1000.0
        ops[f"prefill_{L}"] = summary([prefill_ms])

        fork_ms, close_ms = [], []
        for _ in range(args.repeats):
            holder = {}
            fork_ms.append(timed(lambda: holder.setdefault("f", seq.fork())))
            close_ms.append(timed(lambda: holder["f"].close()))
        ops[f"fork_{L}"] = summary(fork_ms)
        ops[f"fork_close_{L}"] = summary(close_ms)

        probe_ms = [timed(lambda: seq.probe(probe)) for _ in range(args.repeats)]
        ops[f"probe{args.probe_tokens}_at_{L}"] = summary(probe_ms)

        # Baseline: no KV reuse, the whole context + probe is prefilled for each question.
        base_ms = []
        for _ in range(args.baseline_repeats):
            def full():
                with eng.sequence(base + probe) as s2:
                    s2.logits()
            base_ms.append(timed(full))
        ops[f"probe_reprefill_baseline_at_{L}"] = summary(base_ms)
        ops[f"probe_speedup_vs_reprefill_at_{L}"] = {
            "median": statistics.median(base_ms) / statistics.median(probe_ms), "unit": "x"}

        # Per-step cost: greedy decoding on a fork, alone and next to a background generation.
        decode_solo, decode_shared = [], []
        for _ in range(max(1, args.repeats // 2)):
            with seq.fork() as f:
                decode_solo.append(timed(lambda: f.generate(args.decode_tokens)) / args.decode_tokens)
            with seq.fork() as f, seq.fork() as other:
                bg = other.generate_background(100_000)
                decode_shared.append(timed(lambda: f.generate(args.decode_tokens)) / args.decode_tokens)
                bg.cancel()
                bg.result()
        ops[f"decode_ms_per_token_at_{L}"] = summary(decode_solo)
        ops[f"decode_ms_per_token_next_to_background_generation_at_{L}"] = summary(decode_shared)
        ops[f"decode_speed_next_to_background_over_solo_at_{L}"] = {
            "median": statistics.median(decode_solo) / statistics.median(decode_shared), "unit": "x"}

        trunc_ms = []
        tail = base[-100:]
        for _ in range(args.repeats):
            trunc_ms.append(timed(lambda: seq.truncate(L - 100)))
            seq.append(tail)
        ops[f"truncate100_at_{L}"] = summary(trunc_ms)

        # Rebase: keep 64 prefix tokens, replace [64, L/2) by a 256-token summary, keep the rest.
        summary_toks = context_tokens(eng, 256, seed=7)
        ready_ms, commit_ms, stall_ms, catch_ms, catch_stall = [], [], [], [], []
        for r in range(max(1, args.repeats // 2)):
            with seq.fork() as s3:
                t0 = time.perf_counter()
                rb = s3.prepare_rebase(64, summary_toks, L // 2)
                rb.wait()
                ready_ms.append((time.perf_counter() - t0) * 1000.0)
                info = {}
                commit_ms.append(timed(lambda: info.update(s3.commit_rebase(rb))))
                stall_ms.append(info["stall_ms"])
            with seq.fork() as s4:
                rb = s4.prepare_rebase(64, summary_toks, L // 2)
                rb.wait()
                s4.append(context_tokens(eng, 16, seed=r))  # main moves on; commit at once
                info = s4.commit_rebase(rb)
                catch_ms.append(info["catch_up_tokens"])
                catch_stall.append(info["stall_ms"])
        ops[f"rebase_prepare_until_ready_at_{L}"] = summary(ready_ms)
        ops[f"rebase_commit_call_at_{L}"] = summary(commit_ms)
        ops[f"rebase_commit_stall_at_{L}"] = summary(stall_ms)
        ops[f"rebase_commit_stall_after_16_new_tokens_at_{L}"] = summary(catch_stall)
        ops[f"rebase_catch_up_tokens_after_16_new_tokens_at_{L}"] = summary([float(c) for c in catch_ms])
        seq.close()
        print(f"context {L}: fork {ops[f'fork_{L}']['median']:.3f} ms, probe {ops[f'probe{args.probe_tokens}_at_{L}']['median']:.1f} ms "
              f"(re-prefill {ops[f'probe_reprefill_baseline_at_{L}']['median']:.0f} ms), "
              f"decode {ops[f'decode_ms_per_token_at_{L}']['median']:.1f} ms/token "
              f"({ops[f'decode_speed_next_to_background_over_solo_at_{L}']['median']:.2f}x next to a background generation), "
              f"truncate {ops[f'truncate100_at_{L}']['median']:.3f} ms, commit stall {ops[f'rebase_commit_stall_at_{L}']['median']:.3f} ms",
              file=sys.stderr)

    result["loadavg_end"] = _loadavg()
    result["engine_stats"] = {k: v for k, v in eng.stats().items() if k != "tokens_per_sequence"}
    eng.close()
    print(write_result(result, args.out))
    return result


if __name__ == "__main__":
    main()
