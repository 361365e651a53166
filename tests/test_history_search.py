"""The ``search_history`` tool: the ranking and budget of a search (pure), and the session running it when
the model or the caller calls it, over the messages that compaction took out of the live context."""
from __future__ import annotations

import json

import pytest

import pykvcompact as pk
from pykvcompact.compaction.tools import history_search

from fake_engine import FakeEngine, default_responder


def _msgs():
    out = []
    for k in range(6):
        rows = "\n".join(f"ACC-{k}{j:02d} payment {j * 7} EUR total so far" for j in range(8))
        out.append((2 * k + 1, {"role": "tool", "name": "ledger_page", "content": rows}))
    out.append((13, {"role": "assistant", "content": "Settled: account ACC-305 total is 4811 EUR."}))
    return out


def test_rare_terms_outrank_common_words():
    text = history_search.search(_msgs(), "what was the total of ACC-305?", budget=400)
    lines = text.splitlines()
    assert lines[1] == "[message 11, tool (ledger_page)]" or lines[1].startswith("[message 13")
    first_hit = next(ln for ln in lines[1:] if not ln.startswith("["))
    assert "ACC-305" in first_hit  # the id decides, not "total" (on every line)
    assert "ACC-104" not in text.split("ACC-305")[0]


def test_budget_is_respected_and_more_lines_are_announced():
    count = lambda s: len(s.split())  # noqa: E731
    text = history_search.search(_msgs(), "payment EUR", budget=40, count=count)
    assert count(text.rsplit("\n(", 1)[0]) <= 40
    assert "more matching lines not shown" in text


def test_no_match_nothing_offloaded_and_empty_query():
    assert history_search.search([], "x", budget=100) == history_search.NOTHING_OFFLOADED
    assert "No compacted message matches 'zebra-9'" in history_search.search(_msgs(), "zebra-9", budget=100)
    assert "no words to search for" in history_search.search(_msgs(), "?!", budget=100)
    # a query of stop words only still searches with them
    assert history_search.terms("what was it") == ["what", "was", "it"]
    assert history_search.terms("the port of ACC-1042, src/app.py") == ["port", "acc-1042", "src/app.py"]


@pytest.mark.parametrize("args,why", [("{not json", "not valid JSON"), ("[1]", "must be an object"),
                                      ('{"query": ""}', "non-empty"), ('{"q": "x"}', "non-empty")])
def test_bad_arguments_are_explained(args, why):
    q, msg = history_search.query_of({"function": {"name": "search_history", "arguments": args}})
    assert q is None and why in msg


def _session(tmp_path, responder=None, **pol):
    eng = FakeEngine(n_ctx=8192, responder=responder)
    pol.setdefault("summary_max_tokens", 48)
    pol.setdefault("compact_tool", False)
    s = pk.Session(eng, system="You are a test.", history_dir=tmp_path,
                   policy=pk.Policy(mode=pol.pop("mode", "hard"), window=pol.pop("window", 1400), **pol))
    return eng, s


def _fill(s, n=8):
    for i in range(n):
        s.chat(f"Record {i}: the code for item-{i} is Z{i * 111}. " + " ".join(f"w{i}_{k}" for k in range(40)),
               max_tokens=16)


def test_offered_by_default_and_not_when_turned_off(tmp_path):
    _, s = _session(tmp_path / "a")
    assert history_search.NAME in [t["function"]["name"] for t in s._tools.in_effect]
    assert "search_history" in s.render()
    s.close()
    _, s = _session(tmp_path / "b", history_tool=False)
    assert s._tools.in_effect is None and "search_history" not in s.render()
    s.close()
    with pytest.raises(ValueError, match=r"history_tool must be True, False or None"):
        pk.Policy(history_tool="yes")


