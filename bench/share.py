"""What background work costs the foreground, by ``background_share`` (the engine's time share for
background rows next to foreground work), side by side in one run on one model:

- ``decode``: greedy ms/token of one foreground call, alone and while a background generation runs on
  another sequence; the speed ratio (1.0: the background costs nothing), and the background tokens made
  meanwhile (what the background got);
- ``replies beside a prefill``: streamed replies of ``--reply`` tokens, one every ``--gap-ms``, while a
  background prefill of ``--prefill`` tokens runs: the first token's latency (a background-only decode
  in progress is cut short when the reply arrives), the time between the next tokens, and how long the
  prefill took.

    python bench/share.py --model qwen2.5-coder-1.5b --shares 1,0.2 --out bench/results/share-qwen.json

Each figure is the median over ``--repeats`` runs with min and max; the shares alternate within a repeat,
one engine at a time.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import pykvcompact as pk


def _spread(v: list) -> dict:
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def _tokens(n: int, seed: int) -> list:
    rng = random.Random(seed)
    return [rng.randrange(100, 5000) for _ in range(n)]


def decode_beside_generation(eng: pk.Engine, seq, n: int) -> dict:
    with seq.fork() as f:
        t0 = time.perf_counter()
        f.generate(n)
        solo = (time.perf_counter() - t0) * 1000.0 / n
    with seq.fork() as f, seq.fork() as other:
        bg = other.generate_background(100_000)
        while len(bg.tokens) < 1:
            time.sleep(0.001)
        k0 = len(bg.tokens)
        t0 = time.perf_counter()
        f.generate(n)
        shared = (time.perf_counter() - t0) * 1000.0 / n
        made = len(bg.tokens) - k0
        bg.cancel()
        bg.result()
    return {"solo_ms": solo, "beside_ms": shared, "speed_ratio": solo / shared, "background_tokens": made}


def replies_beside_prefill(eng: pk.Engine, seq, n: int, gap_ms: float, reply: int) -> dict:
    """Short streamed replies, one every ``gap_ms``, while a background prefill of ``n`` tokens runs:
    the first token's latency (the call may arrive during a background-only decode) and the gaps
    between the next ones (steps the background may share)."""
    with seq.fork() as f, seq.fork() as other:
        first, between = [], []
        t0 = time.perf_counter()
        job = other.append_background(_tokens(n, 9))
        while not job.done():
            time.sleep(gap_ms / 1000.0)
            t1 = time.perf_counter()
            for i, _ in enumerate(f.stream(reply)):
                t2 = time.perf_counter()
                (first if i == 0 else between).append((t2 - t1) * 1000.0)
                t1 = t2
        job.result()
        took = time.perf_counter() - t0
    return {"first_ms": statistics.median(first), "first_worst_ms": max(first),
            "token_ms": statistics.median(between) if between else None,
            "token_worst_ms": max(between) if between else None, "prefill_s": took}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--shares", default="1,0.2", help="background_share values, compared side by side")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--gap-ms", type=float, default=100.0)
    ap.add_argument("--reply", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    shares = [float(x) for x in args.shares.split(",")]
    # One engine at a time: once two engines in a process have both decoded, each one's decoding is
    # ~1.6x slower on this 2-core CPU (their ggml worker threads compete), which would blur the ratios.
    raw = {s: {"decode": [], "prefill": [], "aborted": 0} for s in shares}
    for _ in range(args.repeats):
        for s in shares:
            with pk.Engine(args.model, n_ctx=4096, n_seq_max=6, n_threads=args.threads, background_share=s) as eng:
                seq = eng.sequence(_tokens(args.context, 0))
                seq.logits()
                raw[s]["decode"].append(decode_beside_generation(eng, seq, args.decode))
                raw[s]["prefill"].append(replies_beside_prefill(eng, seq, args.prefill, args.gap_ms, args.reply))
                raw[s]["aborted"] += eng.stats()["aborted_decodes"]
                seq.close()
    aborted = {s: raw[s]["aborted"] for s in shares}
    out = {"model": args.model, "context": args.context, "decode": args.decode, "prefill": args.prefill,
           "gap_ms": args.gap_ms, "reply": args.reply, "repeats": args.repeats, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "shares": {}}
    for s in shares:
        d, p = raw[s]["decode"], raw[s]["prefill"]
        out["shares"][str(s)] = {
            "decode_solo_ms": _spread([x["solo_ms"] for x in d]),
            "decode_beside_generation_ms": _spread([x["beside_ms"] for x in d]),
            "speed_ratio": _spread([x["speed_ratio"] for x in d]),
            "background_tokens_meanwhile": _spread([x["background_tokens"] for x in d]),
            "first_token_beside_prefill_ms": _spread([x["first_ms"] for x in p]),
            "first_token_beside_prefill_worst_ms": max(x["first_ms"] for x in p),
            "token_beside_prefill_ms": _spread([x["token_ms"] for x in p if x["token_ms"] is not None]),
            "token_beside_prefill_worst_ms": max((x["token_worst_ms"] or 0) for x in p),
            "prefill_s": _spread([x["prefill_s"] for x in p]),
            "aborted_decodes": aborted[s],
        }
        r = out["shares"][str(s)]
        print(f"share {s}: decode {r['decode_solo_ms']['median']:.0f} ms/token alone, "
              f"{r['decode_beside_generation_ms']['median']:.0f} beside a generation "
              f"({r['speed_ratio']['median']:.2f}x, {r['speed_ratio']['min']:.2f}-{r['speed_ratio']['max']:.2f}; "
              f"background made {r['background_tokens_meanwhile']['median']:.0f} tokens); beside a "
              f"{args.prefill}-token prefill a reply's first token {r['first_token_beside_prefill_ms']['median']:.0f} ms "
              f"(worst {r['first_token_beside_prefill_worst_ms']:.0f}), the next ones "
              f"{r['token_beside_prefill_ms']['median']:.0f} ms (worst {r['token_beside_prefill_worst_ms']:.0f}); "
              f"prefill {r['prefill_s']['median']:.1f} s, "
              f"{r['aborted_decodes']} aborted decodes", flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
