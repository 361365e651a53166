"""``python bench/recall.py``: what the recall adds to a message that names something, on a long history.

A session (the test suite's FakeEngine: no model, the cost measured is the session's own Python) is
filled with an agent's account lookups until N messages are offloaded (each lookup: a call and six JSON
rows), then user messages that name an account id and a service are added one at a time; each add is
timed with and without the recall (``recall_tokens=0``), side by side in one run.  Reports the median and
the spread of the difference per history size.

    python bench/recall.py                       # 1000 and 3000 offloaded messages
    python bench/recall.py --messages 500,2000 --questions 9 --json out.json
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

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def filled_session(n_offloaded: int, recall_tokens, seed: int = 0):
    import pykvcompact as pk
    from fake_engine import FakeEngine

    rnd = random.Random(seed)
    kw = {} if recall_tokens is None else {"recall_tokens": recall_tokens}
    s = pk.Session(FakeEngine(n_ctx=16384), system="You audit accounts.", history_dir=tempfile.mkdtemp(),
                   policy=pk.Policy(mode="hard", window=4096, compact_tool=False, summary_max_tokens=48), **kw)
    s.add({"role": "user", "content": "Audit every account and service; report anomalies."})
    k = 0
    while len(s.offloaded) < n_offloaded:
        batch = []
        for _ in range(20):
            cid, acc = f"c{k}", f"ACC-{10000 + k}"
            rows = [json.dumps({"account_id": acc, "field": f"f{j}", "value": rnd.randint(0, 99999),
                                "service": f"svc_{rnd.randint(0, 300)}"}) for j in range(6)]
            batch += [{"role": "assistant", "content": None, "tool_calls": [
                          {"id": cid, "type": "function",
                           "function": {"name": "get_account", "arguments": json.dumps({"account_id": acc})}}]},
                      {"role": "tool", "tool_call_id": cid, "name": "get_account", "content": "\n".join(rows)}]
            k += 1
        s.add(batch)
    return s, k


def timed_adds(s, accounts: int, questions: int, seed: int = 1):
    rnd = random.Random(seed)
    out = []
    for _ in range(questions):
        acc = 10000 + rnd.randrange(accounts)
        t0 = time.perf_counter()
        s.add({"role": "user", "content": f"What was f3 for ACC-{acc}, and did svc_{rnd.randint(0, 300)} serve it?"})
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/recall.py", description=__doc__.splitlines()[0])
    ap.add_argument("--messages", default="1000,3000", help="offloaded messages, comma-separated")
    ap.add_argument("--questions", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    result = {}
    for n in (int(x) for x in args.messages.split(",")):
        row = {}
        for label, tokens in (("recall", None), ("no_recall", 0)):
            s, accounts = filled_session(n, tokens)
            try:
                row[label] = timed_adds(s, accounts, args.questions)
                row[label + "_recalls"] = sum(e.name == "recalled" for e in s.events)
                row["lines"] = sum(len((m.get("content") or "").splitlines()) + 1 for m in s.offloaded)
            finally:
                s.close()
        added = [a - b for a, b in zip(row["recall"], row["no_recall"])]
        row["added_ms_median"] = statistics.median(added)
        row["added_ms_range"] = [min(added), max(added)]
        result[n] = row
        print(f"{n:6} offloaded messages ({row['lines']} lines): the recall adds {row['added_ms_median']:.0f} ms "
              f"per named message (median; {row['added_ms_range'][0]:.0f}-{row['added_ms_range'][1]:.0f}), "
              f"{row['recall_recalls']} of {args.questions} recalled; without it an add takes "
              f"{statistics.median(row['no_recall']):.1f} ms", flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
