"""Session.idle: while the agent's tool runs, background mode advances its preparation (issue 8: the
evaluation's --tool-latency)."""
from __future__ import annotations

import time

import pytest

import pykvcompact as pk
from pykvcompact import errors

from fake_engine import FakeEngine


def call(i):
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}}]}


def session(tmp_path, mode="background"):
    eng = FakeEngine(n_ctx=8192)
    s = pk.Session(eng, system="sys", history_dir=tmp_path, session_id="idle",
                   policy=pk.Policy(mode=mode, window=1000, compact_tool=False, history_tool=False,
                                    summary_max_tokens=64))
    return eng, s


def fill_to_preparation(s):
    i = 0
    while s._compactor.prep is None:
        s.chat([call(i), {"role": "tool", "tool_call_id": f"c{i}", "content": " ".join(f"x{i}_{k}" for k in range(40))}],
               max_tokens=8)
        i += 1
        assert i < 50
    return i


def test_idle_lets_the_preparation_catch_up_between_calls(tmp_path):
    eng, s = session(tmp_path)
    eng.bg_polls = 3   # the summary needs a few polls: not ready at once
    fill_to_preparation(s)
    assert s._compactor.prep.state != "caught_up"
    t0 = time.perf_counter()
    s.idle(5.0)
    assert time.perf_counter() - t0 < 4.0          # returned once caught up, not after the whole 5 s
    assert s._compactor.prep.state == "caught_up"
    s.idle(0.5)                                    # nothing left to do: returns at once
    assert [e.name for e in s.events].count("summary_ready") >= 1


def test_idle_in_a_synchronous_mode_returns_at_once_and_bad_input_is_refused(tmp_path):
    _, s = session(tmp_path, mode="hard")
    t0 = time.perf_counter()
    s.idle(2.0)
    assert time.perf_counter() - t0 < 0.5
    for bad in (-1, float("nan"), "1", True, None):
        with pytest.raises(ValueError, match="seconds"):
            s.idle(bad)
    s.close()
    with pytest.raises(errors.SequenceClosedError):
        s.idle(0.1)


def test_idle_takes_any_real_number(tmp_path):
    import numpy as np
    _, s = session(tmp_path, mode="hard")
    before = s.n_tokens
    t0 = time.perf_counter()
    for seconds in (np.float32(0.01), np.int64(0), 10 ** 400):  # 10**400: as long as it takes
        assert s.idle(seconds) is None
    assert time.perf_counter() - t0 < 5   # nothing to prepare in hard mode: each returns at once
    assert s.n_tokens == before and not s._calls.busy   # the session is untouched and free for the next call
    assert s.chat("hi", max_tokens=4)["choices"][0]["message"]["role"] == "assistant"


def test_idle_on_a_closed_engine_raises_like_the_other_calls(tiny_model_path, tmp_path):
    eng = pk.Engine(tiny_model_path, n_ctx=2048, n_seq_max=4)
    s = pk.Session(eng, history_dir=tmp_path, policy=pk.Policy(mode="background", window=512, compact_tool=False,
                                                               history_tool=False))
    s.idle(0.01)
    eng.close()
    with pytest.raises(errors.EngineClosedError):
        s.idle(0.1)


def test_the_pace_counts_added_messages_and_the_time_between_calls(tmp_path):
    _, s = session(tmp_path)
    meter = s._compactor.meter
    s.add([call(0), {"role": "tool", "tool_call_id": "c0", "content": " ".join(f"x{k}" for k in range(60))}])
    time.sleep(0.05)   # the caller's own time counts: the window edge comes in wall time
    s.chat([], max_tokens=8)
    (added, t_add), (replied, t_reply) = meter._paced[-2:]
    assert added >= 60 and 0 < replied <= 40
    assert t_reply >= 0.05
    assert meter.rates().growth_tok_s == pytest.approx((added + replied) / (t_add + t_reply))
