"""The user's instructions survive every compaction: edge cases on the fake engine."""
from __future__ import annotations

import os
import re

import pykvcompact as pk
from pykvcompact import errors
from pykvcompact.compaction.policy import summary_message_budget
from pykvcompact.compaction.swap import Swap

from fake_engine import FakeEngine, default_responder

ASK = "write a summary of the conversation"


def mk(tmp_path, mode="hard", window=1000, system="You are a coding agent.", responder=None, n_ctx=8192, sid="r",
       probe=0.9, **pol):
    eng = FakeEngine(n_ctx=n_ctx, responder=responder, probe_fn=lambda t: probe)
    pol.setdefault("summary_max_tokens", 64)
    pol.setdefault("compact_tool", False)
    pol.setdefault("history_tool", False)  # likewise search_history (tests/test_history_search.py)
    s = pk.Session(eng, system=system, history_dir=tmp_path, session_id=sid,
                   policy=pk.Policy(mode=mode, window=window, **pol))
    return eng, s


def tool_turn(s, i, words=60):
    call = {"id": f"c{i}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    s.chat([{"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": " ".join(f"l{i}_{k}" for k in range(words))}],
           max_tokens=16)


def nreb(s):
    return sum(e.name == "rebased" for e in s.events)


def asked(prompt):
    return ASK in prompt.rsplit("<|im_start|>user\n", 1)[-1]


# ------------------------------------------------------------------ 1. a long task never wedges the session
def test_long_first_message_never_wedges_the_session(tmp_path):
    eng = FakeEngine(n_ctx=4096)
    s = pk.Session(eng, system="You are a coding agent.", history_dir=tmp_path,
                   policy=pk.Policy(mode="hard", compact_tool=False, history_tool=False))  # window=None: the largest that fits
    task = "TASK " + " ".join(f"t{k}" for k in range(500)) + " FINAL: never touch billing.py."
    s.chat(task, max_tokens=8)
    for i in range(60):
        tool_turn(s, i)
    assert nreb(s) >= 5
    budget = summary_message_budget(s.policy, s.window)
    assert all(e.summary_tokens <= budget for e in s.events if e.name == "rebased")
    assert any(e.name == "kept_over_budget" for e in s.events)   # the task went to the summarizer, said so


def test_task_and_pins_fit_the_reservation(tmp_path):
    eng = FakeEngine(n_ctx=2048, probe_fn=lambda t: 0.9)
    s = pk.Session(eng, system="sys", history_dir=tmp_path, session_id="c",
                   policy=pk.Policy(mode="hard", compact_tool=False, history_tool=False, summary_max_tokens=64))
    s.chat("TASK " + " ".join(f"t{k}" for k in range(150)), max_tokens=8)
    for j in range(3):
        s.chat({"role": "user", "content": f"PIN{j} " + " ".join(f"p{j}_{k}" for k in range(50)), "pinned": True},
               max_tokens=8)
    for i in range(40):
        tool_turn(s, i, 40)
    assert nreb(s) >= 3 and not any(e.name == "dropped" for e in s.events)
    budget = summary_message_budget(s.policy, s.window)
    assert all(e.summary_tokens <= budget for e in s.events if e.name == "rebased")


def test_swap_that_does_not_fit_uses_a_smaller_plan(tmp_path, monkeypatch):
    eng, s = mk(tmp_path, keep_user_tokens=200)
    s.chat("Task: fix bug 42. " + " ".join(f"r{k}" for k in range(60)), max_tokens=8)
    s.chat({"role": "user", "content": "PIN " + " ".join(f"p{k}" for k in range(60)), "pinned": True}, max_tokens=8)
    orig, sizes = Swap._build, []

    def build(self, span, repl, rb, mode):  # the pool has room for small rebased contexts only
        sizes.append(len(repl))
        if len(repl) > 100:
            if rb is not None:
                rb.cancel()
            raise errors.ContextFullError(f"no room (test) {sizes}")
        return orig(self, span, repl, rb, mode)
    monkeypatch.setattr(Swap, "_build", build)
    for i in range(30):
        tool_turn(s, i)
    assert nreb(s) >= 2
    assert len(s._compactor.swap.last.tokens) <= 100 < max(sizes)
    assert any(e.name == "kept_over_budget" and e.reason == "no_room" for e in s.events)
    assert s.tokens == eng.tokenize(s.render())


