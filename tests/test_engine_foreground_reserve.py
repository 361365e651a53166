"""A foreground append accepted when submitted runs to its end: background work never takes the cells it
was promised (KvBook::reserve), so the pool cannot run out half-way and leave a partial prompt."""
from __future__ import annotations

import gc
import time

import pytest

import pykvcompact as pk
from pykvcompact.engine.sequence import FOREGROUND
from conftest import text_tokens


def _engine(path):
    # a long append takes several steps (llama.cpp raises n_batch 16 to its minimum), a background row joins each
    return pk.Engine(path, n_ctx=512, n_seq_max=4, n_batch=16, n_threads=1, seed=0, flash_attn=False,
                     background_share=1.0)


def _running(job, tokens=2, timeout=30.0):
    t0 = time.monotonic()
    while len(job.tokens) < tokens and not job.done() and time.monotonic() - t0 < timeout:
        time.sleep(0.005)
    assert not job.done(), "the background generation ended before the test could race it"


def test_a_foreground_append_gets_every_cell_it_was_accepted_with(tiny_model_path):
    eng = _engine(tiny_model_path)
    try:
        main = eng.sequence(text_tokens(eng, 40, seed=1))
        bg = eng.sequence(text_tokens(eng, 20, seed=2))
        job = bg.generate_background(10_000)   # would take every free cell, one a step
        _running(job)
        pool = text_tokens(eng, eng.n_ctx, seed=3)
        for attempt in range(50):
            n = eng.free_cells() - 1             # a background row in each of the append's steps would not fit
            prompt = pool[:n]
            try:
                main.append(prompt)              # before: ContextFullError half-way, a partial prompt
                break
            except pk.ContextFullError:
                # refused when submitted (the background took a cell since free_cells): all or nothing
                assert len(main) == 40, f"a refused append left {len(main) - 40} of its tokens"
        else:
            pytest.fail("every append was refused")
        assert len(main) == 40 + n and main.tokens[40:] == prompt
        job.result(timeout=60)
        assert job.finish_reason == "context_full"
        assert eng.used_cells() <= eng.n_ctx
        bg.close()
        assert len(main.generate(3)) == 3        # and the main sequence goes on
    finally:
        eng.close()


def test_an_append_larger_than_what_others_were_promised_is_refused_whole(tiny_model_path):
    eng = _engine(tiny_model_path)
    try:
        a = eng.sequence(text_tokens(eng, 8, seed=4))
        b = eng.sequence(text_tokens(eng, 8, seed=5))
        free = eng.free_cells()
        job = a.append_background(text_tokens(eng, 16, seed=6))   # (background: promised nothing)
        job.result(timeout=60)
        with pytest.raises(pk.ContextFullError, match="cells"):
            b.append(text_tokens(eng, free, seed=7))   # more than is free now: refused before anything runs
        assert len(b) == 8
    finally:
        eng.close()


def test_a_second_append_that_the_first_leaves_no_room_for_is_refused_whole(tiny_model_path):
    # two conversations append at once (two server sessions): each fit the pool alone, not together.
    # Before, both were accepted and the later one ran out of cells half-way, keeping part of its prompt
    eng = _engine(tiny_model_path)
    try:
        a = eng.sequence(text_tokens(eng, 8, seed=1))
        b = eng.sequence(text_tokens(eng, 8, seed=2))
        free = eng.free_cells()
        first, second = text_tokens(eng, free - 100, seed=3), text_tokens(eng, 200, seed=4)
        native = eng.native()
        job = native.seq_append(a.id, first, 0, False)   # submitted, not waited for (the engine's own call)
        with pytest.raises(pk.ContextFullError, match="promised"):
            native.seq_append(b.id, second, 0, False)
        job.wait(60)
        assert len(a) == 8 + len(first) and len(b) == 8
        b.append(second[:90])                            # what is left is still there to take
        assert len(b) == 98
    finally:
        eng.close()


def _every_free_cell_is_usable(eng):
    """A background generation fills the pool to n_ctx, and an append of all the free cells is taken."""
    s = eng.sequence(text_tokens(eng, 4, seed=9))
    job = s.generate_background(100_000)
    job.result(timeout=60)
    assert job.finish_reason == "context_full" and eng.used_cells() == eng.n_ctx
    s.close()
    free = eng.free_cells()
    s = eng.sequence()
    s.append(text_tokens(eng, free, seed=8))
    assert len(s) == free
    s.close()


def test_an_append_refused_on_a_busy_sequence_promises_nothing(tiny_model_path):
    eng = _engine(tiny_model_path)
    try:
        a = eng.sequence(text_tokens(eng, 8, seed=1))
        for _ in range(3):   # each refused call used to keep its cells promised, for good
            job = a.generate_background(50)
            with pytest.raises(pk.SequenceBusyError):
                a.append(text_tokens(eng, 100, seed=2))
            job.cancel()
            job.result(timeout=30)
        _every_free_cell_is_usable(eng)
    finally:
        eng.close()


