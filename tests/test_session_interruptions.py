"""Interrupted streams and swaps, retried summaries, large turns (on FakeEngine)."""
from __future__ import annotations

import gc

import pytest

import pykvcompact as pk
import fake_engine
from fake_engine import FakeEngine, default_responder
from test_session_logic import check_invariants


def words(n, tag):
    return " ".join(f"{tag}{k}" for k in range(n))


def test_a_stream_closed_as_the_reply_begins_leaves_tokens_equal_to_the_render(tmp_path):
    eng = FakeEngine(n_ctx=8192)
    s = pk.Session(eng, system="You are a test.", history_dir=tmp_path,
                   policy=pk.Policy(mode="hard", window=400, summary_max_tokens=16, keep_user_tokens=0,
                                    compact_tool=False, history_tool=False))
    for i in range(3):
        s.chat(f"u{i} " + words(40, f"c{i}_"), max_tokens=8)
    it = s.stream("u3 " + words(40, "c3_"), max_tokens=8)
    for x in it:
        # an event while the reply is begun and still empty (the swap that made room for it)
        if not isinstance(x, str) and s._ctx.partial is not None and not s._ctx.partial.tokens:
            it.close()
            break
    check_invariants(s)  # tokens == tokenize(render(live messages)): no reply left half-open
    s.add([{"role": "user", "content": "a " * 30}, {"role": "assistant", "content": "b " * 30}])
    assert s.compact() is not None
    check_invariants(s)
    s.close()