# ------------------------------------------------------------------ 2. standing instructions are carried forward
RX = re.compile(r"RULE\d+: port \d+ only\.")


def perfect(prompt):
    """Copies every RULE of the conversation not in the earlier summary under Standing instructions."""
    if not asked(prompt):
        return default_responder(prompt)
    convo, last = prompt.rsplit("<|im_start|>user\n", 1)
    earlier = ""
    if "[Summary of the conversation" in convo:
        earlier = convo.split("[Summary of the conversation", 1)[1].split("<|im_end|>", 1)[0]
    got = [r for r in dict.fromkeys(RX.findall(convo + last)) if r not in earlier]
    return " " + (" ".join(got) or "none") + "\nGoal: continue.\nNext step: continue."


def test_over_budget_constraints_stay_live_with_a_perfect_summarizer(tmp_path):
    eng, s = mk(tmp_path, responder=perfect, keep_user_tokens=30, summary_max_tokens=96)
    s.chat("Task: refactor invoices.", max_tokens=8)
    rules = [f"RULE{i}: port {8000 + i} only." for i in range(6)]
    for r in rules:
        s.chat(r, max_tokens=8)
    for i in range(40):
        tool_turn(s, i, 50)
        live = s.render()
        assert all(r in live for r in rules), (i, nreb(s))
    assert nreb(s) >= 8
    summ = [m for m in s.messages if m.get("summary")][0]["content"]
    assert summ.count("Standing instructions:") == 1


# ------------------------------------------------------------------ 3. the fallback keeps them too
def test_fallback_summary_keeps_over_budget_users_verbatim(tmp_path):
    def responder(prompt):  # the summarizer always answers with a tool call: the fallback is used
        if asked(prompt):
            return '<tool_call>\n{"name": "compact_conversation", "arguments": {}}\n</tool_call>'
        return default_responder(prompt)
    eng, s = mk(tmp_path, responder=responder, sid="fb", keep_user_tokens=20)
    s.chat("Task: go.", max_tokens=8)
    rules = [f"RULE{i}: port {8000 + i} only." for i in range(6)]
    for r in rules:
        s.chat(r, max_tokens=8)
    for i in range(16):
        tool_turn(s, i, 40)
    assert sum(e.name == "rebased" and e.fallback for e in s.events) >= 2
    live = s.render()
    assert all(r in live for r in rules)
    summ = [m for m in s.messages if m.get("summary")][0]["content"]
    assert "Standing instructions:" in summ


# ------------------------------------------------------------------ 4. the summarizer is told about all of them
def test_summarizer_request_lists_every_over_budget_user(tmp_path):
    reqs = []

    def responder(prompt):
        if asked(prompt):
            reqs.append(prompt.rsplit("<|im_start|>user\n", 1)[-1])
        return default_responder(prompt)
    key = "copy every constraint, number and name in them under Standing instructions:"
    task = "TASK: " + " ".join(f"req{k}" for k in range(250)) + " FINAL CONSTRAINT: never touch billing.py."
    eng, s = mk(tmp_path, responder=responder, sid="ov1")
    s.chat(task, max_tokens=8)
    for i in range(8):
        tool_turn(s, i, 40)
    assert reqs and "never touch billing.py" in reqs[0].split(key)[1] and "TASK: req0" in reqs[0]
    # user messages to copy: their heading leads the request (and is what the answer is prefilled with)
    assert reqs[0].index("Standing instructions: every instruction") < reqs[0].index("Verified facts:")
    reqs.clear()
    eng, s = mk(tmp_path, responder=responder, sid="ov2", keep_user_tokens=20, summary_max_tokens=128)
    s.chat("Task: go.", max_tokens=8)
    for i in range(8):
        s.chat(f"RULE{i}: port {8000 + i} only.", max_tokens=8)
    for i in range(6):
        tool_turn(s, i, 40)
    listed = reqs[0].split(key)[1]
    handed = [s.transcript[i]["content"] for i in s._maker.summarized_users]
    shown = [h for h in handed if h in listed]
    assert len(shown) >= 4 and shown == handed[:len(shown)]   # budgeted: the newest left out, never the oldest


