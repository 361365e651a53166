"""The load test of issue 10 in CI (bench/load.py): 8 agent conversations at once against the server on
loopback, long enough to compact, on the tiny float model: every response well formed, each live
sequence's KV state equal to a fresh prefill of its tokens (no stale or foreign cells), the
greedy replies of most conversations equal to their replies alone, no sequence or cell left afterwards."""
from __future__ import annotations

import pykvcompact as pk

# float model, flash attention off: after this run a live sequence and a fresh prefill of its tokens
# differed by 1e-6..5e-5 (placement noise, 8 runs); one wrong token in a context moves the logits by
# more than 1e-3 (test_engine_basics.test_tiny_model_is_sensitive_to_the_whole_context)
KV_ATOL = 5e-4


def test_eight_conversations_at_once_equal_their_solo_runs_and_leak_nothing(tiny_model_path, tmp_path):
    from bench.load import run

    eng = pk.Engine(tiny_model_path, n_ctx=16384, n_seq_max=64, n_threads=1, flash_attn=False)
    try:
        r = run(eng, conversations=8, turns=8, window=1024, mode="hard", max_tokens=8, history_dir=tmp_path,
                timeout_s=300)
    finally:
        eng.close()
    assert not r["errors"] and r["hung"] == 0, r["errors"]
    assert r["requests"] == 8 * 8
    assert all(n >= 1 for n in r["rebased_per_conversation"]), r  # long enough to compact
    assert r["dropped"] == 0
    assert len(r["kv_drift"]) == 8 and all(d is not None and d < KV_ATOL for d in r["kv_drift"].values()), r["kv_drift"]
    # Replies are not bit-exact under load: batch composition moves the float sums, and a greedy reply can
    # split late at a near-tie (measured: 3 of 15 runs had 1-2 of 8 conversations split, at turns 1-7;
    # docs/architecture.md, llama.cpp PR #6950). The KV check above catches a sequence whose cells disagree with its own tokens
    # (stale or foreign cells); a token routed into the wrong sequence becomes part of that sequence's
    # tokens and passes it, but it changes that conversation's later replies, and most must stay equal.
    assert r["equal_to_alone"] >= 5, r["differing"]
    assert r["leaked"] == {"live_sequences": 0, "used_cells": 0}
