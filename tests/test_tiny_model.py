"""The random-weight tiny GGUF loads in llama.cpp, with SmolLM2's tokenizer and seeded logits."""

from __future__ import annotations

import numpy as np
import pytest

from tiny_model import llama_no_extra_bufts, make_tiny_gguf

llama_cpp = pytest.importorskip("llama_cpp")

PROMPT = b"<|im_start|>user\nHello, tiny model! What is 2 + 2?<|im_end|>\n"


def _last_logits(path) -> np.ndarray:
    llm = llama_no_extra_bufts(path, n_ctx=512, n_threads=1, n_threads_batch=1, verbose=False)
    try:
        toks = llm.tokenize(PROMPT, add_bos=False, special=True)
        llm.eval(toks)
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()
    finally:
        llm.close()


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return make_tiny_gguf(d / "a.gguf", seed=0), make_tiny_gguf(d / "b.gguf", seed=1)


def test_file_loads_with_real_tokenizer(tiny_paths):
    llm = llama_no_extra_bufts(tiny_paths[0], n_ctx=512, n_threads=1, verbose=False)
    try:
        assert llm.n_vocab() == 49152
        assert llm.metadata["llama.context_length"] == "8192"
        assert llm.metadata["general.architecture"] == "llama"
        assert "<|im_start|>" in llm.metadata["tokenizer.chat_template"]
        toks = llm.tokenize(PROMPT, add_bos=False, special=True)
        assert toks[0] == 1  # <|im_start|> is one special token, as in SmolLM2
        assert llm.detokenize(toks, special=True) == PROMPT
    finally:
        llm.close()


def test_logits_deterministic_per_seed(tiny_paths):
    a1 = _last_logits(tiny_paths[0])
    a2 = _last_logits(tiny_paths[0])
    b = _last_logits(tiny_paths[1])
    assert np.isfinite(a1).all() and a1.std() > 0
    np.testing.assert_array_equal(a1, a2)
    assert not np.allclose(a1, b)


def test_same_seed_same_file(tmp_path):
    a = make_tiny_gguf(tmp_path / "x.gguf", seed=3, n_layer=1)
    b = make_tiny_gguf(tmp_path / "y.gguf", seed=3, n_layer=1)
    c = make_tiny_gguf(tmp_path / "z.gguf", seed=4, n_layer=1)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