# ------------------------------------------------------------------ 5. a leading system message is the prefix
def test_leading_system_message_is_kept_before_and_after_load(tmp_path):
    first = [{"role": "system", "content": "SYSRULE: answer in French."}, {"role": "user", "content": "Task: 42."}]
    d1, d2 = tmp_path / "a", tmp_path / "b"
    eng, s = mk(d1, system=None, sid="lp")
    s.chat(first, max_tokens=8)
    s.close()
    s2 = pk.Session.load(FakeEngine(n_ctx=8192, probe_fn=lambda t: 0.9), os.path.join(d1, "lp.log.jsonl"))
    eng, s3 = mk(d2, system=None, sid="lp2")
    s3.chat(first, max_tokens=8)
    for x in (s2, s3):
        for i in range(30):
            tool_turn(x, i)
        assert nreb(x) >= 3
        assert "SYSRULE: answer in French." in x.render() and x.messages[0]["role"] == "system"
    assert s3._ctx.n_prefix == s2._ctx.n_prefix == 1


# ------------------------------------------------------------------ 6. a pin cancels a stale preparation
def test_pin_while_a_preparation_is_ready_takes_effect_at_the_next_swap(tmp_path):
    eng, s = mk(tmp_path, mode="background", sid="race", keep_user_tokens=0, probe=0.05)
    s.chat("Task: refactor.", max_tokens=8)
    s.chat("Detail: the staging host is qx-77.", max_tokens=8)
    target = len(s.transcript) - 2
    pinned = None
    for i in range(60):
        tool_turn(s, i, 50)
        p = s._compactor.prep
        if pinned is None and p is not None and p.state != "summarizing" and "qx-77" in s.render():
            s.pin(target)
            pinned = nreb(s)
            assert any(e.name == "preparation_restarted" and e.reason == "pinned" for e in s.events)
        if pinned is not None:
            assert "qx-77" in s.render(), i
    assert pinned is not None and nreb(s) > pinned


