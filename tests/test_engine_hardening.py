"""Regression tests for the engine defects an outside review reproduced (issue 6): queued jobs that
hang, use after close, a splice or exact commit racing other calls, cancel of a background prefill,
unchecked native arguments, and decode failures that dropped a token or killed unrelated tasks."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

import pykvcompact as pk
from conftest import text_tokens


@pytest.fixture
def engine(tiny_model_path):
    eng = pk.Engine(tiny_model_path, n_ctx=1024, n_seq_max=6, seed=0, flash_attn=False)
    yield eng
    eng.close()


def test_queued_background_job_runs_after_the_one_ahead_is_cancelled(engine):
    s = engine.sequence(text_tokens(engine, 16))
    a = s.generate_background(2000)
    b = s.generate_background(6)
    a.cancel()
    assert len(b.result(timeout=10)) == 6
    assert a.finish_reason == "cancelled"
    s.close()


def test_queued_job_runs_after_the_prefill_ahead_of_it_fails(engine):
    s = engine.sequence(text_tokens(engine, 16))
    free = engine.free_cells()
    a = s.append_background(text_tokens(engine, free - 4, seed=1))
    big = s.append_background(text_tokens(engine, 100, seed=2))  # cannot fit once `a` is in
    c = s.generate_background(2)
    a.result(timeout=10)
    with pytest.raises(pk.ContextFullError):
        big.result(timeout=10)
    assert len(c.result(timeout=10)) == 2
    s.close()


_AFTER_CLOSE = textwrap.dedent("""
    import sys, threading
    import pykvcompact as pk
    eng = pk.Engine(sys.argv[1], n_ctx=256, n_seq_max=2)
    seq = eng.sequence(eng.tokenize("hello world"))
    stop = threading.Event()
    errors = []
    def hammer():
        while not stop.is_set():
            try:
                eng.tokenize("some text to tokenize " * 20)
                eng.detokenize([1, 2, 3, 4])
            except pk.EngineClosedError:
                pass
            except Exception as exc:
                errors.append(repr(exc))
                return
    threads = [threading.Thread(target=hammer) for _ in range(2)]
    for t in threads: t.start()
    closers = [threading.Thread(target=eng.close) for _ in range(2)]
    for t in closers: t.start()
    for t in closers: t.join()
    stop.set()
    for t in threads: t.join()
    assert not errors, errors
    calls = [lambda: eng.is_eog(0), lambda: eng.token_bos, lambda: eng.token_eos, lambda: eng.metadata,
             lambda: eng.chat_template, lambda: eng.tokenize("x"), lambda: eng.detokenize([1]),
             lambda: eng.token_to_piece(1), lambda: eng.stats(), lambda: eng.sequence(), lambda: len(seq),
             lambda: seq.fork(), lambda: seq.generate(2), lambda: eng._n.metadata(), lambda: eng._n.is_eog(0),
             lambda: eng._n.chat_template(), lambda: eng._n.token_bos(), lambda: eng._n.capabilities(),
             lambda: eng._n.tokenize("x", False, True)]
    for i, call in enumerate(calls):
        try:
            call()
        except pk.EngineClosedError:
            continue
        raise AssertionError(f"call {i} did not raise EngineClosedError after close()")
    eng.close()
    eng._n.shutdown()
    del eng
    print("OK")
""")


def test_every_call_after_close_raises_and_close_is_idempotent(tiny_model_path, tmp_path):
    script = tmp_path / "after_close.py"
    script.write_text(_AFTER_CLOSE)
    r = subprocess.run([sys.executable, str(script), str(tiny_model_path)], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and "OK" in r.stdout, f"rc={r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"


def _commit_in_thread(seq, rb):
    out = {}

    def run():
        try:
            out["info"] = seq.commit_rebase(rb)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    return t, out


def _wait_committing(engine, seq, t, timeout=120.0):
    """Wait until the commit request reached the engine: the sequence refuses foreground work."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and t.is_alive():
        if engine._n.stats()["committing"] > 0:  # one command: answered between two steps
            return True
        time.sleep(0.0005)
    return False


@pytest.fixture
def slow_commit_engine(tiny_model_path):
    """Small batches: a commit that catches up 1500 tokens spans hundreds of decode steps, and every
    command is answered between two steps, so the test's calls land while the commit runs."""
    eng = pk.Engine(tiny_model_path, n_ctx=4096, n_seq_max=4, n_batch=4, seed=0, flash_attn=False)
    yield eng
    eng.close()