def test_loading_a_sequence_cannot_take_the_cells_of_a_running_append(tiny_model_path):
    eng = _engine(tiny_model_path)
    try:
        c = eng.sequence(text_tokens(eng, 100, seed=3))
        blob = c.save_state()
        c.close()
        b = eng.sequence()
        prompt = text_tokens(eng, eng.free_cells() - 60, seed=4)
        job = eng.native().seq_append(b.id, prompt, 0, False)   # accepted: its cells are promised
        with pytest.raises(pk.ContextFullError, match="load"):
            eng.load_sequence(blob)
        job.wait(60)
        assert len(b) == len(prompt)
    finally:
        eng.close()


def test_an_append_after_a_last_token_without_its_cell_counts_that_cell(tiny_model_path):
    eng = _engine(tiny_model_path)
    try:
        other = eng.sequence(text_tokens(eng, 60, seed=1))   # (so that the pool, not n_ctx, is the limit)
        a = eng.sequence(text_tokens(eng, 40, seed=2))
        a.truncate(30)                   # the last token's logits are gone: it is decoded again first
        blob = a.save_state()
        a.close()
        a = eng.load_sequence(blob)      # 30 tokens, 29 cells
        prompt = text_tokens(eng, eng.free_cells(), seed=3)
        with pytest.raises(pk.ContextFullError, match="needed"):
            a.append(prompt)             # needs one cell more than is free: refused whole
        assert len(a) == 30
        a.append(prompt[:-1])
        assert len(a) == 30 + len(prompt) - 1 and len(other) == 60
    finally:
        eng.close()


def test_a_reply_keeps_the_cells_it_may_write(tiny_model_path):
    # a background generation started beside a foreground reply takes a cell each step too: before, the two
    # shared what was free and the reply ended early with context_full, half its tokens unwritten
    eng = _engine(tiny_model_path)
    try:
        main = eng.sequence(text_tokens(eng, 40, seed=1))
        bg = eng.sequence(text_tokens(eng, 20, seed=2))
        n = eng.free_cells() - 4
        free = eng.free_cells()
        reply = eng.native().seq_generate(main.id, n, 0.0, 1.0, 0, [], [], "", FOREGROUND)  # not waited for
        # what a new job can take no longer counts the reply's promise (a session sizes itself by it)
        assert eng.free_cells() <= free - n + 1 and eng.stats()["reserved_cells"] >= 0
        job = bg.generate_background(10_000)
        assert reply.wait(120)
        assert reply.finish_reason() == "length" and len(reply.tokens()) == n
        job.result(timeout=60)
        assert job.finish_reason == "context_full" and len(bg) < 20 + 4 + 1
        assert eng.used_cells() <= eng.n_ctx
        bg.close()
        _every_free_cell_is_usable(eng)   # and nothing stays promised after the reply
    finally:
        eng.close()


def test_a_reply_that_stops_early_gives_back_what_it_was_promised(tiny_model_path):
    eng = _engine(tiny_model_path)
    try:
        main = eng.sequence(text_tokens(eng, 40, seed=1))
        job = main.generate_background(1)   # (a background generation promises nothing)
        job.result(timeout=30)
        for stop in ("cancel", "close"):
            a = eng.sequence(text_tokens(eng, 8, seed=3))
            reply = eng.native().seq_generate(a.id, eng.free_cells(), 0.0, 1.0, 0, [], [], "", FOREGROUND)
            reply.wait_tokens(2, 30)
            if stop == "cancel":
                reply.cancel()
            else:
                a.close()
            assert reply.wait(30) and reply.finish_reason() != "length"   # it stopped early
            if stop == "cancel":
                a.close()
            assert eng.stats()["reserved_cells"] == 0                    # nothing stays promised
        main.close()
        _every_free_cell_is_usable(eng)
    finally:
        eng.close()


def test_a_dropped_sequence_is_closed_without_waiting_and_before_the_next_engine_call(tiny_model_path):
    # the finalizer queues the close (a collecting thread never waits for a decode); any engine call made
    # after it runs after the close, so what it reports already counts the cells given back
    eng = _engine(tiny_model_path)
    try:
        keep = eng.sequence(text_tokens(eng, 30, seed=1))
        branch = keep.fork()
        bg = branch.generate_background(10_000)               # the engine is busy decoding meanwhile
        dropped = eng.sequence(text_tokens(eng, 100, seed=2))
        handle = dropped.id
        assert handle in eng.stats()["tokens_per_sequence"]
        del dropped
        gc.collect()
        stats = eng.stats()                                    # (an engine call: it runs after the close)
        assert handle not in stats["tokens_per_sequence"] and stats["live_sequences"] == 2
        assert not bg.done()                                   # the generation beside it goes on
        bg.cancel()
        bg.result(timeout=30)
    finally:
        eng.close()
    gc.collect()                                               # a handle dropped after close: harmless
