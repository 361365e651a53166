"""Faults injected into a running session on a real engine: the log's disk full, the history file
unwritable, llama_decode failing ("KV cache full"), background jobs failing, a reply cancelled midway,
the engine closed under open sessions.  Each surfaces as a clear error; the engine and the other session
keep working; the session stays consistent and its log still rebuilds it (no history lost)."""
from __future__ import annotations

import errno
import os

import pytest

import pykvcompact as pk
from pykvcompact.session import journal



def check_invariants(s):
    """The message invariants of test_session_logic (transcript == offloaded + live, in order; the tail
    never splits a call from its results).  Not "tokens == tokenize(render)": the random-weight model's
    replies are token sequences that are not the tokenizer's own (they do not round-trip)."""
    live = [m for m in s.messages if not m.get("summary")]
    non_summary = [m for m in s.transcript if not m.get("summary")]
    assert non_summary == live[:1] + s.offloaded + live[1:]
    assert len(s.tokens) <= s.window


def msg(i, n=20):
    return f"message {i}: " + " ".join(f"w{i}_{k}" for k in range(n))


@pytest.fixture
def eng(tiny_model_path):
    e = pk.Engine(tiny_model_path, n_ctx=4096, n_seq_max=16, seed=0, flash_attn=False, n_threads=1)
    yield e
    e.close()


def session(eng, tmp_path, sid, mode="background"):
    return pk.Session(eng, system="You are a test.", history_dir=tmp_path, session_id=sid,
                      policy=pk.Policy(mode=mode, window=320, summary_max_tokens=24, compact_tool=False, history_tool=False))


def same_as_its_log(s, eng):
    r = pk.Session.load(eng, s.log_path)
    try:
        assert r.transcript == s.transcript and r.messages == s.messages and r.offloaded == s.offloaded
    finally:
        r.close()


def test_a_full_disk_under_the_log_refuses_the_message_and_changes_nothing(eng, tmp_path, monkeypatch):
    s, other = session(eng, tmp_path, "a"), session(eng, tmp_path, "b")
    for i in range(4):
        s.chat(msg(i), max_tokens=8)
    before = (s.transcript, s.messages, s.tokens)

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(journal.os, "write", full)
    with pytest.raises(OSError) as ei:
        s.chat(msg(4), max_tokens=8)
    # the first write of the call fails: the log's, or the history file's when the call compacts first
    assert ("session log" in str(ei.value) or "history file" in str(ei.value)) and "No space left" in str(ei.value)
    assert (s.transcript, s.messages, s.tokens) == before
    monkeypatch.undo()
    other.chat(msg(0), max_tokens=8)  # the engine and the other session are unaffected
    for i in range(4, 12):  # the disk has room again: the session goes on, compactions included
        s.chat(msg(i), max_tokens=8)
    assert any(e.name == "rebased" for e in s.events)
    check_invariants(s)
    same_as_its_log(s, eng)
    s.close()
    other.close()


def test_an_unwritable_history_file_fails_the_compaction_not_the_session(eng, tmp_path, monkeypatch):
    from pykvcompact.session.history_file import HistoryFile
    s = session(eng, tmp_path, "h", mode="hard")
    real = HistoryFile.append

    def broken(self, *a, **k):
        raise OSError(errno.EROFS, "Read-only file system")
    monkeypatch.setattr(HistoryFile, "append", broken)
    failed = 0
    for i in range(12):
        try:
            s.chat(msg(i), max_tokens=8)
        except OSError as e:
            failed += 1
            assert "Read-only" in str(e)
            break
        check_invariants(s)
    assert failed == 1 and not any(e.name == "rebased" for e in s.events)  # nothing forgotten unwritten
    check_invariants(s)
    monkeypatch.setattr(HistoryFile, "append", real)
    for i in range(12, 20):
        s.chat(msg(i), max_tokens=8)
    assert any(e.name == "rebased" for e in s.events)
    check_invariants(s)
    same_as_its_log(s, eng)
    s.close()


def test_decode_failures_surface_as_errors_and_the_session_recovers(eng, tmp_path):
    s, other = session(eng, tmp_path, "d"), session(eng, tmp_path, "e")
    for i in range(3):
        s.chat(msg(i), max_tokens=8)
        other.chat(msg(i), max_tokens=8)
    eng._n.inject_decode_failures(1000, 1)  # llama_decode: 1 = no KV slot for the batch ("cache full")
    with pytest.raises(pk.EngineError):
        s.chat(msg(3), max_tokens=8)
    eng._n.inject_decode_failures(0, 0)
    check_invariants(s)
    for i in range(4, 14):
        s.chat(msg(i), max_tokens=8)
        other.chat(msg(i), max_tokens=8)
    check_invariants(s)
    check_invariants(other)
    same_as_its_log(s, eng)
    s.close()
    other.close()
    assert eng.used_cells() == 0


def test_failing_background_jobs_fall_back_without_dropping_turns(eng, tmp_path):
    s = session(eng, tmp_path, "bg")
    eng._n.inject_decode_failures(10 ** 6, 1, 40)  # every large batch fails: summary prompts, prefilled contexts
    try:
        for i in range(14):
            s.chat(msg(i, 12), max_tokens=8)
            check_invariants(s)
    except pk.EngineError as e:  # a foreground prefill large enough to be hit: a clear error, not a crash
        assert "decode" in str(e).lower() or "fail" in str(e).lower()
    finally:
        eng._n.inject_decode_failures(0, 0)
    for i in range(14, 24):
        s.chat(msg(i, 12), max_tokens=8)
    assert not any(e.name == "dropped" for e in s.events)
    check_invariants(s)
    same_as_its_log(s, eng)
    s.close()
    assert eng.used_cells() == 0


