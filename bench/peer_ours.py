"""Worker for bench/peer.py: one round of every figure on pykvcompact (ours), in its own process.

    python bench/peer_ours.py JOB.json OUT.json      (bench/peer.py writes JOB.json and reads OUT.json)

JOB.json holds the token transcript and the sizes; OUT.json gets one sample per figure. Launched
through /tmp/pkv_before/run_before.py when bench/peer.py runs with --before (PKV_IMPL=before).
"""

from __future__ import annotations

import json
import sys
import time

import pykvcompact as pk


def now_ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def refresh(seq, toks: list[int], n: int) -> None:
    """Make seq hold toks[:n] with fresh next-token logits (untimed): drop the rest, re-decode the last."""
    seq.truncate(n - 1)
    seq.append([toks[n - 1]])


def decode_ms_per_token(seq, toks: list[int], n: int, n_gen: int) -> float:
    refresh(seq, toks, n)
    t0 = time.perf_counter()
    out = seq.generate(n_gen, temperature=0.0)
    return now_ms(t0) / max(1, len(out))


def fig_decode(seq, J, L: int, out: dict) -> None:
    out[f"decode_ms_per_token_{L}"] = decode_ms_per_token(seq, J["transcript"], L, J["n_gen"])


def fig_probe(seq, J, L: int, out: dict) -> None:
    t0 = time.perf_counter()
    seq.probe(J["probe"], labels=tuple(J["labels"]))
    out[f"probe_ms_{L}"] = now_ms(t0)
    out[f"probe_method_{L}"] = getattr(seq, "last_probe", {}).get("method")


def fig_background(seq, J, L: int, out: dict) -> None:
    """Main-sequence decode during a background summary on a fork, against solo decode, adjacent."""
    toks, n_gen = J["transcript"], J["n_gen"]
    solo = decode_ms_per_token(seq, toks, L, n_gen)
    with seq.fork() as fork:
        fork.append(J["summarizer_prompt"])
        refresh(seq, toks, L)
        job = fork.generate_background(J["bg_tokens"])
        t0 = time.perf_counter()
        gen = seq.generate(n_gen, temperature=0.0)
        during = now_ms(t0) / max(1, len(gen))
        bg_done_early = job.done()
        bg_tokens = len(job.tokens)
        job.cancel()
        deadline = time.monotonic() + 120
        while not job.done() and time.monotonic() < deadline:
            time.sleep(0.01)
    out["bg_solo_ms_per_token"] = solo
    out["bg_during_ms_per_token"] = during
    out["bg_speed_ratio"] = solo / during
    out["bg_tokens_during"] = bg_tokens
    out["bg_finished_before_main"] = bool(bg_done_early)


def summarize(seq, J) -> list[int]:
    """The greedy summary of ``seq`` on a fork (dropped after)."""
    with seq.fork() as f:
        f.append(J["summarizer_prompt"])
        return f.generate(J["summary_tokens"], temperature=0.0)


def fig_compaction(seq, J, out: dict) -> None:
    """Blocking compaction of the conversation's own sequence (the only one alive, as the peer's one cache
    is), waited on: the summary on a fork of the history, then the rebuild as a session does it when
    nothing was prepared (``compaction_ms``: truncate to the system prompt, append summary and tail;
    compaction/swap.py) and, on a fresh copy, as a prepared rebase (``compaction_prepared_ms``:
    prepare_rebase + commit_rebase, the new rows built beside the old history)."""
    H, sys_len = J["history_len"], J["system_len"]
    toks, keep_from = J["transcript"], H - J["tail_len"]
    seq.truncate(H)
    t0 = time.perf_counter()
    summary = summarize(seq, J)
    t1 = time.perf_counter()
    seq.truncate(sys_len)
    seq.append(list(summary) + toks[keep_from:H])
    out["compaction_ms"] = now_ms(t0)
    out["compaction_summary_ms"] = (t1 - t0) * 1000.0
    out["compaction_rebase_ms"] = now_ms(t1)
    out["compaction_summary_len"] = len(summary)
    out["compaction_tokens_after"] = len(seq)
    seq.truncate(0)
    seq.append(toks[:H])
    t2 = time.perf_counter()
    summary = summarize(seq, J)
    rb = seq.prepare_rebase(sys_len, summary, keep_from)
    seq.commit_rebase(rb)
    out["compaction_prepared_ms"] = now_ms(t2)


def fig_swap(seq, J, out: dict) -> None:
    """Prepared swap: rebase prepared in the background, a few tokens appended, then commit (stall)."""
    toks, H, sys_len = J["transcript"], J["history_len"], J["system_len"]
    keep_from = H - J["tail_len"]
    hist = seq.fork()
    hist.truncate(H)
    try:
        t0 = time.perf_counter()
        rb = hist.prepare_rebase(sys_len, J["fixed_summary"], keep_from)
        rb.wait()
        out["swap_prepare_until_ready_ms"] = now_ms(t0)
        hist.append(toks[H:H + J["swap_new_tokens"]])
        t1 = time.perf_counter()
        info = hist.commit_rebase(rb)
        out["swap_ms"] = now_ms(t1)
        out["swap_engine_stall_ms"] = info["stall_ms"]
        out["swap_catch_up_tokens"] = info["catch_up_tokens"]
    finally:
        hist.close()


def main(job_path: str, out_path: str) -> None:
    J = json.load(open(job_path))
    toks, (L1, L3) = J["transcript"], J["contexts"]
    t0 = time.perf_counter()
    kw = dict(n_ctx=J["n_ctx_ours"], n_seq_max=8, n_threads=J["n_threads"], flash_attn=bool(J.get("flash_attn")),
              use_extra_bufts=bool(J.get("use_extra_bufts", False)))
    eng = pk.Engine(J["model"], **kw)
    out = {"load_ms": now_ms(t0)}
    info = {"impl_file": pk.__file__, "version": getattr(pk, "__version__", None), "n_ctx": eng.n_ctx,
            "n_threads": eng.n_threads, "engine_kwargs": kw}
    seq = eng.sequence(toks[:L1])
    fig_decode(seq, J, L1, out)
    fig_probe(seq, J, L1, out)
    fig_background(seq, J, L1, out)
    refresh(seq, toks, L1)
    seq.append(toks[L1:L3])
    fig_decode(seq, J, L3, out)
    fig_probe(seq, J, L3, out)
    fig_swap(seq, J, out)
    fig_compaction(seq, J, out)   # last: it rebases the sequence itself
    seq.close()
    info["stats"] = {k: v for k, v in eng.stats().items() if k != "tokens_per_sequence"}
    eng.close()
    json.dump({"samples": out, "info": info}, open(out_path, "w"), indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
