"""RemoteEngine against an OpenAI-compatible server: what the server's prefix cache and the warm-up request
buy, side by side in one run (interleaved per repeat, so load drift hits every column alike).

1. Probe cost: ``seq.probe(rubric)`` on a context of ``--context`` tokens
   - ``cached``: the context was the server's last prompt (the conversation's previous request): only
     the rubric is prefilled;
   - ``uncached``: the server's cache does not hold it.  By default an unrelated request is sent first
     (``--no-cache evict``: on a one-slot server, llama-cpp-python's, that empties the cache); on
     llama-server use ``--no-cache cache_prompt`` (``cache_prompt: false`` on the probe itself).
2. The stall at a swap (``commit_rebase``: one timed ``max_tokens=1`` request on the new context):
   - ``warm``: the prepared rebase's warm-up request ran just before the swap;
   - ``cold``: no warm-up (``RemoteEngine(warm_rebase=False)``): the swap pays the prefill of the
     summary and the recent turns;
   - ``evicted``: a warm-up, then one request of the conversation before the swap: on a one-slot server
     that evicts the warm-up (what happens in a session between the preparation and the commit).

Without ``--base-url`` it starts llama-cpp-python's server on ``--model`` (a GGUF or a registry name) on a
free loopback port, and stops it at the end.

    python bench/remote.py --repeats 7 --out bench/results/remote-smollm2-135m.json
"""
from __future__ import annotations

import argparse
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import pykvcompact as pk
from pykvcompact.chat.template import ChatTemplate
from pykvcompact.remote.llama_cpp_peer import server_command
from pykvcompact.compaction.rubrics import load as load_rubric
from pykvcompact.compaction.prober import PROBE_PROMPT

# run as a script only bench/ is on the path: the checkout goes at its end, so that pykvcompact stays the
# installed package
sys.path.append(str(pathlib.Path(__file__).resolve().parents[1]))
from bench.common import write_result  # noqa: E402


def start_server(model: str, threads: int, n_ctx: int):
    path = str(pk.resolve_model(model))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(os.path.join(tempfile.mkdtemp(prefix="pykvcompact-remote-bench-"), "server.log"), "wb")
    # through our launcher: ggml's extra buffer types off, as in Engine (AMX CPUs crash without it)
    cmd = server_command(["--model", path, "--model_alias", "bench", "--host", "127.0.0.1", "--port", str(port),
                          "--n_ctx", str(n_ctx), "--n_threads", str(threads), "--n_threads_batch", str(threads),
                          "--interrupt_requests", "false"])
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    from pykvcompact.remote.http import HttpClient
    http = HttpClient(url, timeout=5, connect_timeout=1)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}; see {log.name}")
        try:
            http.get("/v1/models")
            return proc, url
        except pk.RemoteError:
            if time.monotonic() > deadline:
                proc.terminate()
                raise SystemExit(f"the server did not answer within 120 s; see {log.name}")
            time.sleep(0.2)


def conversation(tpl: ChatTemplate, eng, r: int, n_tokens: int):
    """``(tokens, prefix_tokens, message_starts)`` of a ChatML conversation of about ``n_tokens``; ``r``
    makes each repeat's text (so its cache entries) its own."""
    msgs = [{"role": "system", "content": f"You are a concise assistant (run {r})."}]
    prefix = len(eng.tokenize(tpl.render(msgs)))
    i = 0
    while True:
        rows = "\n".join(f"row {i}.{k}: value={i * 10 + k + r} status=ok" for k in range(6))
        msgs += [{"role": "user", "content": f"Step {i}. Output of the last command:\n{rows}\nValue of row {i}.3?"},
                 {"role": "assistant", "content": f"The value in row {i}.3 is {i * 10 + 3 + r}."}]
        toks = eng.tokenize(tpl.render(msgs))
        if len(toks) >= n_tokens:
            return toks, prefix, msgs
        i += 1


def summary_tokens(eng, n: int):
    base = ("Standing instructions: be concise. Goal: read the command outputs and answer about rows. "
            "Verified facts: each row i.k has value 10*i+k; all statuses ok. Next step: continue. ")
    toks = eng.tokenize(base)
    while len(toks) < n:
        toks += toks
    return toks[:n]


def probe_tokens(tpl: ChatTemplate, eng, msgs):
    q = {"role": "user", "content": PROBE_PROMPT.format(rubric=load_rubric("default"))}
    full, base = tpl.render(msgs + [q], None, True), tpl.render(msgs)
    return eng.tokenize(full[len(base):])


def evict(eng, r: int) -> None:
    s = eng.sequence(eng.tokenize(f"Unrelated text {r}: the quick brown fox."))
    s.generate(1)
    s.close()