def test_a_reply_cancelled_midway_keeps_the_session_and_its_log_consistent(eng, tmp_path):
    s = session(eng, tmp_path, "c")
    for i in range(6):
        it = s.stream(msg(i), max_tokens=24)
        for k, x in enumerate(it):
            if isinstance(x, str) and k >= 1 + i % 3:
                it.close()  # the generation job is cancelled mid-reply
                break
        check_invariants(s)
    s.chat(msg(6), max_tokens=8)
    same_as_its_log(s, eng)
    s.close()


def test_closing_the_engine_under_open_sessions_loses_nothing(tiny_model_path, tmp_path):
    e1 = pk.Engine(tiny_model_path, n_ctx=4096, n_seq_max=16, seed=0, n_threads=1)
    s = session(e1, tmp_path, "closed")
    for i in range(8):
        s.chat(msg(i), max_tokens=8)
    transcript = s.transcript
    e1.close()
    with pytest.raises(pk.EngineClosedError):
        s.chat(msg(8), max_tokens=8)
    s.close()
    e2 = pk.Engine(tiny_model_path, n_ctx=4096, n_seq_max=16, seed=0, n_threads=1)
    try:
        r = pk.Session.load(e2, s.log_path)
        assert r.transcript[:len(transcript)] == transcript
        r.chat(msg(9), max_tokens=8)
        check_invariants(r)
        r.close()
    finally:
        e2.close()


def test_an_unprepared_swap_rebuilt_in_place_that_fails_puts_the_old_context_back(eng, tmp_path, monkeypatch):
    # a swap nobody prepared truncates the sequence to the prefix and appends summary and tail
    # (compaction/swap.py); when that append fails, the old tokens go back and the error surfaces
    s = session(eng, tmp_path, "inplace", mode="hard")
    for i in range(3):
        s.chat(msg(i), max_tokens=8)
    before_tokens, before_msgs = list(s.tokens), list(s.messages)
    seq_type, real_append, calls = type(s.sequence), type(s.sequence).append, []

    def failing_append(self, tokens):
        tokens = list(tokens)
        if self is s.sequence and len(self) < len(before_tokens) and not calls:
            calls.append(len(tokens))
            real_append(self, tokens[: len(tokens) // 2])     # half of it decoded, then the engine fails
            raise pk.EngineError("injected: llama_decode failed")
        return real_append(self, tokens)

    monkeypatch.setattr(seq_type, "append", failing_append)
    with pytest.raises(pk.EngineError, match="injected"):
        s.compact()
    monkeypatch.setattr(seq_type, "append", real_append)
    assert calls, "the swap was not rebuilt in place"
    assert s.tokens == before_tokens and s.messages == before_msgs     # the old context, whole
    assert s.sequence.tokens == before_tokens
    rebased = s.compact()                                            # and the next swap works
    assert rebased is not None and rebased.mode == "exact" and len(s.tokens) < len(before_tokens)
    s.chat(msg(9), max_tokens=8)
    check_invariants(s)
    same_as_its_log(s, eng)
    s.close()


def test_when_the_engine_cannot_even_put_the_old_context_back_the_next_call_does(eng, tmp_path, monkeypatch):
    # the in-place rebuild fails, and so do both ways back (the tail again, a fresh sequence): the
    # context remembers its tokens and the session's next call rebuilds them before anything else
    s = session(eng, tmp_path, "heal", mode="hard")
    for i in range(3):
        s.chat(msg(i), max_tokens=8)
    before_tokens, before_msgs = list(s.tokens), list(s.messages)
    seq_type, real_append = type(s.sequence), type(s.sequence).append
    real_sequence, failing = type(eng).sequence, {"on": True}

    def failing_append(self, tokens):
        if failing["on"] and self is s.sequence and len(self) < len(before_tokens):
            raise pk.EngineError("injected: llama_decode failed")
        return real_append(self, tokens)

    def failing_sequence(self, tokens=()):
        if failing["on"] and list(tokens) == before_tokens:
            raise pk.EngineError("injected: no slot")
        return real_sequence(self, tokens)

    monkeypatch.setattr(seq_type, "append", failing_append)
    monkeypatch.setattr(type(eng), "sequence", failing_sequence)
    with pytest.raises(pk.EngineError, match="injected"):
        s.compact()
    assert s.messages == before_msgs and len(s.sequence) < len(before_tokens)   # the engine could not undo it
    with pytest.raises(pk.EngineError, match="could not be rebuilt"):
        s.chat(msg(8), max_tokens=8)               # still failing: said, and nothing added
    assert s.messages == before_msgs
    failing["on"] = False
    s.save(tmp_path / "snap.pkv")                  # healed first, then the call
    assert s.sequence.tokens == before_tokens and s.tokens == before_tokens
    s.chat(msg(9), max_tokens=8)
    check_invariants(s)
    same_as_its_log(s, eng)
    s.close()
