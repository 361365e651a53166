"""The server's edge cases, on the tiny float model: broken or unusual tool
schemas, function names, seeds, error params, docs behind the key, startup validation, usage accounting,
disconnects (plain and streamed)."""
from __future__ import annotations

import logging

import httpx
import pytest

import pykvcompact as pk
from test_server_support import API_KEY, running_server

H = {"Authorization": f"Bearer {API_KEY}"}
USER = [{"role": "user", "content": "Book it."}]


@pytest.fixture(scope="module")
def float_engine(tmp_path_factory):
    from tiny_model import make_tiny_gguf

    path = make_tiny_gguf(tmp_path_factory.mktemp("srvmodel") / "tiny.gguf", seed=0)
    eng = pk.Engine(path, n_ctx=8192, n_seq_max=32, n_threads=1, flash_attn=False)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def srv(float_engine, tmp_path_factory):
    with running_server(float_engine, tmp_path_factory.mktemp("review")) as s:
        yield s


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def asgi_errors():
    """What uvicorn logs as unhandled (the catch-all path, which also resets the connection)."""
    h = _Records()
    logs = [logging.getLogger(n) for n in ("uvicorn.error", "pykvcompact.server")]
    for lg in logs:
        lg.addHandler(h)
    yield h.messages
    for lg in logs:
        lg.removeHandler(h)


def _tool(name="book", parameters=None):
    return {"type": "function", "function": {"name": name, "parameters": parameters or {"type": "object"}}}


def _post(srv, body, **kw):
    with httpx.Client(base_url=srv.base_url, headers=H, timeout=120) as c:
        return c.post("/chat/completions", json=body, **kw)


@pytest.mark.parametrize("parameters, field", [
    ({"type": "object", "properties": ["city", "date"]}, "properties"),
    ({"type": "object", "properties": {"city": {"type": "string"}}, "required": 5}, "required"),
    ({"type": "object", "properties": {"city": "string"}}, "properties.city"),
    ({"type": "object", "properties": {"city": {"type": "text"}}}, "properties.city"),
])
@pytest.mark.parametrize("choice", ["auto", "required"])
def test_broken_tool_schema_is_a_400_naming_the_tool(srv, asgi_errors, parameters, field, choice):
    r = _post(srv, {"messages": USER, "max_tokens": 4, "tools": [_tool("book_flight", parameters)],
                    "tool_choice": choice})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"].startswith("tools[0].function"), err
    assert "book_flight" in err["message"] and field in err["message"], err
    assert not any("Exception in ASGI application" in m or "unexpected error" in m for m in asgi_errors)


def test_nullable_union_type_is_accepted_with_a_forced_call(srv, asgi_errors):
    params = {"type": "object", "properties": {"x": {"type": ["string", "null"]}, "n": {"type": ["integer", "null"]}},
              "required": ["x", "n"]}
    r = _post(srv, {"messages": USER, "max_tokens": 60, "temperature": 0, "tools": [_tool("f", params)],
                    "tool_choice": "required"})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "tool_calls", r.text
    assert not asgi_errors


def test_union_with_a_nested_type_falls_back_to_any_flat_object():
    from pykvcompact.server.tool_grammar import forced_call_grammar
    g = forced_call_grammar([_tool("f", {"type": "object", "properties": {"n": {"type": ["integer", "array"]}}})], "f")
    assert "call0 ::=" in g and "flatobj0 " in g.split("call0 ::=")[1].splitlines()[0]


