"""Issue 12 (the user's instructions survive every compaction) and issue 8's summarizer fixes (a summary
is never a tool call; an earlier summary's facts are carried forward verbatim), on the fake engine."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import pykvcompact as pk
from pykvcompact.compaction.summary.tool_call_syntax import looks_like_tool_call

from fake_engine import FakeEngine, default_responder

INSTRUCTIONS = ("Deploy on port 8137.", "Never modify billing.py.", "Branch names start with zq-.",
                "We ship on Thursday.")
TASK = "New task: refactor the invoice module. Standing rules: " + " ".join(INSTRUCTIONS)


def session(mode, tmp_path, responder=None, **pol):
    eng = FakeEngine(n_ctx=8192, responder=responder, probe_fn=lambda t: 0.9)
    pol.setdefault("summary_max_tokens", 64)
    pol.setdefault("compact_tool", False)
    pol.setdefault("history_tool", False)  # likewise search_history (tests/test_history_search.py)
    return eng, pk.Session(eng, system="You are a coding agent.", history_dir=tmp_path, session_id=f"i-{mode}",
                           policy=pk.Policy(mode=mode, window=1000, **pol))


def tool_turn(s, i, words=60):
    call = {"id": f"c{i}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    s.chat([{"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": " ".join(f"line{i}_{k}" for k in range(words))}],
           max_tokens=16)


@pytest.mark.parametrize("mode", ["fixed", "hard", "rubric", "background", "tool"])
def test_first_user_instructions_survive_several_compactions(mode, tmp_path):
    eng, s = session(mode, tmp_path)
    s.chat(TASK, max_tokens=16)
    for i in range(40):
        tool_turn(s, i)
    if mode == "tool":
        s.compact()
    assert sum(e.name == "rebased" for e in s.events) >= (1 if mode == "tool" else 3)
    live = s.render()
    for text in INSTRUCTIONS:
        assert text in live
    assert s.tokens == eng.tokenize(live)


def test_pinned_messages_are_kept_verbatim(tmp_path):
    eng, s = session("hard", tmp_path)
    s.chat("hello", max_tokens=8)
    s.chat({"role": "user", "content": "Remember: the staging host is qx-77.", "pinned": True}, max_tokens=8)
    s.chat("A later detail worth pinning: the api key env var is ZED_KEY.", max_tokens=8)
    s.pin(len(s.transcript) - 2)     # the user message just before the last reply
    with pytest.raises(IndexError):
        s.pin(10 ** 6)
    for i in range(40):
        tool_turn(s, i)
    assert sum(e.name == "rebased" for e in s.events) >= 3
    live = s.render()
    assert "the staging host is qx-77" in live and "ZED_KEY" in live
    assert all("pinned" not in m for m in [json.loads(json.dumps(m)) for m in s.messages] if m.get("summary"))


def test_over_budget_users_are_handed_to_the_summarizer_with_keep_verbatim(tmp_path):
    prompts = []

    def responder(prompt):
        if "write a summary" in prompt.rsplit("<|im_start|>user\n", 1)[-1]:
            prompts.append(prompt.rsplit("<|im_start|>user\n", 1)[-1])
        return default_responder(prompt)
    eng, s = session("hard", tmp_path, responder=responder, keep_user_tokens=40)
    s.chat(TASK, max_tokens=8)
    for i in range(30):
        s.chat(f"Also remember rule number {i}: use tabs in file f{i}.py", max_tokens=8)
    assert prompts and any("copy every constraint" in p for p in prompts)
    assert any("rule number" in p.split("copy every constraint", 1)[-1] for p in prompts if "copy every" in p)
    assert all(t in s.render() for t in INSTRUCTIONS)   # the first user message is always kept


def _mixes():
    msg = st.one_of(
        st.builds(lambda n, k: {"role": "user", "content": f"user-{n}: " + "u " * k}, st.integers(0, 10 ** 6),
                  st.integers(1, 60)),
        st.builds(lambda k: {"role": "tool_turn", "words": k}, st.integers(5, 120)))
    return st.lists(msg, min_size=3, max_size=30)


@given(mix=_mixes(), mode=st.sampled_from(["hard", "fixed", "background", "rubric"]),
       budget=st.integers(0, 200))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_user_message_disappears_from_both_context_and_summary(mix, mode, budget, tmp_path_factory):
    eng, s = session(mode, tmp_path_factory.mktemp("h"), keep_user_tokens=budget)
    users = []
    for i, m in enumerate(mix):
        if m["role"] == "user":
            m = dict(m, content=m["content"].replace("user-", f"user{i}-"))
            n0 = len(s.transcript)
            s.chat(m, max_tokens=8)
            users.append((next(k for k in range(n0, len(s.transcript)) if s.transcript[k]["content"] == m["content"]),
                          m["content"]))
        else:
            tool_turn(s, i, m["words"])
    live = s.render()
    handed = set(s._maker.summarized_users)
    for tidx, content in users:
        assert content in live or tidx in handed, (tidx, content[:30])


def test_a_summary_is_never_a_tool_call(tmp_path):
    calls = {"n": 0}

    def responder(prompt):
        if "write a summary" in prompt.rsplit("<|im_start|>user\n", 1)[-1]:
            calls["n"] += 1
            return '<tool_call>\n{"name": "compact_conversation", "arguments": {"summary": "x"}}\n</tool_call>'
        return default_responder(prompt)
    eng, s = session("hard", tmp_path, responder=responder)
    s.chat(TASK, max_tokens=8)
    for i in range(20):
        tool_turn(s, i)
    summaries = [m["content"] for m in s.transcript if m.get("summary")]
    assert summaries and calls["n"] >= 2
    assert not any(looks_like_tool_call(x) for x in summaries)
    assert any(e.name == "summary_failed" and e.reason == "tool_call" for e in s.events)
    assert looks_like_tool_call('{"name": "f", "arguments": {}}') and not looks_like_tool_call("Goal: ship it")


def test_the_prompt_prefills_the_facts_heading(tmp_path):
    """No user message to copy: the answer starts with the facts (prefilled with the standing instructions'
    heading, a small model wrote "none" under every heading)."""
    eng, s = session("hard", tmp_path)
    seen = []
    real = s.summarizer.start

    def start(fork, prompt_tokens, **kw):
        seen.append(eng.detokenize(prompt_tokens))
        return real(fork, prompt_tokens, **kw)
    s.summarizer.start = start
    s.chat(TASK, max_tokens=8)
    for i in range(12):
        tool_turn(s, i)
    assert seen and all(p.endswith("<|im_start|>assistant\nVerified facts:\n-") for p in seen)
    assert all("Do not call any tool" in p for p in seen)
    assert all("none" not in p.rsplit("<|im_start|>user\n", 1)[-1] for p in seen)
    summaries = [m["content"] for m in s.transcript if m.get("summary")]
    assert summaries and all("Verified facts:" in x for x in summaries)


def test_earlier_summary_is_carried_forward_verbatim(tmp_path):
    n = {"k": 0}

    def responder(prompt):
        if "write a summary" in prompt.rsplit("<|im_start|>user\n", 1)[-1]:
            n["k"] += 1
            return f"Standing instructions: none\nVerified facts: fact number {n['k']} is {n['k'] * 11}."
        return default_responder(prompt)
    eng, s = session("hard", tmp_path, responder=responder, summary_max_tokens=120)
    s.chat(TASK, max_tokens=8)
    for i in range(30):
        tool_turn(s, i, 40)
    assert n["k"] >= 3
    live_summary = next(m["content"] for m in s.messages if m.get("summary"))
    assert f"fact number {n['k']} is" in live_summary
    assert f"fact number {n['k'] - 1} is {(n['k'] - 1) * 11}." in live_summary   # carried, not re-summarized