def one_repeat(eng, eng_cold, eng_nc, tpl, args, r: int) -> dict:
    out = {}
    toks, prefix, msgs = conversation(tpl, eng, r, args.context)
    rubric = probe_tokens(tpl, eng, msgs)
    main = eng.sequence(toks)
    # -- probe with the context cached (the conversation's previous request was on it)
    main.fork().generate(1)
    t0 = time.perf_counter()
    main.probe(rubric)
    out["probe_cached_ms"] = (time.perf_counter() - t0) * 1000.0
    # -- probe with nothing cached
    if eng_nc is None:
        evict(eng, r)
        t0 = time.perf_counter()
        main.probe(rubric)
    else:  # the probe's own request says cache_prompt: false
        s = eng_nc.sequence(toks)
        t0 = time.perf_counter()
        s.probe(rubric)
        s.close()
    out["probe_uncached_ms"] = (time.perf_counter() - t0) * 1000.0
    # -- the swap
    keep_from = int(len(toks) * (1 - args.recent))
    repl = summary_tokens(eng, args.summary)
    out["rebased_tokens"] = prefix + len(repl) + len(toks) - keep_from
    for name, e in (("warm", eng), ("cold", eng_cold), ("evicted", eng)):
        seq = e.sequence(toks)
        seq.fork().generate(1)                      # the conversation's last request: its context cached
        rb = seq.prepare_rebase(prefix, repl, keep_from)
        rb.wait()
        if name == "warm":
            out["warmup_ms"] = rb.warmup_ms
        if name == "evicted":
            seq.fork().generate(1)                  # one more request of the conversation before the swap
        info = seq.commit_rebase(rb)
        out[f"stall_{name}_ms"] = info["stall_ms"]
        seq.close()
    main.close()
    return out


def summarize(xs):
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) >= 2 else [xs[0]] * 3
    return {"median": round(statistics.median(xs), 1), "min": round(xs[0], 1), "max": round(xs[-1], 1),
            "p25": round(q[0], 1), "p75": round(q[2], 1), "values": [round(x, 1) for x in xs]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default=None, help="an OpenAI-compatible server (default: start llama-cpp-python's)")
    ap.add_argument("--model", default="smollm2-135m", help="the GGUF (path or registry name) for the started server")
    ap.add_argument("--model-name", default="bench", help="the model's name on the server")
    ap.add_argument("--tokenizer", default=None, help="GGUF path or registry name (default: --model; 'server': its endpoints)")
    ap.add_argument("--context", type=int, default=1500, help="tokens of the conversation probed and rebased")
    ap.add_argument("--summary", type=int, default=96, help="tokens of the summary in the rebased context")
    ap.add_argument("--recent", type=float, default=0.25, help="share of the context kept raw after the summary")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-cache", choices=("evict", "cache_prompt"), default="evict")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    proc = None
    if args.base_url is None:
        proc, args.base_url = start_server(args.model, args.threads or pk.physical_cores(), args.n_ctx)
    tok = args.tokenizer or args.model
    tok = None if tok == "server" else tok
    try:
        eng = pk.RemoteEngine(args.base_url, args.model_name, tokenizer=tok, n_ctx=args.n_ctx)
        eng_cold = pk.RemoteEngine(args.base_url, args.model_name, tokenizer=tok, n_ctx=args.n_ctx, warm_rebase=False)
        eng_nc = (pk.RemoteEngine(args.base_url, args.model_name, tokenizer=tok, n_ctx=args.n_ctx, cache_prompt=False)
                  if args.no_cache == "cache_prompt" else None)
        tpl = ChatTemplate()
        runs = []
        for r in range(args.repeats):
            runs.append(one_repeat(eng, eng_cold, eng_nc, tpl, args, r))
            print(f"repeat {r}: " + "  ".join(f"{k} {v:.0f}" for k, v in runs[-1].items() if v is not None),
                  file=sys.stderr)
        toks, _, msgs = conversation(tpl, eng, 0, args.context)
        result = {
            "server": "llama-cpp-python (started here)" if proc is not None else args.base_url,
            "dialect": eng.dialect, "model": args.model if proc is not None else args.model_name,
            "context_tokens": len(toks), "rubric_tokens": len(probe_tokens(tpl, eng, msgs)),
            "summary_tokens": args.summary, "rebased_tokens": runs[0]["rebased_tokens"], "repeats": args.repeats,
            "no_cache": args.no_cache, "threads": args.threads or pk.physical_cores(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": f"{os.cpu_count()}-core CPU",
            "probe_ms": {"cached": summarize([x["probe_cached_ms"] for x in runs]),
                         "uncached": summarize([x["probe_uncached_ms"] for x in runs])},
            "swap_stall_ms": {k: summarize([x[f"stall_{k}_ms"] for x in runs]) for k in ("warm", "cold", "evicted")},
            "warmup_ms": summarize([x["warmup_ms"] for x in runs if x.get("warmup_ms") is not None]),
        }
        for e in (eng, eng_cold, eng_nc):
            if e is not None:
                e.close()
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(write_result(result, args.out))
    return result


if __name__ == "__main__":
    main()
