"""Rebase (exact and splice) and background work interleaved with foreground decoding."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import pykvcompact as pk
from conftest import text_tokens
from test_engine_basics import assert_logits_close


def test_exact_rebase_equals_fresh_sequence(tiny_engine):
    toks = text_tokens(tiny_engine, 300, seed=11)
    replacement = text_tokens(tiny_engine, 40, seed=12)
    with tiny_engine.sequence(toks) as s:
        rb = s.prepare_rebase(keep_prefix=20, replacement=replacement, keep_from=200)
        assert rb.wait(timeout=30)
        assert rb.target_len == 20 + 40 + 100
        info = s.commit_rebase(rb)
        expect = toks[:20] + replacement + toks[200:]
        assert s.tokens == expect
        assert s.pos_range() == (0, len(expect) - 1)
        assert info["tokens_before"] == 300 and info["tokens_after"] == len(expect)
        assert info["catch_up_tokens"] == 0 and info["mode"] == "exact"
        with tiny_engine.sequence(expect) as fresh:
            assert_logits_close(s.logits(), fresh.logits())
            # and it keeps decoding like the fresh one
            more = text_tokens(tiny_engine, 9, seed=13)
            s.append(more)
            fresh.append(more)
            assert_logits_close(s.logits(), fresh.logits())


def test_exact_rebase_catches_up_with_tokens_appended_after_prepare(tiny_engine):
    toks = text_tokens(tiny_engine, 200, seed=14)
    replacement = text_tokens(tiny_engine, 30, seed=15)
    with tiny_engine.sequence(toks) as s:
        rb = s.prepare_rebase(10, replacement, 150)
        late = text_tokens(tiny_engine, 25, seed=16)
        s.append(late)             # may land before or after the preparation caught up
        generated = s.generate(15)  # foreground decoding while the shadow catches up
        info = s.commit_rebase(rb)
        expect = toks[:10] + replacement + toks[150:] + late + generated
        assert s.tokens == expect and s.pos_range() == (0, len(expect) - 1)
        with tiny_engine.sequence(expect) as fresh:
            assert_logits_close(s.logits(), fresh.logits())
        assert info["tokens_after"] == len(expect)


def test_commit_before_preparation_finishes_catches_up_in_foreground(tiny_engine):
    toks = text_tokens(tiny_engine, 100, seed=17)
    replacement = text_tokens(tiny_engine, 400, seed=18)  # > background_chunk: several steps
    with tiny_engine.sequence(toks) as s:
        rb = s.prepare_rebase(5, replacement, 90)
        info = s.commit_rebase(rb)  # immediately
        expect = toks[:5] + replacement + toks[90:]
        assert s.tokens == expect
        assert info["catch_up_tokens"] > 0
        with tiny_engine.sequence(expect) as fresh:
            assert_logits_close(s.logits(), fresh.logits())


def test_rebase_frees_old_cells_and_slot(tiny_engine):
    used0 = tiny_engine.used_cells()
    live0 = tiny_engine.stats()["live_sequences"]
    toks = text_tokens(tiny_engine, 120, seed=19)
    with tiny_engine.sequence(toks) as s:
        rb = s.prepare_rebase(10, text_tokens(tiny_engine, 5), 100)
        rb.wait(30)
        s.commit_rebase(rb)
        assert tiny_engine.used_cells() == used0 + 10 + 5 + 20
        assert tiny_engine.stats()["live_sequences"] == live0 + 1
    assert tiny_engine.used_cells() == used0


def test_rebase_cancel_and_invalid_arguments(tiny_engine):
    toks = text_tokens(tiny_engine, 50, seed=20)
    with tiny_engine.sequence(toks) as s:
        used = tiny_engine.used_cells()
        with pytest.raises(ValueError, match="keep_prefix"):
            s.prepare_rebase(30, [], 20)
        with pytest.raises(ValueError, match="keep_from"):
            s.prepare_rebase(0, [], 51)
        with pytest.raises(ValueError, match="mode"):
            s.prepare_rebase(0, [], 10, mode="magic")
        rb = s.prepare_rebase(5, text_tokens(tiny_engine, 300), 40)
        rb.cancel()
        with pytest.raises(pk.RebaseNotPendingError, match="no longer pending"):
            s.commit_rebase(rb)
        assert s.tokens == toks and tiny_engine.used_cells() == used
        # truncating below the mark invalidates a preparation
        rb2 = s.prepare_rebase(5, [1, 2, 3], 40)
        s.truncate(30)
        with pytest.raises(pk.EngineError):
            s.commit_rebase(rb2)
        assert s.tokens == toks[:30]


def test_splice_rebase_is_approximate_and_guarded(tiny_engine):
    toks = text_tokens(tiny_engine, 120, seed=21)
    repl = text_tokens(tiny_engine, 12, seed=22)
    with tiny_engine.sequence(toks) as s:
        with s.fork() as f:  # shares the tail cells: shifting them would corrupt the fork
            rb = s.prepare_rebase(10, repl, 80, mode="splice")
            rb.wait(30)
            with pytest.raises(pk.UnsupportedOperationError, match="fork"):
                s.commit_rebase(rb)
            assert f.tokens == toks
            rb.cancel()
        rb = s.prepare_rebase(10, repl, 80, mode="splice")
        rb.wait(30)
        info = s.commit_rebase(rb)
        expect = toks[:10] + repl + toks[80:]
        assert s.tokens == expect and s.pos_range() == (0, len(expect) - 1)
        assert info["mode"] == "splice"
        with tiny_engine.sequence(expect) as fresh:
            # The kept tail attended to the dropped history: close to, but not, a fresh prefill.
            a, b = s.logits(), fresh.logits()
            assert a.shape == b.shape and np.all(np.isfinite(a))


def test_a_replacement_that_starts_like_the_span_it_replaces_reuses_those_cells(tiny_engine):
    # A new summary that begins as the old one did: those tokens are already computed at those positions.
    toks = text_tokens(tiny_engine, 200, seed=31)
    repl = toks[20:60] + text_tokens(tiny_engine, 25, seed=32)   # 40 tokens as before, then new ones
    with tiny_engine.sequence(toks) as s:
        before = tiny_engine.stats()
        rb = s.prepare_rebase(20, repl, 150)
        assert rb.wait(timeout=30)
        info = s.commit_rebase(rb)
        after = tiny_engine.stats()
        expect = toks[:20] + repl + toks[150:]
        assert s.tokens == expect and s.pos_range() == (0, len(expect) - 1)
        assert after["rebase_reused_rows"] - before["rebase_reused_rows"] == 40 == info["reused_tokens"]
        # fed: the 25 new replacement tokens and the 50-token tail, not the 40 reused ones
        fed = after["rows"]["background"] + after["catch_up_rows"] - before["rows"]["background"] - before["catch_up_rows"]
        assert fed == 25 + 50
        assert info["tokens_after"] == len(expect)
        with tiny_engine.sequence(expect) as fresh:
            assert_logits_close(s.logits(), fresh.logits())
            more = text_tokens(tiny_engine, 7, seed=33)
            s.append(more)
            fresh.append(more)
            assert_logits_close(s.logits(), fresh.logits())


@pytest.mark.parametrize("mode", ["exact", "splice"])
def test_reuse_stops_at_the_replaced_span(tiny_engine, mode):
    # The replacement repeats the whole span and goes on with the tail's own tokens: only the span is
    # reused (the tail's cells move, they are not the replacement's).
    toks = text_tokens(tiny_engine, 120, seed=34)
    repl = toks[10:80] + toks[80:95]
    with tiny_engine.sequence(toks) as s:
        before = tiny_engine.stats()["rebase_reused_rows"]
        rb = s.prepare_rebase(10, repl, 80, mode=mode)
        assert rb.wait(timeout=30)
        s.commit_rebase(rb)
        assert tiny_engine.stats()["rebase_reused_rows"] - before == 70
        expect = toks[:10] + repl + toks[80:]
        assert s.tokens == expect and s.pos_range() == (0, len(expect) - 1)
        if mode == "exact":
            with tiny_engine.sequence(expect) as fresh:
                assert_logits_close(s.logits(), fresh.logits())


def test_no_reuse_of_cells_a_splice_moved(tiny_engine):
    # a splice keeps the tail's cells, computed after the old span: they are not "the same tokens after
    # the same prefix", so a later rebase feeds them again instead of taking them as in place; the cells
    # before them (the prefix, and the replacement computed after it in the shadow) are exact and reused
    toks = text_tokens(tiny_engine, 150, seed=35)
    with tiny_engine.sequence(toks) as s:
        assert not s.spliced
        rb = s.prepare_rebase(10, text_tokens(tiny_engine, 12, seed=36), 60, mode="splice")
        assert rb.wait(timeout=30)
        s.commit_rebase(rb)
        assert s.spliced                     # exact up to 10 + 12 = 22, moved from there on
        with s.fork() as f:
            assert f.spliced   # (forks inherit it)
        with s.fork(20) as f:
            assert not f.spliced   # (a fork of its exact cells only is exact)
        now = s.tokens
        before = tiny_engine.stats()["rebase_reused_rows"]
        rb = s.prepare_rebase(5, now[5:40] + [7, 8, 9], 60)
        assert rb.wait(timeout=30)
        info = s.commit_rebase(rb)
        assert info["reused_tokens"] == 17 == tiny_engine.stats()["rebase_reused_rows"] - before   # 5..21
        expect = now[:5] + now[5:40] + [7, 8, 9] + now[60:]
        assert s.tokens == expect
        # the moved cells were fed again after exact ones: the result is a fresh prefill's
        assert not s.spliced
        with tiny_engine.sequence(expect) as fresh:
            assert_logits_close(s.logits(), fresh.logits())


def test_a_summary_spliced_in_is_reused_by_the_next_splice(tiny_engine):
    """Splice twice, the second replacement starting with the first (an extended summary): its cells were
    computed after the same prefix in the shadow, so they are kept in place, and the summary's part of the
    result is exact (a fork of it has a fresh prefill's logits)."""
    toks = text_tokens(tiny_engine, 160, seed=37)
    summary = text_tokens(tiny_engine, 20, seed=38)
    with tiny_engine.sequence(toks) as s:
        rb = s.prepare_rebase(10, summary, 70, mode="splice")
        assert rb.wait(timeout=30)
        s.commit_rebase(rb)
        now = s.tokens                       # 10 prefix + 20 summary + 90 moved tail
        addition = text_tokens(tiny_engine, 6, seed=39)
        rb = s.prepare_rebase(10, summary + addition, 30 + 40, mode="splice")
        assert rb.wait(timeout=30)
        info = s.commit_rebase(rb)
        assert info["reused_tokens"] == 20
        assert s.tokens == now[:10] + summary + addition + now[70:]
        with s.fork(36) as f, tiny_engine.sequence(now[:10] + summary + addition) as fresh:
            assert_logits_close(f.logits(), fresh.logits())


def test_a_spliced_sequence_saved_and_loaded_keeps_its_approximate_cells_apart(tiny_engine):
    """The mark travels with a saved state: a reloaded copy of a spliced sequence does not offer its moved
    cells for reuse (they were reused as exact: 0.19 off a fresh prefill) and its rebase is as exact."""
    toks = text_tokens(tiny_engine, 150, seed=35)
    with tiny_engine.sequence(toks) as s:
        rb = s.prepare_rebase(10, text_tokens(tiny_engine, 12, seed=36), 60, mode="splice")
        assert rb.wait(timeout=30)
        s.commit_rebase(rb)
        now = s.tokens
        with tiny_engine.load_sequence(s.save_state()) as loaded:
            assert loaded.spliced
            rb = loaded.prepare_rebase(5, now[5:80] + [7, 8, 9], 80)
            assert rb.wait(timeout=30)
            info = loaded.commit_rebase(rb)
            assert info["reused_tokens"] == 17                     # 5..21, not the moved cells after them
            expect = now[:5] + now[5:80] + [7, 8, 9] + now[80:]
            with tiny_engine.sequence(expect) as fresh:
                assert_logits_close(loaded.logits(), fresh.logits())
        with tiny_engine.sequence(toks) as exact:                  # an exact sequence reloads exact
            with tiny_engine.load_sequence(exact.save_state()) as loaded:
                assert not loaded.spliced


def test_a_splice_that_replaces_nothing_leaves_the_sequence_exact(tiny_engine):
    toks = text_tokens(tiny_engine, 100, seed=40)
    with tiny_engine.sequence(toks) as s:
        rb = s.prepare_rebase(10, toks[10:40], 40, mode="splice")   # the span itself: all reused, nothing moves
        assert rb.wait(timeout=30)
        s.commit_rebase(rb)
        assert s.tokens == toks and not s.spliced


def test_background_generation_shares_batches_with_foreground(tiny_engine):
    prompt_a = text_tokens(tiny_engine, 50, seed=23)
    prompt_b = text_tokens(tiny_engine, 50, seed=24)
    with tiny_engine.sequence(prompt_a) as a, tiny_engine.sequence(prompt_b) as b, \
            tiny_engine.sequence(prompt_b) as b_ref:
        expected = b_ref.generate(40)
        before = tiny_engine.stats()
        job = b.generate_background(40)
        fg = a.generate(60)
        result = job.result(timeout=60)
        after = tiny_engine.stats()
        assert result == expected, "background greedy differs from foreground greedy"
        assert b.tokens == prompt_b + expected
        assert after["mixed_batches"] > before["mixed_batches"]
        assert job.mixed_steps > 0
        assert after["rows"]["background"] - before["rows"]["background"] >= len(result)
        assert len(fg) > 0


def test_background_prefill_bounded_per_step(tiny_model_path):
    with pk.Engine(tiny_model_path, n_ctx=2048, n_seq_max=4, background_chunk=16, background_chunk_busy=4) as eng:
        with eng.sequence(text_tokens(eng, 20)) as a, eng.sequence(text_tokens(eng, 5)) as b:
            job = b.append_background(text_tokens(eng, 400, seed=3))
            a.generate(30)
            job.result(timeout=60)
            st = eng.stats()
            assert st["rows"]["background"] == 400
            # 400 background rows in chunks of <= 16 (<= 4 next to a foreground token)
            assert st["decode_calls"] >= 25
            assert job.mixed_steps > 0 and job.rows_decoded == 400
            assert len(b) == 405


def test_cancel_background_job(tiny_engine):
    with tiny_engine.sequence(text_tokens(tiny_engine, 30)) as s:
        job = s.generate_background(1500)
        time.sleep(0.05)
        job.cancel()
        out = job.result(timeout=30)
        assert job.finish_reason in ("cancelled", "length", "stop", "context_full")
        assert job.finish_reason == "cancelled" or len(out) < 1500
        assert s.tokens[30:] == out
        s.append([5])  # the sequence is usable again


def test_stream_close_cancels(tiny_engine):
    with tiny_engine.sequence(text_tokens(tiny_engine, 30)) as s:
        it = s.stream(500)
        got = [next(it) for _ in range(3)]
        it.close()
        assert s.tokens[:33] == s.tokens[:30] + got
        s.append([7])


def test_sequence_busy_while_job_runs(tiny_engine):
    with tiny_engine.sequence(text_tokens(tiny_engine, 30)) as s:
        job = s.generate_background(1500)
        with pytest.raises(pk.SequenceBusyError):
            s.append([1])
        job.cancel()
        job.result(timeout=30)


def test_exact_rebase_with_default_attention_kernels(tiny_model_path):
    """The engine's default configuration (flash attention as llama.cpp decides): same contract, with
    the looser tolerance of half-precision accumulation; the next greedy tokens must agree."""
    from test_engine_basics import FLASH_ATOL

    with pk.Engine(tiny_model_path, n_ctx=2048, n_seq_max=4) as eng:
        toks = text_tokens(eng, 300, seed=31)
        repl = text_tokens(eng, 40, seed=32)
        with eng.sequence(toks) as s:
            rb = s.prepare_rebase(20, repl, 200)
            s.append(text_tokens(eng, 10, seed=33))
            s.commit_rebase(rb)
            with eng.sequence(s.tokens) as fresh:
                assert_logits_close(s.logits(), fresh.logits(), atol=FLASH_ATOL)
                assert s.generate(8) == fresh.generate(8)


def test_background_jobs_queue_on_one_sequence(tiny_engine):
    """A summary's prompt prefill then its generation: background jobs on one sequence run in order;
    a foreground call on it meanwhile is refused, not interleaved."""
    base = text_tokens(tiny_engine, 20, seed=40)
    prompt = text_tokens(tiny_engine, 150, seed=41)
    with tiny_engine.sequence(base) as s, tiny_engine.sequence(base + prompt) as ref:
        expected = ref.generate(12)
        prefill = s.append_background(prompt)
        gen = s.generate_background(12)
        with pytest.raises(pk.SequenceBusyError, match="queue"):
            s.append([1])
        assert gen.result(timeout=60) == expected
        assert prefill.done() and s.tokens == base + prompt + expected
    with tiny_engine.sequence() as empty:  # queued generation on a sequence that the queued prefill fills
        empty.append_background(base)
        assert len(empty.generate_background(3).result(timeout=60)) <= 3
    with tiny_engine.sequence(base) as s:  # closing the sequence ends queued jobs too
        s.append_background(prompt)
        queued = s.generate_background(50)
    with pytest.raises(pk.SequenceClosedError):
        queued.result(timeout=30)


def test_a_background_job_on_a_deadline_takes_its_own_rows_next_to_foreground(tiny_model_path):
    """``set_rows_per_step``: a background job may take more rows per step than the busy chunk (4 here)
    while the foreground decodes, so it is done in fewer shared steps."""
    with pk.Engine(tiny_model_path, n_ctx=2048, n_seq_max=4, background_chunk=16, background_chunk_busy=4) as eng:
        mixed = {}
        for rows in (0, 40):
            with eng.sequence(text_tokens(eng, 20)) as a, eng.sequence(text_tokens(eng, 5)) as b:
                job = b.append_background(text_tokens(eng, 400, seed=3))
                job.set_rows_per_step(rows)
                a.generate(150)
                job.result(timeout=60)
                assert job.rows_decoded == 400 and len(b) == 405
                mixed[rows] = job.mixed_steps
        # 400 rows next to the foreground's tokens: >= 100 shared steps at 4 rows (the foreground's 150
        # steps outlast them), <= 10 at 40 (+1: the budget is set after the job was queued)
        assert mixed[0] >= 60, mixed
        assert 0 < mixed[40] <= 11, mixed


@pytest.mark.parametrize("bad", [-1, 1.5, "8", True, None])
def test_rows_per_step_is_checked(tiny_engine, bad):
    with tiny_engine.sequence(text_tokens(tiny_engine, 5)) as s:
        job = s.append_background(text_tokens(tiny_engine, 10))
        with pytest.raises(ValueError, match="rows_per_step"):
            job.set_rows_per_step(bad)
        job.result(timeout=30)


def test_a_rebase_prepared_before_another_was_committed_is_superseded(tiny_engine):
    """Two preparations of one sequence: committing the first makes the second stale. Waiting on it or
    committing it raises the typed error (an EngineError too); the sequence keeps the first rebase's tokens."""
    toks = text_tokens(tiny_engine, 60, seed=21)
    with tiny_engine.sequence(toks) as s:
        first = s.prepare_rebase(5, [7, 8, 9], 40)
        second = s.prepare_rebase(5, [10, 11], 40)
        first.wait()
        s.commit_rebase(first)
        after = list(s.tokens)
        assert after == toks[:5] + [7, 8, 9] + toks[40:]
        with pytest.raises(pk.RebaseSupersededError, match="superseded"):
            second.wait(timeout=10)
        with pytest.raises(pk.RebaseSupersededError, match="superseded"):
            s.commit_rebase(second)
        assert isinstance(pk.RebaseSupersededError("x"), pk.EngineError)
        assert s.tokens == after
