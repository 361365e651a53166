"""Sessions on SmolLM2-135M (real model, small windows): every mode crosses the window several times
without exceeding it or n_ctx, and the model keeps answering; background mode generates no summary token
on the main path at a swap; the compaction tool; the offload file. Generation is kept short (CPU)."""
from __future__ import annotations

import time

import pytest

import pykvcompact as pk
from pykvcompact import events

WINDOW = 1024


def filler(i: int) -> str:
    # ~100 tokens of "tool output"-like text per turn, so the window fills quickly with little decoding
    rows = "\n".join(f"row {i}.{k}: value={i * 10 + k} status=ok" for k in range(8))
    return f"Step {i}. Here is the output of the last command:\n{rows}\nWhat is the value in row {i}.3? Answer briefly."


def run(engine, mode, tmp_path, turns=12, **kw):
    kw.setdefault("summary_max_tokens", 48)
    kw.setdefault("probe_every", 10_000)
    kw.setdefault("compact_tool", False)
    kw.setdefault("history_tool", False)  # likewise search_history (tests/test_history_search.py)
    s = pk.Session(engine, system="You are a concise assistant. Answer in one short sentence.",
                   policy=pk.Policy(mode=mode, window=WINDOW, **kw), history_dir=tmp_path, session_id=f"smol-{mode}")
    answers = []
    stats0 = engine.stats()
    usage = 0
    for i in range(turns):
        r = s.chat(filler(i), max_tokens=16)
        answers.append(r["choices"][0]["message"]["content"])
        usage += r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]
        assert len(s.tokens) <= s.window
        assert engine.used_cells() <= engine.n_ctx
    return s, answers, stats0, usage


@pytest.mark.parametrize("mode", ["none", "fixed", "hard", "rubric", "background"])
def test_every_mode_crosses_the_window_and_keeps_answering(mode, smollm_engine, tmp_path):
    s, answers, _, _ = run(smollm_engine, mode, tmp_path, probe_every=64 if mode in ("rubric", "background") else 10_000)
    try:
        names = [e.name for e in s.events]
        assert names.count("rebased") >= 2, names
        assert all(a and a.strip() for a in answers[-3:])  # still answering after the swaps
        if mode == "none":
            assert "dropped" in names and "summary_started" not in names
        else:
            assert "summary_ready" in names and "offloaded" in names
        if mode in ("rubric", "background"):
            probes = [e for e in s.events if e.name == "probe"]
            assert probes and all(0.0 <= e.p <= 1.0 and e.tokens > 0 and e.ms > 0 for e in probes)
        full = [m for m in s.transcript if not m.get("summary")]
        live = [m for m in s.messages if not m.get("summary")]
        assert full == live[:1] + s.offloaded + live[1:]
        text = open(s.history_path, encoding="utf-8").read()
        assert all(m["content"] in text for m in s.offloaded if m.get("content"))
        assert s.tokens == smollm_engine.tokenize(s.render())
    finally:
        s.close()


def test_background_swap_generates_no_summary_token_on_the_main_path(smollm_engine, tmp_path):
    # the model may say COMPRESS at any probe; probes are off here so that the swaps happen at `hard`
    s, answers, st0, usage = run(smollm_engine, "background", tmp_path, turns=14)
    try:
        st1 = smollm_engine.stats()
        reb = [e for e in s.events if e.name == "rebased"]
        assert len(reb) >= 2 and all(e.trigger == "hard" for e in reb)
        assert all(e.name != "summary_started" or e.background for e in s.events)
        # (whether the summary was ready before `hard` depends on timing; SmolLM2's summaries often loop
        #  past the budget and fall back, so this test checks rows, not wall time)
        fg = st1["rows"]["foreground"] - st0["rows"]["foreground"]
        bg = st1["rows"]["background"] - st0["rows"]["background"]
        catch_up = sum(e.catch_up_tokens for e in reb)
        # every foreground row is a prompt or reply token (or a rebase catch-up row, or the one row an
        # exact commit recomputes for the next token's logits): no summary token
        assert fg <= usage + catch_up + len(reb), (fg, usage, catch_up, len(reb))
        summary_tokens = sum(e.tokens for e in s.events if e.name == "summary_ready" and not e.fallback)
        assert bg >= summary_tokens > 0 or any(e.fallback for e in s.events if e.name == "summary_ready")
        stalls = [e.stall_ms for e in reb if e.prepared]
        print("background stall_ms at swap:", [round(x, 1) for x in stalls])
    finally:
        s.close()


def test_hard_mode_stall_is_the_synchronous_summary(smollm_engine, tmp_path):
    s, _, _, _ = run(smollm_engine, "hard", tmp_path, turns=8)
    try:
        reb = [e for e in s.events if e.name == "rebased"]
        assert reb and not any(e.prepared for e in reb)
        ready = [e for e in s.events if e.name == "summary_ready"]
        assert reb[0].stall_ms >= ready[0].ms * 0.9  # the summary was on the main path
        print("hard stall_ms at swap:", [round(e.stall_ms, 1) for e in reb])
    finally:
        s.close()


