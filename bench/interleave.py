"""What a summary prefilled next to decoding costs, by ``background_chunk_busy``.

A background preparation prefills the summary (a few hundred tokens) while the conversation decodes.
The engine gives it at most ``background_chunk_busy`` rows in each decode step that carries a
foreground token.  This measures, on one engine per chunk size, the wall time of

- ``at_once``: the summary prefilled first, then ``--decode`` tokens generated (what ``hard`` does);
- ``beside``: the same summary prepared as a (splice) rebase while the same tokens are generated one
  call each, until both are done (what ``background`` does), with the time of each of those tokens
  while the preparation ran (``token_ms``: what a streaming user waits between two tokens).

    python bench/interleave.py --model qwen2.5-coder-1.5b --chunks 8,64,128 --out bench/results/interleave.json

Medians of ``--repeats`` runs with min and max, both sides alternated on the same engine.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import pykvcompact as pk


def _tokens(eng: pk.Engine, n: int, seed: int) -> list:
    rng = random.Random(seed)
    words = eng.tokenize(open(__file__, encoding="utf-8").read())
    return [words[rng.randrange(len(words))] for _ in range(n)]


def measure(model: str, chunk: int, args) -> dict:
    # the idle cap at least the busy one (the engine refuses a busy cap above it)
    with pk.Engine(model, n_ctx=4096, n_seq_max=8, n_threads=args.threads, background_chunk=max(64, chunk),
                   background_chunk_busy=chunk, background_share=args.background_share) as eng:
        seq = eng.sequence(_tokens(eng, args.context, 0))
        summary = _tokens(eng, args.summary, 1)
        keep_prefix, keep_from = args.context // 6, args.context - args.context // 6
        at_once, beside, token_ms = [], [], []
        for _ in range(args.repeats):
            with seq.fork() as s:
                t0 = time.perf_counter()
                s.append(summary)
                s.generate(args.decode)
                at_once.append(time.perf_counter() - t0)
            with seq.fork() as s:
                t0 = time.perf_counter()
                rb = s.prepare_rebase(keep_prefix, summary, keep_from, mode="splice")
                for _ in range(args.decode):
                    t1 = time.perf_counter()
                    s.generate(1)
                    if not rb.done():
                        token_ms.append((time.perf_counter() - t1) * 1000.0)
                rb.wait()
                beside.append(time.perf_counter() - t0)
                rb.cancel()
        stat = lambda v: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v)}  # noqa: E731
        tok = {"median_ms": statistics.median(token_ms), "max_ms": max(token_ms), "n": len(token_ms)} \
            if token_ms else None
        return {"background_chunk_busy": chunk, "background_share": eng.stats()["background_share"],
                "aborted_decodes": eng.stats()["aborted_decodes"], "at_once": stat(at_once), "beside": stat(beside),
                "ratio": statistics.median(beside) / statistics.median(at_once), "token_ms": tok}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--chunks", default="8,64,128")
    ap.add_argument("--context", type=int, default=1200)
    ap.add_argument("--summary", type=int, default=400)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--background-share", type=float, default=None,
                    help="the engine's background_share (default: by backend, 0.15 on a CPU; 1: every step)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = [measure(args.model, int(c), args) for c in args.chunks.split(",")]
    out = {"model": args.model, "context": args.context, "summary": args.summary, "decode": args.decode,
           "repeats": args.repeats, "threads": args.threads, "rows": rows}
    for r in rows:
        print(f"chunk {r['background_chunk_busy']:4d}: at once {r['at_once']['median_s']:.2f} s, "
              f"beside {r['beside']['median_s']:.2f} s ({r['ratio']:.2f}x), a token beside it "
              f"{(r['token_ms'] or {}).get('median_ms', float('nan')):.0f} ms")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
