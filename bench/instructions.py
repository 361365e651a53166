"""Do the user's instructions survive compaction? (issue 12)

Each episode: the first user message sets four standing instructions (a port, a file never to modify, a
branch-name prefix, a ship day; values drawn from a seed so no default can guess them), then a long
stretch of tool output (file reads) crosses the window several times, then the user asks for the four
instructions.  Recall = instructions whose value appears in the answer.  Policies: ``full`` (a window
big enough for the whole episode: the ceiling), ``hard`` and ``background`` at ``--window``.  Also
reported: the tokens the kept user messages cost in each rebased context.

    python bench/instructions.py --model qwen2.5-coder-1.5b --episodes 2 --out bench/results/instructions-qwen2.5-coder-1.5b.json
"""
from __future__ import annotations

import argparse
import json
import pathlib
import random
import statistics
import sys
import tempfile
import time

import pykvcompact as pk

# run as a script only bench/ is on the path: the checkout goes at its end, so that pykvcompact stays the
# installed package
sys.path.append(str(pathlib.Path(__file__).resolve().parents[1]))
from bench.common import write_result  # noqa: E402

PORTS = [7391, 6143, 9257, 5821, 8469]
FILES = ["ledger_sync.py", "billing_core.py", "tax_rules.py", "payout_map.py", "rates_cache.py"]
PREFIXES = ["hx/", "zq-", "kw_", "mb/", "tr-"]
DAYS = ["Wednesday", "Thursday", "Tuesday", "Friday", "Monday"]
QUESTION = ("Before you continue: list the four standing instructions I gave you at the start — the port to "
            "deploy on, the file you must never modify, the prefix for branch names, and the ship day. "
            "Answer in four short lines.")


def episode(seed: int):
    r = random.Random(seed)
    v = {"port": str(r.choice(PORTS)), "file": r.choice(FILES), "prefix": r.choice(PREFIXES), "day": r.choice(DAYS)}
    task = (f"New task: clean up the invoice service. Standing instructions for the whole task: deploy on port "
            f"{v['port']}; never modify {v['file']}; branch names start with {v['prefix']}; we ship on {v['day']}. "
            "Start by reading the files one by one.")
    return v, task


def file_body(i: int) -> str:
    lines = [f"# src/invoice/module_{i}.py"]
    for k in range(18):
        lines.append(f"def step_{i}_{k}(rows, limit={10 + k}):  # computes partial total {i * 100 + k}")
    return "\n".join(lines)


def recall(answer: str, v: dict) -> dict:
    a = answer.lower()
    return {k: (x.lower().rstrip("/-_") in a) for k, x in v.items()}


def run_one(eng, mode: str, window: int, seed: int, turns: int, history: str) -> dict:
    v, task = episode(seed)
    policy = pk.Policy(mode="none" if mode == "full" else mode, window=window, compact_tool=False, probe_every=10_000,
                       probe_on_tool_result=False)
    s = pk.Session(eng, system="You are a careful coding agent.", policy=policy, history_dir=history,
                   session_id=f"instr-{mode}-{seed}")
    t0 = time.perf_counter()
    try:
        s.chat(task, max_tokens=16)
        for i in range(turns):
            call = {"id": f"c{i}", "type": "function",
                    "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/invoice/module_{i}.py"})}}
            s.add([{"role": "assistant", "content": None, "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": call["id"], "content": file_body(i)}])
        ans = s.chat(QUESTION, max_tokens=80)["choices"][0]["message"]["content"]
        reb = [e for e in s.events if e.name == "rebased"]
        kept_cost = [len(eng.tokenize(m["content"].split("\n\n", 2)[1])) for m in s.messages
                     if m.get("summary") and "User messages, verbatim" in m["content"]]
        rc = recall(ans, v)
        return {"mode": mode, "seed": seed, "values": v, "answer": ans, "recall": rc, "score": sum(rc.values()) / 4,
                "rebases": len(reb), "dropped": sum(e.name == "dropped" for e in s.events),
                "kept_user_tokens": kept_cost, "elapsed_s": round(time.perf_counter() - t0, 1),
                "peak_fill": s.fill}
    finally:
        s.close()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--modes", default="full,hard,background")
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--turns", type=int, default=14)
    ap.add_argument("--episodes", type=int, default=2)
    ap.add_argument("--n-threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    full_window = 8192
    eng = pk.Engine(args.model, n_ctx=full_window + 512, n_seq_max=8, n_threads=args.n_threads)
    history = tempfile.mkdtemp(prefix="pykvcompact-instr-")
    runs = []
    for ep in range(args.episodes):
        for mode in args.modes.split(","):
            w = full_window if mode == "full" else args.window
            r = run_one(eng, mode, w, 1000 + ep, args.turns, history)
            runs.append(r)
            print(f"{mode:10s} seed {r['seed']} score {r['score']:.2f} rebases {r['rebases']} "
                  f"kept {r['kept_user_tokens']} {r['elapsed_s']}s | {r['answer'][:120]!r}", file=sys.stderr)
    summary = {}
    for mode in args.modes.split(","):
        sc = [r["score"] for r in runs if r["mode"] == mode]
        kept = [k for r in runs if r["mode"] == mode for k in r["kept_user_tokens"]]
        summary[mode] = {"recall_mean": round(statistics.mean(sc), 3), "recall_min": min(sc), "recall_max": max(sc),
                         "episodes": len(sc), "rebases": sum(r["rebases"] for r in runs if r["mode"] == mode),
                         "kept_user_tokens_median": statistics.median(kept) if kept else 0}
    result = {"model": eng.model_name if hasattr(eng, "model_name") else args.model, "window": args.window,
              "full_window": full_window, "turns": args.turns, "date": time.strftime("%Y-%m-%d"),
              "machine": "2-core CPU", "summary": summary, "runs": runs}
    eng.close()
    write_result(result, args.out)
    print(json.dumps(summary, indent=2))
    return result


if __name__ == "__main__":
    main()
