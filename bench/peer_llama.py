"""Worker for bench/peer.py: one round of every figure on llama-cpp-python's ``Llama`` (the peer),
in its own process, used the way an agent harness uses it.

    python bench/peer_llama.py JOB.json OUT.json

``Llama`` keeps one KV sequence and reuses the longest cached prefix of a new prompt (``generate``
compares ``input_ids`` with the prompt, ``kv_cache_seq_rm``s the rest and evaluates only the suffix);
``eval`` first drops every cell at or after ``n_tokens``, so rolling back is ``n_tokens = k``.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import llama_cpp
import numpy as np

from pykvcompact.remote.llama_cpp_peer import load_llama


def now_ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def make_llama(J, n_ctx: int) -> llama_cpp.Llama:
    """The peer, with ggml's extra buffer types as our Engine has them (off unless the job asks)."""
    return load_llama(J["model_path"], use_extra_bufts=bool(J.get("use_extra_bufts", False)), n_ctx=n_ctx,
                      n_threads=J["n_threads"], n_threads_batch=J["n_threads"], n_batch=512, flash_attn=bool(J.get("flash_attn")),
                      verbose=False)


def refresh(llm, toks: list[int], n: int) -> None:
    """Make the cache hold toks[:n] with fresh logits (untimed): keep the prefix, re-decode the last."""
    if llm.n_tokens >= n - 1 and list(llm.input_ids[:n - 1]) == toks[:n - 1]:
        llm.n_tokens = n - 1
        llm.eval([toks[n - 1]])
    else:
        llm.reset()
        llm.eval(toks[:n])


def greedy(llm, prompt: list[int], n: int, decode_last: bool = False) -> list[int]:
    """What a harness gets from Llama.generate with greedy sampling; stops at end-of-generation.
    ``decode_last`` also decodes the last token, as our engine does (one decode per token)."""
    out = []
    vocab = llm._model.vocab
    for tok in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
        if llama_cpp.llama_vocab_is_eog(vocab, tok):
            break
        out.append(tok)
        if len(out) >= n:
            break
    if decode_last and out:
        llm.eval([out[-1]])
    return out


def decode_ms_per_token(llm, toks: list[int], n: int, n_gen: int) -> float:
    refresh(llm, toks, n)
    t0 = time.perf_counter()
    out = greedy(llm, toks[:n], n_gen, decode_last=True)
    return now_ms(t0) / max(1, len(out))


def fig_decode(llm, J, L: int, out: dict) -> None:
    out[f"decode_ms_per_token_{L}"] = decode_ms_per_token(llm, J["transcript"], L, J["n_gen"])


def fig_probe(llm, J, L: int, out: dict) -> None:
    """The same question on the cached prefix: evaluate the probe, read the label logits, roll back."""
    refresh(llm, J["transcript"], L)
    firsts = [lt[0] for lt in J["label_tokens"]]
    t0 = time.perf_counter()
    llm.eval(J["probe"])
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),))
    m = float(logits.max())
    logp = logits - (m + np.log(np.exp(logits - m).sum()))
    _scores = [float(logp[f]) for f in firsts]
    llm.n_tokens = L
    llm._ctx.kv_cache_seq_rm(-1, L, -1)
    out[f"probe_ms_{L}"] = now_ms(t0)


def fig_background(llm, J, L: int, out: dict) -> None:
    """Main decode while a second Llama generates a summary in another thread, against solo decode."""
    toks, n_gen = J["transcript"], J["n_gen"]
    solo = decode_ms_per_token(llm, toks, L, n_gen)
    bg = make_llama(J, J["n_ctx_peer_bg"])
    bg_prompt = toks[:L] + J["summarizer_prompt"]
    bg.eval(bg_prompt)
    started, stop, count = threading.Event(), threading.Event(), [0]

    def run_bg():
        for _tok in bg.generate(bg_prompt, temp=0.0, top_k=1, repeat_penalty=1.0):
            count[0] += 1
            started.set()
            if stop.is_set() or count[0] >= J["bg_tokens"]:
                break
        started.set()

    th = threading.Thread(target=run_bg, daemon=True)
    refresh(llm, toks, L)
    th.start()
    started.wait(120)
    t0 = time.perf_counter()
    gen = greedy(llm, toks[:L], n_gen, decode_last=True)
    during = now_ms(t0) / max(1, len(gen))
    bg_done_early = not th.is_alive()
    stop.set()
    th.join(120)
    out["bg_solo_ms_per_token"] = solo
    out["bg_during_ms_per_token"] = during
    out["bg_speed_ratio"] = solo / during
    out["bg_tokens_during"] = count[0]
    out["bg_finished_before_main"] = bool(bg_done_early)
    bg.close()


def fig_compaction(llm, J, out: dict) -> None:
    """Summary on the cached history (prefix reuse), then the re-prefill of [system][summary][tail]."""
    toks, H, sys_len = J["transcript"], J["history_len"], J["system_len"]
    refresh(llm, toks, H)
    t0 = time.perf_counter()
    summary = greedy(llm, toks[:H] + J["summarizer_prompt"], J["summary_tokens"])
    t1 = time.perf_counter()
    reprefill(llm, toks[:sys_len] + summary + toks[H - J["tail_len"]:H])
    out["compaction_ms"] = now_ms(t0)
    out["compaction_summary_ms"] = (t1 - t0) * 1000.0
    out["compaction_rebase_ms"] = now_ms(t1)
    out["compaction_summary_len"] = len(summary)
    out["compaction_tokens_after"] = llm.n_tokens


def reprefill(llm, new: list[int]) -> None:
    """The swap as a harness pays it: a new prompt whose only cached prefix is the system prompt."""
    n = 0
    while n < min(llm.n_tokens, len(new)) and llm.input_ids[n] == new[n]:
        n += 1
    llm.n_tokens = n
    llm.eval(new[n:])


def fig_swap(llm, J, out: dict) -> None:
    toks, H, sys_len = J["transcript"], J["history_len"], J["system_len"]
    # The cache holds [system][...] (what it holds after the system prompt does not change the cost:
    # eval drops every cell past the reused prefix first).
    assert list(llm.input_ids[:sys_len]) == toks[:sys_len]
    t0 = time.perf_counter()
    reprefill(llm, toks[:sys_len] + J["fixed_summary"] + toks[H - J["tail_len"]:H + J["swap_new_tokens"]])
    out["swap_ms"] = now_ms(t0)


def main(job_path: str, out_path: str) -> None:
    J = json.load(open(job_path))
    toks, (L1, L3) = J["transcript"], J["contexts"]
    t0 = time.perf_counter()
    llm = make_llama(J, J["n_ctx_peer"])
    out = {"load_ms": now_ms(t0)}
    info = {"impl_file": llama_cpp.__file__, "version": llama_cpp.__version__, "n_ctx": llm.n_ctx(),
            "n_threads": J["n_threads"], "flash_attn": bool(J.get("flash_attn"))}
    llm.eval(toks[:L1])
    fig_decode(llm, J, L1, out)
    fig_probe(llm, J, L1, out)
    fig_background(llm, J, L1, out)
    refresh(llm, toks, L1)
    llm.eval(toks[L1:L3])
    fig_decode(llm, J, L3, out)
    fig_probe(llm, J, L3, out)
    fig_compaction(llm, J, out)
    fig_swap(llm, J, out)
    llm.close()
    json.dump({"samples": out, "info": info}, open(out_path, "w"), indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