@pytest.mark.parametrize("mode", ["exact", "splice"])
def test_no_foreground_call_runs_while_a_commit_is_in_progress(slow_commit_engine, mode):
    eng = slow_commit_engine
    seq = eng.sequence(text_tokens(eng, 64))
    rb = seq.prepare_rebase(8, text_tokens(eng, 1500, seed=3), 40, mode=mode)
    t, out = _commit_in_thread(seq, rb)
    assert _wait_committing(eng, seq, t), "the commit finished before the test could race it"
    # Calls that run or queue foreground work are refused; reads (tokens, logits) see the sequence
    # as it was before the swap.
    calls = {"generate": lambda: seq.generate(4), "fork": lambda: seq.fork(), "append": lambda: seq.append([1, 2]),
             "truncate": lambda: seq.truncate(10), "probe": lambda: seq.probe([1, 2, 3]),
             "stream": lambda: next(iter(seq.stream(2)))}
    for name, call in calls.items():
        with pytest.raises(pk.SequenceBusyError):
            call()
            pytest.fail(f"{name} ran during the commit")
    assert eng._n.stats()["committing"] == 1, "the commit ended during the test: it did not race anything"
    t.join(120)
    assert "error" not in out, out.get("error")
    assert len(seq) == 8 + 1500 + 24
    assert seq.pos_range() == (0, len(seq) - 1)
    assert len(seq.generate(2)) == 2
    seq.close()


def test_fork_taken_during_a_splice_commit_is_never_shifted(slow_commit_engine):
    eng = slow_commit_engine
    seq = eng.sequence(text_tokens(eng, 64))
    # A fork that exists when the commit is asked for: the splice is refused, the fork stays intact.
    early = seq.fork()
    rb = seq.prepare_rebase(8, text_tokens(eng, 1500, seed=4), 40, mode="splice")
    with pytest.raises(pk.UnsupportedOperationError, match="fork"):
        seq.commit_rebase(rb)
    assert early.pos_range() == (0, len(early) - 1)
    early.close()
    # A fork asked for while the commit runs is refused until the swap.
    rb = seq.prepare_rebase(8, text_tokens(eng, 1500, seed=4), 40, mode="splice")
    t, out = _commit_in_thread(seq, rb)
    assert _wait_committing(eng, seq, t)
    for _ in range(3):
        with pytest.raises(pk.SequenceBusyError):
            seq.fork()
    t.join(120)
    assert "error" not in out, out.get("error")
    late = seq.fork()
    assert seq.pos_range() == (0, len(seq) - 1) and late.pos_range() == (0, len(late) - 1)
    assert late.generate(3) == seq.generate(3)
    late.close()
    seq.close()


def test_cancel_stops_a_background_prefill_and_keeps_what_was_decoded(tiny_model_path):
    eng = pk.Engine(tiny_model_path, n_ctx=2048, n_seq_max=2, n_threads=1, background_chunk=4, flash_attn=False)
    try:
        base = text_tokens(eng, 8)
        extra = text_tokens(eng, 1500, seed=5)
        s = eng.sequence(base)
        job = s.append_background(extra)
        time.sleep(0.01)
        job.cancel()
        got = job.result(timeout=30)
        assert job.finish_reason == "cancelled"
        assert len(got) < len(extra)
        assert got == extra[:len(got)]
        assert s.tokens == base + got
        assert s.pos_range() == (0, len(s) - 1)
        assert len(s.generate(1)) == 1
    finally:
        eng.close()


def test_a_batch_smaller_than_the_sequence_count_is_refused_not_aborted(tiny_model_path):
    # llama.cpp itself aborts the process (GGML_ASSERT in output_reserve) on this combination.
    with pytest.raises(ValueError, match="n_batch"):
        pk.Engine(tiny_model_path, n_ctx=256, n_seq_max=8, n_batch=4)


def test_a_busy_background_cap_above_the_idle_one_is_refused(tiny_model_path):
    # refused before the model loads; the default busy cap follows a smaller idle one
    with pytest.raises(ValueError, match=r"background_chunk_busy \(16\) must be <= background_chunk \(8\)"):
        pk.Engine(tiny_model_path, n_ctx=256, n_seq_max=2, background_chunk=8, background_chunk_busy=16)
    with pk.Engine(tiny_model_path, n_ctx=256, n_seq_max=2, n_threads=1, background_chunk=4) as eng:
        assert len(eng.sequence(text_tokens(eng, 8)).generate(1)) == 1


