"""The engine recovers from failures: a commit that
could not be retried, queued jobs that ignored cancel, recurrent memories losing their logits on a
failed decode or a cancelled prefill, one failing code killing every task, a process abort on a huge
thread count, an off-by-one at a full context, dropped Rebase handles leaking, empty logits."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

import pykvcompact as pk
from conftest import text_tokens
from tiny_archs import make_tiny_mamba


@pytest.fixture
def engine(tiny_model_path):
    eng = pk.Engine(tiny_model_path, n_ctx=1024, n_seq_max=6, n_threads=1, seed=0, flash_attn=False)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def mamba_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("mamba") / "mamba.gguf"
    make_tiny_mamba(str(path), seed=0)
    return path


def test_a_refused_commit_can_be_retried(engine):
    s = engine.sequence(text_tokens(engine, 60))
    rb = s.prepare_rebase(10, [5, 6, 7], 40)
    assert rb.wait(timeout=10)
    job = s.generate_background(30)
    with pytest.raises(pk.SequenceBusyError):
        s.commit_rebase(rb)
    job.result(timeout=20)
    info = s.commit_rebase(rb)
    assert info["tokens_after"] == len(s) and s.pos_range() == (0, len(s) - 1)
    assert engine.stats()["internal_sequences"] == 0
    s.close()


def test_a_refused_splice_commit_succeeds_once_the_fork_is_closed(engine):
    s = engine.sequence(text_tokens(engine, 60))
    fork = s.fork()
    rb = s.prepare_rebase(10, [5, 6, 7], 40, mode="splice")
    with pytest.raises(pk.UnsupportedOperationError):
        s.commit_rebase(rb)
    fork.close()
    s.commit_rebase(rb)
    assert s.pos_range() == (0, len(s) - 1)
    s.close()


def test_cancelling_a_queued_job_ends_it_without_waiting_for_the_one_ahead(engine):
    s = engine.sequence(text_tokens(engine, 20))
    a = s.generate_background(900)
    b = s.generate_background(5)
    b.cancel()
    assert b.result(timeout=5) == [] and b.finish_reason == "cancelled"
    assert not a.done()
    a.cancel()
    a.result(timeout=10)
    s.close()


def _stream_with_a_failure(eng, rc):
    a = eng.sequence(text_tokens(eng, 30))
    b = eng.sequence(text_tokens(eng, 40, seed=2))
    jb = b.generate_background(400)
    got = []
    for i, t in enumerate(a.stream(12)):
        got.append(t)
        if i == 2:
            eng._n.inject_decode_failures(1, rc, 2)  # a step both generations share
    jb.cancel()
    jb.result(timeout=10)
    return a, b, got


@pytest.mark.parametrize("rc", [1, -3, 2])
def test_one_failed_mixed_step_does_not_fail_the_foreground(engine, rc):
    a, b, got = _stream_with_a_failure(engine, rc)
    assert len(got) == 12
    ref = engine.sequence(a.tokens[:30])
    assert ref.generate(12) == got
    for s in (a, b, ref):
        s.close()


def test_recurrent_memory_survives_a_failed_step(mamba_path):
    eng = pk.Engine(mamba_path, n_ctx=1024, n_seq_max=4, n_threads=1, flash_attn=False)
    try:
        a, b, got = _stream_with_a_failure(eng, 1)
        assert len(got) == 12
        assert len(a.generate(4)) == 4
    finally:
        eng.close()


def test_recurrent_memory_can_generate_after_a_cancelled_prefill(mamba_path):
    eng = pk.Engine(mamba_path, n_ctx=2048, n_seq_max=4, n_threads=1, flash_attn=False, background_chunk=16)
    try:
        s = eng.sequence(list(range(100, 130)))
        job = s.append_background(list(range(1000, 1600)))
        while not job.tokens and not job.done():
            pass
        job.cancel()
        kept = job.result(timeout=10)
        assert len(s) == 30 + len(kept)
        assert len(s.generate(3)) == 3
    finally:
        eng.close()


def test_an_absurd_thread_count_is_refused_not_a_process_abort(tiny_model_path):
    code = ("import pykvcompact as pk, sys\n"
            "try:\n    pk.Engine(sys.argv[1], n_ctx=64, n_threads=2**31 - 1)\n"
            "except ValueError as e:\n    print('refused', e)\n")
    r = subprocess.run([sys.executable, "-c", code, str(tiny_model_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "refused" in r.stdout, r.stderr[-2000:]


def test_logits_at_a_full_context_are_recomputed_in_place(tiny_model_path):
    eng = pk.Engine(tiny_model_path, n_ctx=256, n_threads=1, flash_attn=False)
    try:
        s = eng.sequence(text_tokens(eng, 200))
        rb = s.prepare_rebase(200, text_tokens(eng, 56, seed=3), 200)
        assert rb.wait(timeout=10)
        s.commit_rebase(rb)
        assert len(s) == eng.n_ctx
        logits = s.logits()
        assert logits.shape == (eng.n_vocab,)
        assert s.pos_range() == (0, len(s) - 1)
        assert eng.free_cells() == 0  # the re-decode gave its cell back, then took it again
    finally:
        eng.close()


def test_a_dropped_rebase_handle_frees_its_slot_and_cells(engine):
    s = engine.sequence(text_tokens(engine, 100))
    before = engine.stats()
    for _ in range(8):  # more than n_seq_max: each dropped preparation must give its slot back
        s.prepare_rebase(10, [1, 2, 3], 50)
        gc.collect()
    after = engine.stats()
    assert after["internal_sequences"] == 0
    assert after["used_cells"] == before["used_cells"]
    s.close()


def test_logits_are_never_empty_during_an_append_after_a_failed_redecode(engine):
    s = engine.sequence(text_tokens(engine, 40))
    s.truncate(30)
    engine._n.inject_decode_failures(1, 1)
    with pytest.raises(pk.ContextFullError):
        s.generate(2)
    job = s.append_background(text_tokens(engine, 300, seed=4))
    shapes = set()
    while not job.done():
        try:
            shapes.add(s.logits().shape)
        except pk.SequenceBusyError:
            shapes.add("busy")
    job.result(timeout=10)
    assert shapes <= {"busy", (engine.n_vocab,)}
    assert s.logits().shape == (engine.n_vocab,)
    s.close()


def test_bytes_are_not_taken_as_stop_token_ids(engine):
    s = engine.sequence(text_tokens(engine, 8))
    with pytest.raises(TypeError, match="stop"):
        s.generate(2, stop=b"ab")
    s.close()