def test_search_finds_a_fact_compaction_took_out(tmp_path):
    _, s = _session(tmp_path)
    assert s.search_history("item-0") == history_search.NOTHING_OFFLOADED
    _fill(s)
    s.compact()
    assert s.offloaded, "the compaction offloaded nothing"
    live_text = s.render()
    assert "Z0 " not in live_text.split("summary")[-1] or True  # the fact may or may not be in the summary
    out = s.search_history("code for item-1")
    assert "Z111" in out and out.startswith("Matches for 'code for item-1'")
    idx = next(i for i, m in enumerate(s.transcript) if "item-1 is Z111" in (m.get("content") or ""))
    assert f"[message {idx}, user]" in out
    # the call and its result are in the conversation, as if the model had made it
    assert s.messages[-1]["role"] == "tool" and s.messages[-1]["name"] == "search_history"
    assert s.messages[-2]["tool_calls"][0]["function"]["name"] == "search_history"
    with pytest.raises(TypeError, match="query must be a str"):
        s.search_history(3)
    with pytest.raises(ValueError, match="only runs"):
        s.call_tool("get_weather", {})
    s.close()


def test_a_model_call_is_run_by_the_session_and_the_model_replies_again(tmp_path):
    def responder(prompt):
        tail = prompt.rsplit("<|im_start|>user\n", 1)[-1]
        if "write a summary of the conversation" in tail:
            return default_responder(prompt)
        if "which code had item-2" in tail:
            if "<|im_start|>tool" in tail:
                found = "Z222" if "Z222" in tail.rsplit("<|im_start|>tool", 1)[1] else "unknown"
                return f"The code was {found}."
            return '<tool_call>\n{"name": "search_history", "arguments": {"query": "item-2 code"}}\n</tool_call>'
        return default_responder(prompt)
    _, s = _session(tmp_path, responder=responder)
    _fill(s)
    s.compact()
    r = s.chat("which code had item-2?", max_tokens=40)
    msg = r["choices"][0]["message"]
    assert msg["content"] == "The code was Z222." and not msg.get("tool_calls")
    tool = [m for m in s.messages if m["role"] == "tool"][-1]
    assert tool["name"] == "search_history" and "Z222" in tool["content"]
    s.close()


def test_incoming_unanswered_search_call_is_answered(tmp_path):
    _, s = _session(tmp_path)
    call = {"id": "s1", "type": "function", "function": {"name": "search_history", "arguments": "{oops"}}
    s.add([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]}])
    last = s.messages[-1]
    assert last["role"] == "tool" and last["tool_call_id"] == "s1" and "not valid JSON" in last["content"]
    s.close()


def test_result_stays_within_an_eighth_of_the_window(tmp_path):
    eng, s = _session(tmp_path, window=1400)
    for i in range(10):
        s.chat("match " * 120, max_tokens=8)
    s.compact()
    out = s.search_history("match")
    assert len(eng.tokenize(out)) <= s.window // 8 + 2
    assert "more matching lines not shown" in out
    # a line longer than the budget is shown as an excerpt around its match, not dropped
    long = [(3, {"role": "tool", "content": "x " * 2000 + "KEY-77 found here " + "y " * 2000})]
    got = history_search.search(long, "KEY-77", budget=120)
    assert "KEY-77 found here" in got and got.count("...") == 2 and len(got) < 600
    s.close()


def _closed_session_log(tmp_path) -> str:
    _, s = _session(tmp_path)
    s.chat("hello", max_tokens=8)
    s.close()
    return s.log_path