def test_grammar_failure_is_an_api_error_not_the_catch_all(srv, asgi_errors, monkeypatch):
    """Anything the grammar builder raises on client input comes back as a 400 (no traceback, no reset)."""
    import pykvcompact.server.turn as turn_mod

    def broken(tools, name):
        raise TypeError("unhashable type: 'list'")
    monkeypatch.setattr(turn_mod, "forced_call_grammar", broken)
    with httpx.Client(base_url=srv.base_url, headers=H, timeout=120) as c:
        r = c.post("/chat/completions", json={"messages": USER, "max_tokens": 4, "tools": [_tool()],
                                               "tool_choice": "required"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
        assert c.get("/models").status_code == 200  # the keep-alive connection survived
    assert not any("Exception in ASGI application" in m for m in asgi_errors)


@pytest.mark.parametrize("name", ['a"b\\c', "has space", "x" * 65, "", "naïve"])
def test_function_names_follow_openai_pattern(srv, name):
    r = _post(srv, {"messages": USER, "max_tokens": 4, "tools": [_tool(name)], "tool_choice": "required"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tools[0].function.name"


@pytest.mark.parametrize("seed", [2 ** 63, 2 ** 64, 2 ** 70, -1])
def test_out_of_range_seed_is_a_400(srv, seed):
    r = _post(srv, {"messages": USER, "max_tokens": 4, "seed": seed})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "seed"


@pytest.mark.parametrize("field, value", [("top_k", -1), ("top_k", 2 ** 31), ("top_k", 1.5), ("top_k", True),
                                          ("top_k", "5"), ("min_p", 1.0), ("min_p", -0.5)])
def test_out_of_range_top_k_or_min_p_is_a_400(srv, field, value):
    r = _post(srv, {"messages": USER, "max_tokens": 2, field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


def test_top_k_and_min_p_reach_the_sampler(float_engine, tmp_path):
    # (a server of its own: the module's shared one keeps every conversation's session, and its cells)
    with running_server(float_engine, tmp_path) as own:
        greedy = _post(own, {"messages": USER, "max_tokens": 6, "temperature": 0, "top_k": None, "min_p": None})
        one = _post(own, {"messages": USER, "max_tokens": 6, "temperature": 1.5, "top_k": 1, "min_p": 0.05,
                          "seed": 9})
        assert greedy.status_code == one.status_code == 200, one.text   # (null: off)
        # one candidate left: the draw is the argmax
        assert one.json()["choices"][0]["message"] == greedy.json()["choices"][0]["message"]


def test_largest_seed_is_accepted(srv):
    r = _post(srv, {"messages": USER, "max_tokens": 2, "seed": 2 ** 63 - 1, "temperature": 0.7})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("body, param, status", [
    (b"{not json", None, 400),
    (b'{"messages": [{"role": "user", "content": 5}]}', "messages[0].content", 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "tool_choice": "bogus"}', "tool_choice", 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "a", "parameters": 3}}]}',
     "tools[0].function.parameters", 400),
])
def test_error_params_are_openai_style(srv, body, param, status):
    with httpx.Client(base_url=srv.base_url, headers=H | {"Content-Type": "application/json"}) as c:
        r = c.post("/chat/completions", content=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param, r.text


SEVEN = {"type": "object", "properties": {k: {"type": "string"} for k in
                                           ("origin", "destination", "date", "passenger", "cabin", "airline", "note")},
         "required": ["origin", "destination", "date", "passenger", "cabin", "airline", "note"]}


def test_forced_call_longer_than_a_chunk_is_refused_clearly(srv):
    """The grammar restarts at each generation chunk: a forced call that may not fit one chunk (64 tokens)
    would repeat its opening and never parse; it is refused up front instead."""
    r = _post(srv, {"messages": USER, "max_tokens": 400, "temperature": 0, "tools": [_tool("book_flight", SEVEN)],
                    "tool_choice": "required"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "forced_call_too_long" and err["param"] == "tool_choice"
    assert "book_flight" in err["message"] and "64" in err["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_forced_call_that_fits_one_chunk_is_a_whole_call(float_engine, tmp_path, stream):
    """With a chunk big enough, the 7-argument call comes back parsed with every argument (plain and
    streamed), each string within its bound."""
    from test_server_support import client
    with running_server(float_engine, tmp_path, chunk_tokens=400) as s:
        kw = dict(model="m", messages=USER, max_tokens=400, temperature=0, tools=[_tool("book_flight", SEVEN)],
                  tool_choice="required")
        if stream:
            chunks = list(client(s).chat.completions.create(stream=True, **kw))
            calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
            finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        else:
            r = client(s).chat.completions.create(**kw)
            calls, finish = r.choices[0].message.tool_calls or [], [r.choices[0].finish_reason]
        said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) if stream else r
        assert finish == ["tool_calls"] and len(calls) == 1, (finish, calls, said)
        import json
        args = json.loads(calls[0].function.arguments)
        assert calls[0].function.name == "book_flight" and list(args) == SEVEN["required"]


def test_forced_call_grammar_bounds_strings_to_the_budget():
    from pykvcompact.server.tool_grammar import CallTooLong, forced_call_grammar
    tools = [_tool("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})]
    assert "{0,48}" in forced_call_grammar(tools, "*")
    assert r'[^"\\\x00-\x1f]' in forced_call_grammar(tools, "*")  # no raw control characters (invalid JSON)
    g = forced_call_grammar(tools, "*", 64, lambda s: len(s) // 3)  # about 3 characters a token
    cap = int(g.split("]{0,")[1].split("}")[0])
    assert 8 <= cap < 48
    fixed = len('<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>')
    assert fixed // 3 + cap + 2 <= 64
    with pytest.raises(CallTooLong):
        forced_call_grammar([_tool("book_flight", SEVEN)], "book_flight", 64, len)


def test_a_window_the_policy_cannot_use_stops_the_server_at_startup(float_engine, tmp_path):
    """``serve --mode fixed --window 1024`` used to start and then refuse every chat with a 400."""
    from pykvcompact.server import ServerConfig, ServerThread
    cfg = ServerConfig(model="tiny", port=0, n_ctx=float_engine.n_ctx, history_dir=str(tmp_path), mode="fixed",
                       window=1024)
    before = float_engine.used_cells()
    with pytest.raises(ValueError, match=r"--mode fixed --window 1024: .*too small"):
        ServerThread(cfg, float_engine)
    assert float_engine.used_cells() == before  # the throwaway session is gone
    assert not any(tmp_path.iterdir())     # and left nothing in the history dir


def test_startup_check_leaves_nothing_behind(float_engine, tmp_path):
    before = float_engine.used_cells()
    with running_server(float_engine, tmp_path) as s:
        assert s.engine.used_cells() == before
        assert httpx.get(s.base_url + "/sessions", headers=H).json()["data"] == []


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json"])
def test_docs_need_the_api_key_too(srv, path):
    url = srv.base_url.replace("/v1", path)
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(url, headers=H).status_code == 200


@pytest.fixture
def slow_generation(monkeypatch):
    """Every generated token takes 5 ms (plain and streamed), and the tokens generated are counted."""
    import time
    from pykvcompact.engine import Sequence

    counted = {"tokens": 0}
    gen, stream = Sequence.generate, Sequence.stream

    def slow_generate(self, max_tokens, **kw):
        out = gen(self, max_tokens, **kw)
        if not kw.get("stream"):
            time.sleep(0.005 * len(out))
            counted["tokens"] += len(out)
        return out

    def slow_stream(self, max_tokens, **kw):
        it = stream(self, max_tokens, **kw)

        def gen_():
            try:
                for t in it:
                    time.sleep(0.005)
                    counted["tokens"] += 1
                    yield t
            finally:
                it.close()
        return gen_()

    monkeypatch.setattr(Sequence, "generate", slow_generate)
    monkeypatch.setattr(Sequence, "stream", slow_stream)
    return counted


def _wait_released(s, sid, timeout):
    """Seconds until conversation ``sid`` has no live session (None if it still has one after ``timeout``)."""
    import time
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        conv = s.registry.get(sid)
        if (conv is None or not conv.live) and (conv is None or not conv.lock.locked()):
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


LONG = {"messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 600, "temperature": 0}


@pytest.mark.parametrize("explicit", [True, False, "no-events"])
def test_plain_request_stops_generating_when_the_client_goes_away(float_engine, tmp_path, slow_generation, explicit):
    """A plain request whose client disconnects stops after its chunk in flight (it ran all 600 tokens,
    3 s here), and its conversation's session is released at once.  ``no-events``: no probe and a
    policy that starts no background work, so nothing but the chunk boundary can stop it."""
    before = float_engine.used_cells()
    extra = {"policy_overrides": {"probe_every": 10_000}, "mode": "hard"} if explicit == "no-events" else {}
    explicit = explicit is True
    with running_server(float_engine, tmp_path, **extra) as s:
        headers = H | ({"X-Session-Id": "cut-plain"} if explicit else {})
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(s.base_url + "/chat/completions", json=LONG, headers=headers, timeout=0.6)
        sid = "cut-plain" if explicit else None
        if sid is None:
            import time
            time.sleep(0.1)
            live = [c for c in s.registry.list() if c.live or c.lock.locked()]
            sid = live[0].id if live else "none"
        waited = _wait_released(s, sid, timeout=10)
        assert waited is not None and waited < 1.5, waited
        assert slow_generation["tokens"] < 400, slow_generation
        assert s.engine.used_cells() == before
        if explicit:
            info = httpx.get(s.base_url + "/sessions/cut-plain", headers=H).json()
            assert info["live"] is False and info["messages"] == 0
            assert any(e.get("reason") == "abandoned" for e in info["events"])
        else:
            assert s.registry.list() == []  # nothing can ever match it again: forgotten altogether


@pytest.mark.parametrize("explicit", [True, False])
def test_cut_stream_releases_its_session_at_once(float_engine, tmp_path, slow_generation, explicit):
    before = float_engine.used_cells()
    with running_server(float_engine, tmp_path) as s:
        headers = H | ({"X-Session-Id": "cut-stream"} if explicit else {})
        with httpx.Client(base_url=s.base_url, headers=headers, timeout=60) as c:
            with c.stream("POST", "/chat/completions", json=LONG | {"stream": True}) as r:
                for i, _ in enumerate(r.iter_lines()):
                    if i > 10:
                        break  # the client cuts the stream
        import time
        time.sleep(0.1)
        sid = "cut-stream" if explicit else next((c.id for c in s.registry.list()), "none")
        waited = _wait_released(s, sid, timeout=10)
        assert waited is not None and waited < 1.5, waited
        assert s.engine.used_cells() == before, "the cut conversation's session still holds cells"
        if explicit:
            info = httpx.get(s.base_url + "/sessions/cut-stream", headers=H).json()
            assert info["live"] is False and info["messages"] == 0
        else:
            assert s.registry.list() == []


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_tokens_is_the_whole_prompt_with_cached_tokens_apart(float_engine, tmp_path, stream):
    """OpenAI's meaning: ``prompt_tokens`` is the prompt's full length; the part already in the KV cache is
    ``prompt_tokens_details.cached_tokens`` (it used to be only what this request prefilled)."""
    from test_server_support import client
    with running_server(float_engine, tmp_path) as s:
        c = client(s)
        msgs = [{"role": "system", "content": "You are concise."}, {"role": "user", "content": "First question."}]
        usages = []
        for turn in range(2):
            kw = dict(model="m", messages=msgs, max_tokens=8, temperature=0, user="usage")
            if stream:
                chunks = list(c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
                reply = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
                usages.append(chunks[-1].usage)
            else:
                r = c.chat.completions.create(**kw)
                reply, _ = r.choices[0].message.content, usages.append(r.usage)
            after = s.registry.get("usage").session.n_tokens
            u = usages[-1]
            # the session now holds the prompt, the reply and the reply's end-of-turn tokens
            assert 0 <= after - (u.prompt_tokens + u.completion_tokens) <= 4, (after, u)
            assert u.total_tokens == u.prompt_tokens + u.completion_tokens
            msgs = msgs + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
        u1, u2 = usages
        assert u1.prompt_tokens_details.cached_tokens == 0
        assert u2.prompt_tokens > u1.prompt_tokens + u1.completion_tokens
        assert u2.prompt_tokens_details.cached_tokens >= u1.prompt_tokens + u1.completion_tokens