# ------------------------------------------------------------------ lower
def test_pinned_tool_call_keeps_its_call(tmp_path):
    eng, s = mk(tmp_path, sid="pins")
    s.chat("Task: fix bug 42.", max_tokens=8)
    call = {"id": "cx", "type": "function",
            "function": {"name": "read_file", "arguments": "{\"path\": \"secret_cfg.toml\"}"}}
    s.chat([{"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "cx", "content": "TOOLFACT: port=7781"}], max_tokens=8)
    s.pin(next(i for i, m in enumerate(s.transcript) if m.get("tool_calls")))
    for i in range(40):
        tool_turn(s, i)
    assert nreb(s) >= 3 and "secret_cfg.toml" in s.render()


def test_pins_over_budget_emit_an_event(tmp_path):
    eng, s = mk(tmp_path, sid="big")
    s.chat("Task: go.", max_tokens=8)
    for j in range(4):
        s.chat({"role": "user", "content": f"PIN{j} " + " ".join(f"p{j}_{k}" for k in range(120)), "pinned": True},
               max_tokens=8)
    for i in range(30):
        tool_turn(s, i)
    ev = [e for e in s.events if e.name == "kept_over_budget"]
    assert ev and all(e.messages for e in ev)
    # the first swap reports the pins over budget: those it kept with their middle cut, and the rest
    assert (ev[0].reason, ev[1].reason) == ("clipped", "over_budget")
    pinned = {i for i, m in enumerate(s.transcript) if m.get("role") == "user" and "PIN" in str(m.get("content"))}
    assert set(ev[0].messages + ev[1].messages) <= pinned


def test_huge_keep_user_tokens_is_clamped(tmp_path):
    eng, s = mk(tmp_path, keep_user_tokens=10 ** 6, sid="hk")
    assert s.window == 1000
    s2 = pk.Session(FakeEngine(n_ctx=8192), history_dir=tmp_path, session_id="hk2",
                    policy=pk.Policy(mode="hard", keep_user_tokens=10 ** 6, compact_tool=False, history_tool=False))
    assert s2.window > 1000


def test_a_message_pinned_after_it_was_kept_stays_pinned(tmp_path):
    # review, 2026-12-03: a user message kept verbatim by a first compaction (as a plain user message) and
    # pinned afterwards lost its pin in the next summaries: it competed for the user budget, newer user
    # messages won, and it was handed to the summarizer without a kept_over_budget event
    eng, s = mk(tmp_path, window=1000, keep_user_tokens=200)
    s.chat("Task: tidy the repo.", max_tokens=8)
    s.chat("Note: the code word is ZEBRA-5.", max_tokens=8)
    note = len(s.transcript) - 2
    i = 0
    while nreb(s) < 1:
        tool_turn(s, i); i += 1
    assert "ZEBRA-5" in s.render()     # kept verbatim, not pinned
    s.pin(note)
    s.pin(len(s.transcript) - 2)        # and a long tool output: the pins take the user budget
    pinned_at = nreb(s)
    for k in range(30):                 # newer user messages fill the user budget
        s.chat(f"Also remember item {k}: " + "y " * 40, max_tokens=8)
        tool_turn(s, i); i += 1
        assert "ZEBRA-5" in s.render(), k
    assert nreb(s) >= pinned_at + 3
    s.close()


def test_a_tight_summary_says_which_pins_it_summarized(tmp_path):
    # review, 2026-12-03: when the messages kept verbatim left a needed summary no gain, the retry that
    # summarizes them too handed the pinned task to the summarizer with no event; they come back next time
    eng, s = mk(tmp_path, window=500, keep_user_tokens=200, sid="tight")
    s.chat("Task: go. " + "t " * 28, max_tokens=8)
    s.pin(1)
    tool_turn(s, 0, 180)
    n = len(s.events)
    tool_turn(s, 1, 142)
    rebased = [e for e in s.events[n:] if e.name == "rebased"]
    assert rebased
    # either the pinned task stayed verbatim in every summary (since issue 33 a full window with no cut is
    # summarized without the model instead of dropped, which keeps it here), or a tight retry handed it to
    # the summarizer and said so
    tight = [e for e in rebased if e.kept_tokens == 0]
    said = any(e.name == "kept_over_budget" and e.reason in ("no_gain", "no_room") and 1 in e.messages
               for e in s.events[n:])
    assert said if tight else all(e.kept_tokens > 0 for e in rebased)
    for k in range(6):
        s.chat(f"q{k}", max_tokens=8)
        tool_turn(s, 2 + k, 30)
    assert "Task: go." in s.render()
    s.close()


def test_the_answer_starts_with_the_facts_unless_user_messages_are_to_be_copied():
    from pykvcompact.compaction.summary.summarizer import FACTS_HEAD, FIRST_HEADING, answer_head, summarizer_request
    plain = summarizer_request("h.jsonl", 100)
    assert answer_head() == FACTS_HEAD and plain.index("Verified facts:") < plain.index(FIRST_HEADING)
    assert "none" not in plain   # (asked to write "none", a small model wrote it under every heading)
    listed = summarizer_request("h.jsonl", 100, overflow_users=["Never touch billing.py."])
    assert answer_head(["Never touch billing.py."]) == FIRST_HEADING
    assert listed.index(FIRST_HEADING) < listed.index("Verified facts:") and "- Never touch billing.py." in listed