def test_load_of_a_log_written_before_the_tool_keeps_it_off(tmp_path):
    log = _closed_session_log(tmp_path)
    lines = open(log).read().splitlines()
    head = json.loads(lines[0])
    assert "history_tool" in head["policy"]
    del head["policy"]["history_tool"]
    head["cur_tools"] = None
    open(log, "w").write("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    eng2 = FakeEngine(n_ctx=8192)
    s2 = pk.Session.load(eng2, log)
    assert s2.policy.history_tool is False
    s2.close()


# ---------------------------------------------------------------------------- review fixes
CALL = '<tool_call>\n{"name": "search_history", "arguments": {"query": "%s"}}\n</tool_call>'


def test_a_callers_own_tool_of_that_name_is_returned_to_the_caller(tmp_path):
    def responder(prompt):
        return CALL % "python docs" if "look it up" in prompt.rsplit("<|im_start|>user\n", 1)[-1] else "ok"
    mine = [{"type": "function", "function": {"name": "search_history", "description": "web search",
                                              "parameters": {"type": "object", "properties": {}}}}]
    for kw, tools in ((dict(), mine), (dict(history_tool=False), None)):
        _, s = _session(tmp_path / str(len(kw)), responder=responder, **kw)
        r = s.chat("look it up", max_tokens=40, tools=tools)
        calls = r["choices"][0]["message"].get("tool_calls")
        assert calls and calls[0]["function"]["name"] == "search_history", kw
        assert r["choices"][0]["finish_reason"] == "tool_calls"
        assert not any(m.get("name") == "search_history" and m["role"] == "tool" for m in s.transcript)
        s.close()


def test_earlier_searches_are_not_searched_again(tmp_path):
    _, s = _session(tmp_path)
    s.chat("Note: the deploy key is K-7731. " + "filler " * 60, max_tokens=8)
    _fill(s, 6)
    s.compact()
    s.search_history("deploy key K-7731")
    _fill(s, 6)
    s.compact()
    out = s.search_history("deploy key K-7731")
    heads = [ln for ln in out.splitlines() if ln.startswith("[message")]
    assert heads and heads[0].endswith("user]") and "search_history" not in out.split("\n", 1)[1]
    s.close()


def test_long_lines_are_excerpted_around_the_rarest_term():
    rows = json.dumps([{"account": f"ACC-{300 + k}", "total": 100 + k * 7} for k in range(40)])
    out = history_search.search([(5, {"role": "tool", "content": rows}),
                                 (7, {"role": "user", "content": "what is the total of ACC-335?"})],
                                "total of ACC-335", budget=400)
    assert '"ACC-335"' in out.split("[message 5, tool]")[1]
    up = "İ" * 200 + " SECRET-42 is here " + "x" * 300  # lower() changes the length of İ
    assert "SECRET-42" in history_search.search([(1, {"role": "tool", "content": up})], "SECRET-42", budget=400)


def test_a_long_query_never_overflows_the_budget(tmp_path):
    count = lambda s: len(s.split())  # noqa: E731
    for q in ("item-1 " + "word " * 400, "x" * 4000, "zzz " * 500):
        out = history_search.search(_msgs(), q, budget=60, count=count)
        assert count(out) <= 60, (q[:20], out[:200])
    _, s = _session(tmp_path)
    _fill(s)
    s.compact()
    out = s.search_history("code for item-1 " + "padding " * 150)
    assert "Z111" in out and len(s._ctx.tok(out)) <= s._search.budget
    assert s.messages[-1]["role"] == "tool"  # answered
    s.close()


def test_contractions_and_common_words_do_not_match_everything():
    msgs = [(1, {"role": "user", "content": "Let us plan the trip."}),
            (3, {"role": "assistant", "content": "The weather is sunny in Oslo."})]
    out = history_search.search(msgs, "what's the zebra's id?", budget=200)
    assert out.startswith("No compacted message matches")
    # a whole term: "id" does not match "idea"
    assert history_search.search([(1, {"role": "user", "content": "a good idea"})], "id", budget=99).startswith("No")


def test_offered_by_default_only_from_a_window_of_1024(tmp_path):
    for window, offered in ((600, False), (1024, True)):
        _, s = _session(tmp_path / str(window), window=window, summary_max_tokens=32)
        assert (history_search.NAME in [t["function"]["name"] for t in (s._tools.in_effect or [])]) is offered
        s.close()
    assert pk.Policy().offers_search and not pk.Policy(window=512).offers_search
    assert pk.Policy(window=512, history_tool=True).offers_search and not pk.Policy(history_tool=False).offers_search


def test_the_question_stays_raw_while_the_model_reads_a_search_result(tmp_path):
    seen = []

    def responder(prompt):
        tail = prompt.rsplit("<|im_start|>user\n", 1)[-1]
        if "write a summary of the conversation" in tail:
            return default_responder(prompt)
        if "which code had item-2" in prompt:
            if "Matches for" in prompt.rsplit("which code had item-2", 1)[-1]:
                seen.append(prompt)
                return "The code was Z222."
            return CALL % "item-2 code"
        return default_responder(prompt)
    _, s = _session(tmp_path, responder=responder)
    for i in range(30):
        s.chat(f"Record {i}: the code for item-{i} is Z{i * 111}. " + " ".join(f"w{i}_{k}" for k in range(40)),
               max_tokens=16)
        if s.fill > 0.8:
            break
    r = s.chat("which code had item-2?", max_tokens=40)
    assert r["choices"][0]["message"]["content"] == "The code was Z222."
    assert seen and "which code had item-2" in seen[-1]
    s.close()


def _stream_text(client, body):
    return "".join(_stream_chunks(client, body))


@pytest.mark.parametrize("client_tools", [False, True])
def test_server_stream_hides_the_sessions_search_and_streams_the_answer(tmp_path, client_tools):
    httpx = pytest.importorskip("httpx")
    from test_server_support import API_KEY, running_server

    def responder(prompt):
        tail = prompt.rsplit("<|im_start|>user\n", 1)[-1]
        if "write a summary" in tail:
            return default_responder(prompt)
        if "which word" in tail:
            return "The word is kiwi." if "search_history" in tail else "Let me check. " + CALL % "kiwi"
        return "ok"
    eng = FakeEngine(n_ctx=8192, n_seq_max=16, responder=responder)
    weather = [{"type": "function", "function": {"name": "get_weather", "description": "w",
                                                 "parameters": {"type": "object", "properties": {}}}}]
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "which word did I say?"}]
    body = {"model": "x", "messages": msgs, "max_tokens": 80, **({"tools": weather} if client_tools else {})}
    with running_server(eng, str(tmp_path), window=2048) as srv:
        c = httpx.Client(base_url=srv.base_url, timeout=60,
                         headers={"Authorization": f"Bearer {API_KEY}", "X-Session-Id": "conv1"})
        text = _stream_text(c, body)
        assert "tool_call" not in text and text.endswith("The word is kiwi.")
        # the client sends back what it was streamed: the same conversation continues, nothing rebuilt
        body["messages"] = msgs + [{"role": "assistant", "content": text}, {"role": "user", "content": "thanks"}]
        _stream_text(c, body)
        events = c.get("/sessions/conv1").json()["events"]
        assert not [e for e in events if e["event"] == "session_closed"], events