def test_compaction_tool_refuses_then_compacts(smollm_engine, tmp_path):
    s = pk.Session(smollm_engine, system="You are terse.", history_dir=tmp_path,
                   policy=pk.Policy(mode="background", window=WINDOW, summary_max_tokens=48, probe_every=10_000))
    try:
        call = {"id": "c1", "type": "function", "function": {"name": "compact_conversation", "arguments": "{}"}}
        s.add([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]}])
        assert s.messages[-1]["content"] == "Nothing to compact yet"
        assert [e.name for e in s.events] == ["tool_refused"]
        i = 0
        while len(s.tokens) < s.limits.tool_min + 200:
            s.add([{"role": "user", "content": filler(i)}, {"role": "assistant", "content": f"Row {i}.3 is {i * 10 + 3}."}])
            i += 1
        assert len(s.tokens) < s.limits.hard
        s.add([{"role": "user", "content": "compact now"},
               {"role": "assistant", "content": None, "tool_calls": [dict(call, id="c2")]}])
        # background mode: the summary is written on a fork and swapped in once its context is prefilled;
        # the model is told at once (no stall), the swap comes between later steps
        result = s.messages[-1]
        assert result["role"] == "tool" and result["content"].startswith("Compaction started")
        assert s.messages[-2].get("tool_calls")
        for _ in range(60):  # short messages (far from hard) while the engine thread writes the summary
            if any(e.name == "rebased" for e in s.events):
                break
            # the caller's tool runs for a second: the session advances the preparation meanwhile (with
            # time.sleep the next phase waited for the next message, and on a loaded CPU the messages could
            # reach hard first, whose fallback cut may take the call in)
            s.idle(1.0)
            s.add({"role": "user", "content": "ok"})
        reb = [e for e in s.events if e.name == "rebased"]
        # the preparation (started at soft, or by the call) was committed once caught up ("tool"), or at
        # hard if the "ok"s reached it first on a slow CPU: prepared either way, no summary written inline
        assert reb and reb[0].trigger in ("tool", "hard") and reb[0].prepared, [e.name for e in s.events]
        live = [m.get("tool_call_id") for m in s.messages if m["role"] == "tool"]
        assert "c2" in live  # the call's result stays raw (the cut was before the call)
        assert any(m.get("summary") for m in s.messages)
        r = s.chat("What is the value in row 0.3?", max_tokens=12)
        assert r["choices"][0]["message"]["content"]
    finally:
        s.close()


def test_issue7_scenario_no_drops_and_no_stall_past_max_stall(smollm_engine, tmp_path):
    """The scenario of issue 7: window 1024, `background`, 22 agent turns (tool results up to ~220 tokens),
    no pause between turns: no dropped turn, and every swap either prepared or fallen back after waiting
    at most max_stall_ms (the worst stall is in the events)."""
    from pykvcompact.cli.agent_demo import run_agent_demo
    lines = []
    before = smollm_engine.used_cells()
    r = run_agent_demo(engine=smollm_engine, turns=22, window=1024, mode="background", history_dir=str(tmp_path),
                       out=lines.append, max_tokens=8)
    assert r["dropped"] == 0 and r["rebases"] >= 3 and r["never_exceeded_window"]
    assert r["rebases"] == r["rebases_prepared"] + r["rebases_fallback"] + r["rebases_waited"]
    # the wait for a late summary is bounded by max_stall_ms (+ one engine step: a query waits for the step
    # in flight); how long the whole swap took is a benchmark figure (bench/compaction.py), not a test
    assert r["wait_ms_max"] <= pk.Policy().max_stall_ms + 1000
    assert r["worst_stall_ms"] == max(r["stall_ms"])
    assert r["peak_used_cells"] <= smollm_engine.n_ctx // 2  # two such sessions fit on n_ctx=4096
    assert smollm_engine.used_cells() == before


def test_two_window_1024_sessions_fit_on_n_ctx_4096(smollm_engine, tmp_path):
    from pykvcompact.cli.agent_demo import TOOLS
    assert smollm_engine.n_ctx == 4096
    sessions = [pk.Session(smollm_engine, system="You are a careful coding agent.", tools=TOOLS, history_dir=tmp_path,
                           policy=pk.Policy(mode="background", window=1024), session_id=f"two-{k}") for k in range(2)]
    try:
        for i in range(10):
            for s in sessions:
                s.chat(filler(i), max_tokens=4)
                assert len(s.tokens) <= 1024 and smollm_engine.used_cells() <= smollm_engine.n_ctx
        assert all(sum(e.name == "rebased" for e in s.events) >= 1 for s in sessions)
        assert not any(e.name == "dropped" for s in sessions for e in s.events)
    finally:
        for s in sessions:
            s.close()


def test_pinned_text_is_in_the_sequence_tokens_after_compactions(smollm_engine, tmp_path):
    s = pk.Session(smollm_engine, system="You are terse.", history_dir=tmp_path, session_id="pin",
                   policy=pk.Policy(mode="hard", window=WINDOW, compact_tool=False, history_tool=False))
    try:
        task = "Deploy on port 8137 and never modify billing.py."
        s.chat(task, max_tokens=4)
        s.chat({"role": "user", "content": "Branch names start with zq-.", "pinned": True}, max_tokens=4)
        for i in range(14):
            s.chat(filler(i), max_tokens=4)
        assert sum(e.name == "rebased" for e in s.events) >= 2
        text = smollm_engine.detokenize(s.tokens)
        assert task in text and "Branch names start with zq-." in text
    finally:
        s.close()
