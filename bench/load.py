"""Load and isolation: N agent conversations at once against the OpenAI-compatible server on loopback.

Each conversation is a scripted agent (pykvcompact.cli.agent_demo's tasks: a user request, a tool call, its
result, the model's answer) long enough to compact several times.  Every conversation is first run
alone, then all of them at once; the run checks that every response is well formed, that each
conversation's greedy replies under load equal its replies alone (isolation: no state leaks between
sessions), and that no sequence or KV cell is left once the sessions are deleted.  It reports request
latency (p50, p99) alone and under load, and the compactions.  Bounded: every request has a timeout.

    python -m bench.load --model smollm2-135m --conversations 8 --turns 10 --out bench/results/load-smollm2.json

Isolation is checked where float noise cannot hide a leak: once every conversation has run under load,
each live session's sequence, one token further, is compared with a fresh prefill of the same tokens
(``kv_drift``, max |delta logit|): cells of another sequence seen, or its own overwritten, show far above
the placement noise of a float model (~1e-5).  Greedy replies are compared too, but they are not exact
even on a float model: batch composition moves the float sums, so text can split late at a near-tie
(docs/architecture.md; llama.cpp PR #6950), and ``background`` times its preparations by measured rates.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from typing import List

import httpx
import numpy as np

import pykvcompact as pk
from pykvcompact.cli.agent_demo import TOOLS, _script
from pykvcompact.server import ServerConfig, ServerThread

SYSTEM = "You are a careful coding agent working in a small repository. Answer in one or two short sentences."


def percentile(xs: List[float], q: float) -> float:
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))
    return xs[k]


def first_difference(a: List[str], b: List[str]) -> dict:
    """Where two runs of one conversation part: the turn and the common text before it (a near-tie
    split shows as a late turn after a long common prefix; a leak as an early, unrelated reply)."""
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    x, y = (a[k] if k < len(a) else ""), (b[k] if k < len(b) else "")
    common = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
    return {"turn": k, "common_chars": common, "alone": x, "under_load": y}


def kv_drift(engine, conv) -> "float | None":
    """max |delta logit| between ``conv``'s live sequence one token further (a fork of its cells) and a fresh
    prefill of the same tokens; None when the conversation has no live session (offloaded or gone)."""
    if conv is None or not conv.lock.acquire(timeout=60):
        return None
    try:
        if conv.session is None:
            return None
        seq = conv.session.sequence
        toks = seq.tokens + [seq.tokens[-1]]
        fork = seq.fork()
        try:
            fork.append(toks[-1:])
            live = fork.logits()
        finally:
            fork.close()
        fresh = engine.sequence(toks)
        try:
            return float(np.max(np.abs(live - fresh.logits())))
        finally:
            fresh.close()
    finally:
        conv.lock.release()


def conversation(http: httpx.Client, cid: str, turns: int, offset: int, max_tokens: int) -> dict:
    """One agent conversation; its replies, latencies and the events the server reported."""
    msgs = [{"role": "system", "content": SYSTEM}]
    replies, lat, events = [], [], []
    for i, (user, tool, args, result) in enumerate(_script(turns + offset)[offset:]):
        call = {"id": f"call_{cid}_{i}", "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}
        msgs += [{"role": "user", "content": f"[{cid}] {user}"},
                 {"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": call["id"], "content": result}]
        t0 = time.perf_counter()
        r = http.post("/chat/completions", headers={"X-Session-Id": cid},
                      json={"model": "local", "messages": msgs, "max_tokens": max_tokens, "temperature": 0,
                            "tools": TOOLS})
        lat.append((time.perf_counter() - t0) * 1000.0)
        if r.status_code != 200:
            raise AssertionError(f"{cid} turn {i}: HTTP {r.status_code}: {r.text[:300]}")
        body = r.json()
        choice = body["choices"][0]
        assert choice["finish_reason"] in ("stop", "length", "tool_calls"), body
        msg = choice["message"]
        assert msg["role"] == "assistant" and (msg.get("content") is not None or msg.get("tool_calls")), body
        replies.append(msg.get("content") or json.dumps(msg.get("tool_calls")))
        events += body.get("pykvcompact", {}).get("events", [])
        msgs.append({"role": "assistant", "content": msg.get("content") or ""})
    return {"replies": replies, "latency_ms": lat,
            "rebased": sum(1 for e in events if e.get("event") == "rebased"),
            "dropped": sum(1 for e in events if e.get("event") == "dropped")}


def run(engine, *, conversations: int = 8, turns: int = 10, window: int = 512, mode: str = "hard",
        max_tokens: int = 16, history_dir=None, timeout_s: float = 600.0) -> dict:
    history_dir = history_dir or tempfile.mkdtemp(prefix="pykvcompact-load-")
    cfg = ServerConfig(model=getattr(engine, "model_name", "local"), host="127.0.0.1", port=0, n_ctx=engine.n_ctx,
                       window=window, mode=mode, history_dir=str(history_dir), summary_max_tokens=window // 8)
    ids = [f"load-{k}" for k in range(conversations)]
    with ServerThread(cfg, engine) as srv:
        http = httpx.Client(base_url=srv.base_url, timeout=timeout_s)
        t0 = time.perf_counter()
        alone = {}
        for k, cid in enumerate(ids):  # then deleted: the same ids run again under load (same history paths)
            alone[cid] = conversation(http, cid, turns, k, max_tokens)
            http.delete(f"/sessions/{cid}")
        alone_s = time.perf_counter() - t0
        together, errors = {}, []
        start = threading.Barrier(conversations)

        def one(k, cid):
            try:
                start.wait(timeout=60)
                together[cid] = conversation(httpx.Client(base_url=srv.base_url, timeout=timeout_s),
                                             cid, turns, k, max_tokens)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(f"{cid}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=one, args=(k, cid)) for k, cid in enumerate(ids)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        # A conversation is bounded by its requests' timeouts (turns x timeout_s): one still running after
        # that is hung. (A join of timeout_s each counted slow conversations on a loaded CPU as hung.)
        deadline = t0 + turns * timeout_s + 60.0
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.perf_counter()))
        load_s = time.perf_counter() - t0
        hung = sum(t.is_alive() for t in threads)
        drift = {cid: kv_drift(engine, srv.registry.get(cid)) for cid in ids if not hung}
        for cid in ids:
            http.delete(f"/sessions/{cid}")
        stats = engine.stats()
    lat_alone = [x for c in alone.values() for x in c["latency_ms"]]
    lat_load = [x for c in together.values() for x in c["latency_ms"]]
    equal = [cid for cid in ids if cid in together and together[cid]["replies"] == alone[cid]["replies"]]
    return {
        "conversations": conversations, "turns": turns, "window": window, "mode": mode, "max_tokens": max_tokens,
        "errors": errors, "hung": hung,
        "equal_to_alone": len(equal),
        "differing": {cid: first_difference(alone[cid]["replies"], together[cid]["replies"])
                      for cid in ids if cid in together and cid not in equal},
        "unfinished": [cid for cid in ids if cid not in together],
        "kv_drift": drift,
        "requests": len(lat_load),
        "latency_ms_alone": {"p50": round(statistics.median(lat_alone), 1), "p99": round(percentile(lat_alone, 0.99), 1)},
        "latency_ms_load": ({"p50": round(statistics.median(lat_load), 1), "p99": round(percentile(lat_load, 0.99), 1)}
                            if lat_load else None),
        "wall_s": {"alone_one_after_another": round(alone_s, 1), "all_at_once": round(load_s, 1)},
        "rebased_per_conversation": [together[c]["rebased"] for c in ids if c in together],
        "dropped": sum(c["dropped"] for c in together.values()),
        "leaked": {"live_sequences": stats["live_sequences"], "used_cells": engine.used_cells()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--modes", default="hard,background")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--n-threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    eng = pk.Engine(a.model, n_ctx=a.window * (a.conversations + 2) * 2, n_seq_max=min(256, 4 * (2 * a.conversations + 2)),
                    n_threads=a.n_threads)
    try:
        out = {"model": a.model, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "n_ctx": eng.n_ctx,
               "runs": {m: run(eng, conversations=a.conversations, turns=a.turns, window=a.window, mode=m,
                               max_tokens=a.max_tokens) for m in a.modes.split(",")}}
    finally:
        eng.close()
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