def test_the_edge_waits_when_the_summary_rate_is_not_known_yet(tmp_path, monkeypatch):
    """No summary rate measured and no summary token visible yet (its prompt is being prefilled): the
    edge waits (up to max_stall_ms) instead of falling back at once."""
    class Lagging(fake_engine.FakeJob):
        @property
        def tokens(self):
            return self._all if self._polls <= 0 else []

        @tokens.setter
        def tokens(self, v):
            self._all = v

    orig = fake_engine.FakeSeq.generate_background

    def lagging(self, max_tokens, **kw):
        j = orig(self, max_tokens, **kw)
        return Lagging(j.tokens, finish_reason=j.finish_reason, polls=self.engine.bg_polls)

    monkeypatch.setattr(fake_engine.FakeSeq, "generate_background", lagging)
    eng = FakeEngine(n_ctx=8192, bg_polls=6)
    s = pk.Session(eng, system="You are a test.", history_dir=tmp_path,
                   policy=pk.Policy(mode="background", window=2000, summary_max_tokens=64, keep_user_tokens=400,
                                    compact_tool=False, history_tool=False, max_stall_ms=10000))
    i = 0
    while (s._compactor.prep is None or s._compactor.prep.fallback is None) and i < 60:
        s.add([{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": words(40, f"a{i}_")}])
        i += 1
    assert s._compactor.prep is not None and s._compactor.prep.fallback is not None
    s.add([{"role": "user", "content": words((2000 - len(s.tokens) - 14) // 2, "big")}])  # to the edge
    reb = [e for e in s.events if e.name == "rebased"]
    assert reb and not reb[-1].fallback, reb
    assert not any(e.name == "summary_failed" for e in s.events)
    check_invariants(s)
    s.close()


@pytest.mark.parametrize("mode", ["hard", "background"])
def test_a_looping_summary_is_not_kept_as_a_trimmed_summary(tmp_path, mode):
    def responder(prompt):
        if "write a summary of the conversation" in prompt.rsplit("<|im_start|>user\n", 1)[-1]:
            return "Goal: test the session.\n" + "Verified facts: the build passes on every platform.\n" * 30
        return default_responder(prompt)

    eng = FakeEngine(n_ctx=8192, responder=responder, bg_polls=3 if mode == "background" else 0)
    s = pk.Session(eng, system="You are a test.", history_dir=tmp_path,
                   policy=pk.Policy(mode=mode, window=1500, summary_max_tokens=120, keep_user_tokens=0,
                                    compact_tool=False, history_tool=False))
    for i in range(6):
        s.chat(f"u{i} " + words(60, f"c{i}_"), max_tokens=16)
    s.compact()
    summ = [m for m in s.messages if m.get("summary")]
    assert summ and summ[-1]["content"].count("Verified facts: the build passes") <= 1
    ready = [e for e in s.events if e.name == "summary_ready"]
    assert ready and ready[-1].fallback  # failed twice (looping), then the deterministic summary
    s.close()


def test_a_prepared_rebase_is_released_when_the_swap_is_interrupted(tmp_path, monkeypatch):
    calls = {"n": 0}
    orig = fake_engine.FakeSeq.commit_rebase

    def interrupted_once(self, rb):
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt("Ctrl-C during the swap")
        return orig(self, rb)

    monkeypatch.setattr(fake_engine.FakeSeq, "commit_rebase", interrupted_once)
    eng = FakeEngine(n_ctx=8192)
    s = pk.Session(eng, system="You are a test.", history_dir=tmp_path,
                   policy=pk.Policy(mode="background", window=800, summary_max_tokens=32, keep_user_tokens=0,
                                    compact_tool=False, history_tool=False))
    with pytest.raises(KeyboardInterrupt):
        for i in range(40):
            s.chat(f"u{i} " + words(30, f"c{i}_"), max_tokens=16)
    check_invariants(s)
    s.chat("again", max_tokens=8)
    check_invariants(s)
    s.close()
    gc.collect()
    assert eng.used_cells() == 0 and not eng._seqs


def test_a_retried_summary_attempt_gets_the_preparations_rows(tmp_path, monkeypatch):
    from pykvcompact.compaction.summary.summarizer import Summarizer
    grants, jobs = {}, []
    monkeypatch.setattr(fake_engine.FakeJob, "set_rows_per_step", lambda self, n: grants.__setitem__(id(self), n),
                        raising=False)
    orig = fake_engine.FakeSeq.generate_background

    def recorded(self, max_tokens, **kw):
        j = orig(self, max_tokens, **kw)
        jobs.append(j)
        return j

    monkeypatch.setattr(fake_engine.FakeSeq, "generate_background", recorded)
    eng = FakeEngine(n_ctx=8192, bg_polls=40)
    s = pk.Session(eng, system="You are a test.", history_dir=tmp_path,
                   summarizer=Summarizer(["empty"]),  # the first attempt fails: a retry follows
                   policy=pk.Policy(mode="background", window=1000, summary_max_tokens=32, keep_user_tokens=0,
                                    compact_tool=False, history_tool=False, chunk_tokens=4, summary_retries=1))
    for i in range(12):
        s.chat(f"u{i} " + words(60, f"c{i}_"), max_tokens=8)
    failed = [e for e in s.events if e.name == "summary_failed"]
    assert failed and failed[0].reason == "empty"
    # the first preparation's attempt (failed: empty) and its retry were both granted the deadline rows (or,
    # once the conversation waits at the window edge, the edge's)
    from pykvcompact.compaction.background import DEADLINE_ROWS, EDGE_ROWS
    assert len(jobs) >= 2 and grants.get(id(jobs[0])) == grants.get(id(jobs[1])) in (2 * DEADLINE_ROWS, EDGE_ROWS), \
        [grants.get(id(j)) for j in jobs]
    s.close()


def test_the_fallbacks_context_gets_the_deadline_rows_before_the_models_attempt():
    """The fallback is what the window edge commits when the model is late: while its context is behind,
    the model's attempt gets only the engine's default chunk (0), the prepared contexts the rows asked
    for; once the fallback is caught up the attempt gets them too."""
    from pykvcompact.compaction.preparation import Preparation

    class Work:
        def __init__(self, done=False):
            self.rows, self.finished = None, done

        def set_rows_per_step(self, n):
            self.rows = n

        def done(self):
            return self.finished

    class Job:
        attempt = Work()

    p = Preparation(Job(), cut=3, cut_token=100, prefix_tok=10, instructions=None, build=lambda s: None,
                    reason="hard")
    p.set_rows(16)
    assert Job.attempt.rows == 16                       # no fallback yet: the attempt has the rows
    p.fallback_rebase = Work(done=False)
    p.set_rows(16)
    assert Job.attempt.rows == 0 and p.fallback_rebase.rows == 16
    p.fallback_rebase.finished = True
    p.set_rows(16)
    assert Job.attempt.rows == 16 and p.fallback_rebase.rows == 16
    p.set_rows(0)
    assert Job.attempt.rows == 0 and p.fallback_rebase.rows == 0


def test_a_large_turn_seen_a_while_ago_still_gets_room_from_one_swap(tmp_path):
    """A file read every few tasks, small turns between: the room a prepared swap leaves is sized by the
    largest turn of a longer memory than the pace's (4 calls), so the large turn needs one swap, not a
    second one right after the first (a swap that is not prepared: a stall)."""
    eng = FakeEngine(n_ctx=8192, bg_polls=2)
    s = pk.Session(eng, system="You are a test. " + words(150, "sys"), history_dir=tmp_path,
                   policy=pk.Policy(mode="background", window=1024, summary_max_tokens=24, keep_user_tokens=0,
                                    compact_tool=False, history_tool=False))
    per_call = []
    for i in range(40):
        n0 = len(s.events)
        s.chat(f"u{i} " + words(150 if i % 6 == 0 else 60, f"c{i}_"), max_tokens=8)
        per_call.append(sum(isinstance(e, pk.events.Rebased) for e in s.events[n0:]))
        check_invariants(s)
    assert sum(per_call) >= 8  # the scenario compacts
    assert max(per_call) == 1, per_call
    s.close()
