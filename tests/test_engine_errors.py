"""Bad input gives a clear Python exception; the process stays alive and the engine usable."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys

import pytest

import pykvcompact as pk
from conftest import text_tokens


def assert_usable(eng):
    with eng.sequence(text_tokens(eng, 8)) as s:
        assert len(s.generate(3)) <= 3


def test_missing_model_file(tmp_path):
    with pytest.raises(pk.ModelNotFoundError, match="does-not-exist"):
        pk.Engine(tmp_path / "does-not-exist.gguf")


def test_non_gguf_file(tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("this is not a model")
    with pytest.raises(pk.InvalidModelError, match="GGUF"):
        pk.Engine(bad)


def test_truncated_gguf_is_refused_not_crashing(tmp_path, tiny_model_path):
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(tiny_model_path.read_bytes()[:100_000])
    with pytest.raises((ValueError, pk.EngineError), match="could not load"):
        pk.Engine(bad)


def test_bad_engine_arguments(tiny_model_path):
    with pytest.raises(ValueError, match="n_seq_max"):
        pk.Engine(tiny_model_path, n_seq_max=0)
    with pytest.raises(ValueError, match="n_ctx"):
        pk.Engine(tiny_model_path, n_ctx=1)
    with pytest.raises(TypeError, match="n_ctx"):
        pk.Engine(tiny_model_path, n_ctx="big")


def test_token_ids_out_of_range(tiny_engine):
    with tiny_engine.sequence(text_tokens(tiny_engine, 4)) as s:
        with pytest.raises(ValueError, match="out of range"):
            s.append([1, tiny_engine.n_vocab])
        with pytest.raises(ValueError, match="out of range"):
            s.append([-3])
        with pytest.raises(ValueError, match="out of range"):
            tiny_engine.sequence([10**6])
        with pytest.raises(ValueError, match="out of range"):
            s.prepare_rebase(0, [tiny_engine.n_vocab + 5], 2)
        with pytest.raises(ValueError, match="out of range"):
            tiny_engine.detokenize([tiny_engine.n_vocab])
        with pytest.raises(TypeError, match="tokenize"):
            s.append("some text")
        with pytest.raises(TypeError):
            s.append([1.5])
        assert len(s) == 4
    assert_usable(tiny_engine)


def test_all_slots_in_use(fresh_tiny_engine):
    eng = fresh_tiny_engine
    seqs = [eng.sequence(text_tokens(eng, 3)) for _ in range(eng.n_seq_max)]
    with pytest.raises(pk.SlotsExhaustedError, match="n_seq_max"):
        eng.sequence()
    with pytest.raises(pk.SlotsExhaustedError):
        seqs[0].fork()
    with pytest.raises(pk.SlotsExhaustedError):
        seqs[0].probe(text_tokens(eng, 3))  # a probe needs a slot for its fork
    assert seqs[0].tokens == seqs[0].tokens[:3]
    seqs.pop().close()
    with eng.sequence([1, 2]) as s:  # the freed slot is reused
        assert len(s) == 2
    for s in seqs:
        s.close()
    assert eng.used_cells() == 0
    assert_usable(eng)


def test_prompt_longer_than_n_ctx(fresh_tiny_engine):
    eng = fresh_tiny_engine
    with pytest.raises(pk.ContextFullError, match="n_ctx"):
        eng.sequence(text_tokens(eng, 300))
    assert eng.used_cells() == 0
    with eng.sequence(text_tokens(eng, 200)) as s:
        with pytest.raises(pk.ContextFullError):
            s.append(text_tokens(eng, 80))
        assert len(s) == 200
        # cells are one pool: a second sequence cannot take more than what is free
        with eng.sequence() as t:
            with pytest.raises(pk.ContextFullError, match="free"):
                t.append(text_tokens(eng, 100))
            assert len(t) == 0
        # generation stops cleanly at the end of the pool
        job = s.generate_background(500)
        out = job.result(timeout=30)
        assert job.finish_reason in ("context_full", "stop")
        assert len(s) == 200 + len(out) <= eng.n_ctx
    assert_usable(eng)


def test_truncate_past_end_and_bad_values(tiny_engine):
    with tiny_engine.sequence(text_tokens(tiny_engine, 10)) as s:
        with pytest.raises(IndexError, match="only 10"):
            s.truncate(11)
        with pytest.raises(ValueError):
            s.truncate(-1)
        with pytest.raises(ValueError, match="max_tokens"):
            s.generate(-5)
        with pytest.raises(ValueError, match="temperature"):
            s.generate(2, temperature=-1.0)
        with pytest.raises(ValueError, match="top_p"):
            s.generate(2, temperature=0.5, top_p=0.0)
        with pytest.raises(ValueError, match="top_k"):
            s.generate(2, temperature=0.5, top_k=-1)
        with pytest.raises(TypeError, match="top_k"):
            s.generate(2, temperature=0.5, top_k=2.5)
        for bad in (-0.1, 1.0, float("nan")):
            with pytest.raises(ValueError, match="min_p"):
                s.generate(2, temperature=0.5, min_p=bad)
        with pytest.raises(TypeError, match="min_p"):
            s.generate(2, temperature=0.5, min_p="0.1")
        with pytest.raises(ValueError, match="labels"):
            s.probe([1], labels=("ONLY",))
        assert len(s) == 10
    with tiny_engine.sequence() as empty:
        with pytest.raises(ValueError, match="empty"):
            empty.generate(3)
        with pytest.raises(ValueError, match="empty"):
            empty.logits()


def test_use_after_close(tiny_engine):
    s = tiny_engine.sequence(text_tokens(tiny_engine, 5))
    f = s.fork()
    s.close()
    s.close()  # idempotent
    for call in (lambda: s.tokens, lambda: s.append([1]), lambda: s.generate(2), lambda: s.fork(),
                 lambda: s.truncate(1), lambda: s.probe([1]), lambda: s.logits(), lambda: len(s)):
        with pytest.raises(pk.SequenceClosedError):
            call()
    assert len(f.tokens) == 5  # the fork still has its cells
    f.close()
    assert_usable(tiny_engine)


def test_engine_closed(tiny_model_path):
    eng = pk.Engine(tiny_model_path, n_ctx=128, n_seq_max=2)
    s = eng.sequence([1, 2, 3])
    job = s.generate_background(100)
    eng.close()
    eng.close()
    with pytest.raises(pk.EngineError, match="closed"):
        eng.sequence()
    with pytest.raises(pk.EngineError):
        s.append([1])
    assert job.done()


def test_concurrent_calls_from_threads(tiny_engine):
    def worker(i):
        with tiny_engine.sequence(text_tokens(tiny_engine, 20, seed=i)) as s:
            out = s.generate(10)
            p = s.probe(text_tokens(tiny_engine, 5, seed=100 + i))
            with s.fork() as f:
                f.append([1, 2, 3])
            s.truncate(15)
            return len(out), round(sum(p.values()), 6), len(s)

    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:  # 2 slots each: 6 of 8
        results = list(pool.map(worker, range(12)))
    assert all(r[1] == 1.0 and r[2] == 15 for r in results)
    assert_usable(tiny_engine)


def test_concurrent_use_of_one_sequence_is_refused_or_serialised(tiny_engine):
    with tiny_engine.sequence(text_tokens(tiny_engine, 20)) as s:
        errors = []

        def gen():
            try:
                s.generate(20)
            except pk.SequenceBusyError as e:
                errors.append(e)

        threads = [threading_thread(gen) for _ in range(4)]
        for t in threads:
            t.join()
        assert s.pos_range() == (0, len(s) - 1)
        assert len(s) == 20 + 20 * (4 - len(errors)) or len(s) <= 20 + 80


def threading_thread(fn):
    import threading

    t = threading.Thread(target=fn)
    t.start()
    return t


def test_process_survives_everything_above_in_a_subprocess(tiny_model_path, tmp_path):
    """A GGML assert would abort the process: run the nastiest calls in a child and check it exits 0."""
    code = f"""
import pykvcompact as pk
eng = pk.Engine({str(tiny_model_path)!r}, n_ctx=64, n_seq_max=2)
s = eng.sequence([1, 2, 3])
for bad in ([10**7], [-1]):
    try: s.append(bad)
    except ValueError: pass
try: s.truncate(99)
except IndexError: pass
try: s.prepare_rebase(2, [1], 1)
except ValueError: pass
try: eng.sequence(list(range(100)))
except Exception: pass
t = eng.sequence([4])
try: eng.sequence()
except pk.SlotsExhaustedError: pass
print("alive", s.generate(3) is not None)
"""
    # cwd outside the checkout: `python -c` puts cwd first on sys.path, and the source tree has no
    # compiled module; the child must import the installed package like the test process does.
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "alive True" in r.stdout
