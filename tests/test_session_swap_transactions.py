"""The swap is a transaction, and what surrounds it: one test per defect once found in session.py.
Bug 7 (thresholds) is also covered in test_policy.py; bug 11 (an assertion that could not fail) was fixed
in test_session_logic.py::test_chat_response_shape_and_stream."""
from __future__ import annotations

import json

import pytest

import pykvcompact as pk
from pykvcompact import errors, events
from pykvcompact.compaction.tools import compact as compaction_tool

from fake_engine import FakeEngine, default_responder
from test_session_logic import check_invariants, make, names, user_msg


def fill_to(s, tokens, start=0):
    i = start
    while len(s.tokens) < tokens:
        assert i < start + 200, "the session never reached the fill"
        s.chat(user_msg(i), max_tokens=16)
        i += 1
    return i


def test_bug1_blocking_commit_after_timed_out_attempts_falls_back(tmp_path):
    """A blocking commit whose summary attempts timed out raised TypeError (len(None))."""
    eng, s = make("background", tmp_path=tmp_path, soft=0.8, hard=0.84)
    fill_to(s, 250)
    eng.bg_polls = 10 ** 6
    s.summarizer.faults = ["timeout", "timeout"]
    e = s.compact()
    assert isinstance(e, events.Rebased) and e.fallback and not e.prepared
    assert [x.reason for x in s.events if x.name == "summary_failed"][-2:] == ["timeout", "timeout"]
    check_invariants(s)


def test_bug2_the_swap_is_a_transaction(tmp_path, monkeypatch):
    """A failed swap left the session dead (live sequence closed first) and the replaced messages
    offloaded while still live (a retry wrote them twice)."""
    eng, s = make("hard", tmp_path=tmp_path)
    fill_to(s, 300)
    before_tokens, before_msgs = s.tokens, s.messages
    from fake_engine import FakeSeq

    def no_rebase(self, *a, **k):
        raise errors.EngineError("injected: no slot for the rebase")

    def no_sequence(*a, **k):
        raise errors.SlotsExhaustedError("injected: all sequence slots are in use")
    monkeypatch.setattr(FakeSeq, "prepare_rebase", no_rebase)
    monkeypatch.setattr(eng, "sequence", no_sequence)
    with pytest.raises(errors.SlotsExhaustedError):
        s.compact()
    assert not s.sequence.closed and s.tokens == before_tokens and s.messages == before_msgs
    assert s.offloaded == []
    check_invariants(s)
    monkeypatch.undo()
    assert isinstance(s.compact(), events.Rebased)  # the retry works...
    text = s.history.read()
    first_user = user_msg(0)
    assert text.count(first_user) == 1              # ...and writes each message once
    check_invariants(s)
    s.chat("still alive?", max_tokens=8)


def test_bug3_parallel_tool_calls_are_never_split(tmp_path):
    """With keep_recent=0 a tool call could be compacted while one of its results stayed live."""
    eng, s = make("hard", tmp_path=tmp_path, keep_recent=0.0)
    fill_to(s, 200)
    calls = [{"id": f"c{k}", "type": "function", "function": {"name": "read", "arguments": "{}"}} for k in "ab"]
    s.add([{"role": "user", "content": "read both"}, {"role": "assistant", "content": None, "tool_calls": calls},
           {"role": "tool", "tool_call_id": "ca", "content": "result a " * 10}])
    s.compact()
    s.add([{"role": "tool", "tool_call_id": "cb", "content": "result b"}])
    live = s.messages
    k = next(i for i, m in enumerate(live) if m.get("tool_call_id") == "cb")
    assert any(m.get("tool_calls") for m in live[:k])   # its call is still live
    check_invariants(s)


def test_bug4_a_summary_without_gain_is_remembered(tmp_path):
    """A summary no smaller than what it replaces re-ran on every 16-token chunk."""
    long = "Standing instructions: none\n" + " ".join(f"fact{k}" for k in range(70))
    eng, s = make("hard", tmp_path=tmp_path, window=1000, keep_recent=0.6, summary_max_tokens=150,
                  responder=lambda p: long if "write a summary" in p.rsplit("<|im_start|>user\n", 1)[-1]
                  else default_responder(p))
    s.chat(user_msg(0, words=40), max_tokens=16)  # the task: kept verbatim in every summary
    fill_to(s, s.limits.hard - 40, start=1)
    for i in range(8):
        s.chat(user_msg(100 + i, words=2), max_tokens=48)
    started = names(s).count("summary_started")
    skipped = [e for e in s.events if e.name == "compaction_skipped" and e.reason == "no_gain"]
    assert skipped and started == len(skipped) + names(s).count("rebased")
    assert started <= 4, started


def test_bug5_an_oversize_message_is_refused_before_any_compaction(tmp_path):
    eng, s = make("hard", tmp_path=tmp_path)
    fill_to(s, 300)
    n_events, transcript = len(s.events), s.transcript
    with pytest.raises(pk.session.ContextWindowError):
        s.chat(" ".join(f"w{k}" for k in range(400)), max_tokens=8)
    assert s.events[n_events:] == [] and s.transcript == transcript
    check_invariants(s)