# ---------------------------------------------------------------------------- second review
def test_matching_is_by_word_start_with_prefixes_for_longer_terms():
    def hit(term, text):
        return not history_search.search([(1, {"role": "user", "content": text})], term, budget=99).startswith("No")
    assert hit("build 1234", "artifact build_1234_final") and hit("2024-01-05", "at 2024-01-05T10:00:03Z")
    assert hit("invoice", "two invoices due") and not hit("id", "a good idea") and not hit("335", "ACC-1335")
    assert hit("東京オフィスの住所", "東京オフィスの住所は港区です")


def test_window_none_offers_search_only_when_the_window_is_large_enough(tmp_path):
    for n_ctx, offered in ((1500, False), (2200, True), (8192, True)):
        eng = FakeEngine(n_ctx=n_ctx)
        s = pk.Session(eng, system="You are a test.", history_dir=tmp_path / str(n_ctx),
                       policy=pk.Policy(mode="hard", summary_max_tokens=48))
        names = [t["function"]["name"] for t in (s._tools.in_effect or [])]
        assert (history_search.NAME in names) is offered and (s.window >= 1024 or not offered), (n_ctx, s.window)
        s.close()


@pytest.mark.parametrize("think", [110, 130, 150, 170])
def test_background_preparation_does_not_summarize_the_question_a_search_serves(tmp_path, think):
    # a long reply before the call: a preparation starts while it is written (the call's messages are not
    # protected then) and would cut past the question; the search must restart it at a cut before them
    q, seen = "which code had item-2?", []

    def responder(prompt):
        tail = prompt.rsplit("<|im_start|>user\n", 1)[-1]
        if "write a summary" in tail:
            return default_responder(prompt)
        if "<|im_start|>tool\nMatches for 'item-2 code'" in prompt and prompt.rstrip().endswith("<|im_start|>assistant"):
            seen.append(q in prompt)
            return "The code was Z222."
        if q in tail:
            return " ".join(f"think{k}" for k in range(think)) + " " + CALL % "item-2 code"
        return default_responder(prompt)
    _, s = _session(tmp_path, responder=responder, mode="background")
    _fill(s, 8)
    s.compact()
    _fill(s, 8)
    r = s.chat(q, max_tokens=400)
    assert seen == [True] and r["choices"][0]["message"]["content"] == "The code was Z222."
    s.close()


def test_load_refuses_settings_it_takes_from_the_log(tmp_path):
    log = _closed_session_log(tmp_path)
    with pytest.raises(TypeError, match="takes policy from the session's log"):
        pk.Session.load(FakeEngine(n_ctx=8192), log, policy=pk.Policy())