def test_native_arguments_are_validated(engine):
    s = engine.sequence(text_tokens(engine, 4))
    native = engine._n
    for kind in (-1, 3, 7, 1 << 20):
        with pytest.raises(ValueError, match="kind"):
            native.seq_append(s.id, [1, 2], kind, False)
        with pytest.raises(ValueError, match="kind"):
            native.seq_generate(s.id, 2, 0.0, 1.0, -1, [], [], "", kind)
    job = native.seq_generate(s.id, 1, 0.0, 1.0, -1, [], [], "", 0)
    with pytest.raises(ValueError, match="timeout"):
        job.wait(float("nan"))
    job.wait(-1)
    with pytest.raises(ValueError):
        job.logit_rows(-5)
    assert len(s) == 5
    s.close()


def test_failed_redecode_keeps_every_token(engine):
    toks = text_tokens(engine, 40)
    s = engine.sequence(toks)
    s.truncate(30)  # the next generation must re-decode token 29 to get its logits
    engine._n.inject_decode_failures(100, 1)
    with pytest.raises(pk.ContextFullError):
        s.generate(3)
    engine._n.inject_decode_failures(0, 0)
    assert s.tokens == toks[:30]
    ref = engine.sequence(toks[:30])
    assert s.generate(5) == ref.generate(5)
    assert s.pos_range() == (0, len(s) - 1)
    s.close()
    ref.close()


def test_a_generation_advances_while_every_mixed_step_fails_first(engine):
    """Every batch of 3+ rows fails (a persistent fault under a background prefill): each step's first try
    (generation row + background rows) fails and its retry holds the generation row alone.  The
    rollback used to drop the generation's logits, so the retry only re-decoded its last token, step
    after step, forever (a livelock that hung a Session under injected faults); now it samples."""
    fg = engine.sequence(text_tokens(engine, 20))
    ref_fg = engine.sequence(text_tokens(engine, 20))
    expected = ref_fg.generate(12)
    bg = engine.sequence(text_tokens(engine, 20, seed=6))
    bg_job = bg.append_background(text_tokens(engine, 400, seed=7))
    engine._n.inject_decode_failures(10 ** 6, 1, 3)
    try:
        job = fg._start_generate(12, 0.0, 1.0, None, (), None, 0)
        assert job.result(timeout=60) == expected  # (a TimeoutError here was the livelock)
    finally:
        engine._n.inject_decode_failures(0, 0)
    bg_job.cancel()
    for s in (fg, bg, ref_fg):
        s.close()


def test_a_failed_decode_is_retried_without_background_rows(engine):
    fg = engine.sequence(text_tokens(engine, 20))
    bg = engine.sequence(text_tokens(engine, 20, seed=6))
    ref_fg = engine.sequence(text_tokens(engine, 20))
    expected = ref_fg.generate(12)
    bg_job = bg.generate_background(300)
    # the first step holding both generations' rows fails once (a lone row is never hit)
    engine._n.inject_decode_failures(1, 1, 2)
    got = fg.generate(12)
    assert got == expected
    bg_job.cancel()
    bg_job.result(timeout=10)  # raises if the shared step's failure had failed it
    assert bg_job.finish_reason in ("cancelled", "length")
    assert engine.stats()["failed_decodes"] >= 1
    for s in (fg, bg, ref_fg):
        s.close()


def test_decode_failure_that_persists_fails_only_the_task_that_cannot_fit(engine):
    a = engine.sequence(text_tokens(engine, 20))
    b = engine.sequence(text_tokens(engine, 20, seed=8))
    failed_before = engine.stats()["failed_decodes"]
    jb = b.append_background(text_tokens(engine, 600, seed=9))
    engine._n.inject_decode_failures(2, 1)  # the next two decodes fail, whatever they hold
    try:
        got_a = a.generate(4)
    except pk.ContextFullError:
        got_a = None  # the one task left in a failing single-row batch
    assert len(jb.result(timeout=30)) == 600  # never killed by a failure in a batch it shared
    assert got_a is None or len(got_a) == 4
    assert engine.stats()["failed_decodes"] == failed_before + 2
    for s in (a, b):
        assert s.pos_range() == (0, len(s) - 1)
        s.close()
