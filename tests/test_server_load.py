"""The load test of issue 10 in CI (bench/load.py): 8 agent conversations at once against the server on
loopback, long enough to compact, on the tiny float model: every response well formed, each
conversation's greedy replies equal to its replies alone, no sequence or cell left afterwards."""
from __future__ import annotations

import pykvcompact as pk


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
    assert r["equal_to_alone"] == 8, r["differing"]
    assert r["leaked"] == {"live_sequences": 0, "used_cells": 0}