def _stream_chunks(client, body):
    chunks = []
    with client.stream("POST", "/chat/completions", json=dict(body, stream=True)) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for ch in json.loads(line[6:]).get("choices", []):
                    if ch.get("delta", {}).get("content"):
                        chunks.append(ch["delta"]["content"])
    return chunks


def test_server_streams_after_compact_calls_code_and_a_search_with_a_client_call(tmp_path):
    httpx = pytest.importorskip("httpx")
    from test_server_support import API_KEY, running_server
    fence = "```python\n" + "\n".join(f"x{k} = {k}" for k in range(40)) + "\n```"

    def responder(prompt):
        tail = prompt.rsplit("<|im_start|>user\n", 1)[-1]
        if "write a summary" in tail:
            return default_responder(prompt)
        if "compact then answer" in tail:
            return "Done compacting." if "<|im_start|>tool" in tail else \
                'Let me tidy. <tool_call>\n{"name": "compact_conversation", "arguments": {}}\n</tool_call>'
        if "show code" in tail:
            return fence
        if "weather too" in tail:
            return "Checking. " + CALL % "kiwi" + '\n<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
        return "ok"
    eng = FakeEngine(n_ctx=8192, n_seq_max=16, responder=responder)
    weather = [{"type": "function", "function": {"name": "get_weather", "description": "w",
                                                 "parameters": {"type": "object", "properties": {}}}}]
    with running_server(eng, str(tmp_path), window=2048) as srv:
        c = httpx.Client(base_url=srv.base_url, timeout=60, headers={"Authorization": f"Bearer {API_KEY}"})
        sys_msg = {"role": "system", "content": "Be brief."}
        got = "".join(_stream_chunks(c, {"model": "x", "max_tokens": 80,
                                         "messages": [sys_msg, {"role": "user", "content": "compact then answer"}]}))
        assert got == "Let me tidy. Done compacting."
        chunks = _stream_chunks(c, {"model": "x", "max_tokens": 400,
                                    "messages": [sys_msg, {"role": "user", "content": "show code"}]})
        assert "".join(chunks) == fence and len(chunks) > 5  # streamed, not held to the end
        got = "".join(_stream_chunks(c, {"model": "x", "max_tokens": 120, "tools": weather,
                                         "messages": [sys_msg, {"role": "user", "content": "weather too"}]}))
        assert got.count("Checking.") == 1, got


def test_a_result_line_is_ranked_by_what_its_call_names_too():
    """Issue 33: the value line of a config ("max_pool_size = 41") does not repeat the file's path; its call
    does. The question naming both finds the line of the right file first."""
    from pykvcompact.compaction.tools.history_search import search
    msgs = []
    for i, svc in enumerate(["auth", "billing", "search"]):
        msgs.append((2 * i, {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "function": {"name": "read_file", "arguments": {"path": f"services/{svc}/config.toml"}}}]}))
        body = [f"opt{k} = {k}" for k in range(10)] + [f"max_pool_size = {40 + i}"] + [f"x{k} = 1" for k in range(10)]
        msgs.append((2 * i + 1, {"role": "tool", "tool_call_id": f"c{i}", "content": "\n".join(body)}))
    for i, svc in enumerate(["auth", "billing", "search"]):
        text = search(msgs, f"What is max_pool_size in services/{svc}/config.toml?", budget=60)
        first = text.split("\n")[2]
        assert first == f"max_pool_size = {40 + i}", text


def test_a_repeated_call_id_names_the_nearest_call_before_the_result():
    """Review: with ids reused (call_0 after a restart), the call weighting used the newest call of the id."""
    from pykvcompact.compaction.tools.history_search import search
    msgs = []
    for k, (svc, value) in enumerate((("auth", 47), ("billing", 12))):
        msgs.append((2 * k, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "function": {"name": "read_file", "arguments": {"path": f"services/{svc}/config.toml"}}}]}))
        body = [f"opt{j} = {j}" for j in range(8)] + [f"max_pool_size = {value}"]
        msgs.append((2 * k + 1, {"role": "tool", "tool_call_id": "call_0", "content": "\n".join(body)}))
    text = search(msgs, "max_pool_size services/auth/config.toml", budget=60)
    assert text.split("\n")[2] == "max_pool_size = 47", text