def test_bug6_prepared_means_no_wait(tmp_path):
    """``Rebased.prepared`` was computed before a blocking restart and could say True for a stall."""
    eng, s = make("background", tmp_path=tmp_path, window=1000, keep_recent=0.05, soft=0.45, hard=0.9,
                  early_start=0.0, max_stall_ms=40)
    i = fill_to(s, 300)
    eng.bg_polls = 3   # ready after a few steps...
    s.add([{"role": "user", "content": " ".join(f"r{k}" for k in range(150))}])   # ...then a huge message
    for k in range(12):
        s.add([{"role": "user", "content": user_msg(i + k)}])
    eng.bg_polls = 400  # from now on a summary is late
    for k in range(12, 40):
        s.chat(user_msg(i + k), max_tokens=24)
    reb = [e for e in s.events if e.name == "rebased"]
    assert reb and any(not e.prepared for e in reb)
    # a prepared swap never waited; one onto the deterministic summary is prepared only when the model was
    # not asked at all (no time at the measured pace, issue 8): then nothing was waited for either
    no_time = sum(e.name == "summary_failed" and e.reason == "no_time" for e in s.events)
    for e in reb:
        assert not (e.prepared and e.wait_ms > 0), e
    assert sum(e.prepared and e.fallback for e in reb) <= no_time


def test_bug7_fixed_mode_tool_and_early_rubric_verdicts(tmp_path):
    eng, s = make("fixed", tmp_path=tmp_path, compact_tool=True, window=4000, n_ctx=12000)
    fill_to(s, int(0.25 * s.window))                 # above 0.5 x fixed_at, below fixed_at
    assert s.call_tool() != compaction_tool.NOTHING_TO_COMPACT
    eng, s = make("rubric", tmp_path=tmp_path, probe_fn=lambda t: 0.9, window=2000)
    for i in range(20):  # COMPRESS every time: compacts as soon as the probe floor is passed
        s.chat(user_msg(i), max_tokens=16)
    reb = [e for e in s.events if e.name == "rebased"]
    assert reb and reb[0].trigger == "compress" and reb[0].tokens_before < 0.425 * s.window


def test_bug8_every_probe_is_an_event_and_events_say_what_happened(tmp_path):
    eng, s = make("rubric", tmp_path=tmp_path, probe_fn=lambda t: 0.1)
    s.add([{"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"}])
    assert [e.reason for e in s.events if e.name == "probe_skipped"] == ["below_floor"]
    # a summary with no gain in a synchronous mode: compaction_skipped, not preparation_restarted
    long = "Standing instructions: none\n" + " ".join(f"fact{k}" for k in range(60))
    eng, s = make("hard", tmp_path=tmp_path, summary_max_tokens=128,
                  responder=lambda p: long if "write a summary" in p.rsplit("<|im_start|>user\n", 1)[-1]
                  else default_responder(p))
    fill_to(s, 150)
    assert s.compact() is None
    assert "preparation_restarted" not in names(s) and s.events[-1].name == "compaction_skipped"
    # the tool above its minimum with no cut point: not a refusal
    # (a long system prompt puts the fill above the tool's minimum; nothing lies between it and the call)
    eng, s = make("hard", tmp_path=tmp_path, compact_tool=True, keep_recent=0.5, window=1600,
                  system=" ".join(f"w{k}" for k in range(300)))
    assert s.fill * s.window >= s.limits.tool_min
    s.call_tool()
    assert "tool_refused" not in names(s) and "compaction_skipped" in names(s)


def test_bug9_a_reply_survives_a_failed_close(tmp_path, monkeypatch):
    eng, s = make("hard", tmp_path=tmp_path)
    s.chat("hello", max_tokens=8)
    seq = s.sequence
    real = seq.append
    state = {"gen": False}

    def append(tokens):
        if state["gen"]:
            raise errors.EngineError("injected: append failed")
        return real(tokens)
    real_gen = seq.generate

    def generate(*a, **k):
        out = real_gen(*a, **k)
        state["gen"] = True
        return out
    monkeypatch.setattr(seq, "append", append)
    monkeypatch.setattr(seq, "generate", generate)
    with pytest.raises(errors.EngineError):
        s.chat("another", max_tokens=40)
    last = s.transcript[-1]
    assert last["role"] == "assistant" and last["content"].startswith("Reply number")
    monkeypatch.undo()
    s.chat("and now?", max_tokens=8)
    check_invariants(s)


def test_bug10_compact_in_mode_none_has_cells_for_its_fork(tmp_path):
    eng = FakeEngine(n_ctx=1500)
    s = pk.Session(eng, system="You are a test.", policy=pk.Policy(mode="none", summary_max_tokens=48),
                   history_dir=tmp_path, session_id="none")
    fill_to(s, int(0.9 * s.window))
    e = s.compact()
    assert "summary_failed" not in names(s) and isinstance(e, events.Rebased) and not e.fallback
    check_invariants(s)


def test_a_late_summary_falls_back_onto_a_prefilled_context(tmp_path, monkeypatch):
    """Above hard with the summary still being written, the fallback's context is prefilled too, so the
    swap at the window edge commits it instead of prefilling after the wait."""
    from pykvcompact.compaction.swap import Swap
    used = []
    real = Swap._build

    def build(self, span, repl, rb, mode):
        used.append(rb is not None)
        return real(self, span, repl, rb, mode)
    monkeypatch.setattr(Swap, "_build", build)
    eng, s = make("background", tmp_path=tmp_path, max_stall_ms=20)
    eng.bg_polls = 10 ** 6
    for i in range(40):
        s.chat(user_msg(i), max_tokens=24)
    late = [e for e in s.events if e.name == "rebased" and e.fallback]
    assert late and sum(used) >= len(late) // 2
    check_invariants(s)
