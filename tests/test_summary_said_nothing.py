"""A summary that says nothing (fake engine): every heading "none" is what Qwen2.5-Coder-1.5B wrote on the
evaluation's episodes, 21 summaries of 21.  Such lines are not carried forward, and after two such
summaries in a row the model is not asked (the extractive summary serves) until it is tried again."""
from __future__ import annotations

import pykvcompact as pk
from pykvcompact.compaction.summary.novelty import informative, novel_words, says_something_new
from pykvcompact.compaction.summary.summaries import ASK_AGAIN_AFTER, SAID_NOTHING_LIMIT
from fake_engine import FakeEngine
from test_results import call, out
from test_session_logic import check_invariants, make, user_msg

NOTHING = ("Standing instructions: none\nGoal: none\nVerified facts: none\nDecisions: none\n"
           "Files and artifacts: none\nOpen items: none\nNext step: none")


def test_informative_drops_empty_headings_and_repeats_and_keeps_what_says_something():
    text = ("Standing instructions: none\n\nGoal: none\nVerified facts:\n- R1 = 4595\nDecisions: n/a\n"
            "Next step: compute R2\nGoal: none\nNext step: compute R2\n- none")
    assert informative(text) == "Verified facts:\n- R1 = 4595\nNext step: compute R2"
    # only a heading line twice is a repeat: code fences and listed values stay
    code = "Decisions: patch applied\n```\nx = 1\n```\nVerified facts:\n- result: 42\nOpen items:\n- result: 42"
    assert informative(code) == code
    assert informative(NOTHING) == ""
    assert informative("Goal: reconcile ACC-1\n\n\n\nNext step: settle") == "Goal: reconcile ACC-1\n\nNext step: settle"
    assert informative("") == ""


def test_novel_words_are_what_the_summary_message_does_not_carry_anyway():
    known = "Sub-goal 1: rework parse_report in src/store.py as the review asks, then run the tests."
    assert novel_words("Goal: rework parse_report in src/store.py.\nNext step: run the tests.", known) == []
    assert novel_words("Decisions: parse_report now streams rows; RETRY_LIMIT = 511", known) == [
        "streams", "rows", "RETRY_LIMIT", "511"]
    # one new number is a fact; plain words need three
    assert says_something_new("Verified facts: R2 = 4541", known) and not says_something_new("Goal: rework it", known)
    assert says_something_new("Decisions: streaming chosen because memory matters", known)
    assert not says_something_new("Next step: rework src/store.py", known)


def _responder(says):
    """A model whose summaries are ``says()`` (called once per summary) and whose replies are short."""
    def respond(prompt):
        last = prompt.rsplit("<|im_start|>user\n", 1)[-1]
        if "write a summary of the conversation" in last:
            return says()
        return "Done."
    return respond


def _run(s, n):
    for i in range(n):
        s.chat(user_msg(i), max_tokens=8)


def _failed(s, reason):
    return [e for e in s.events if e.name == "summary_failed" and e.reason == reason]


def test_a_summary_of_empty_headings_carries_nothing_forward(tmp_path):
    eng, s = make("hard", tmp_path=tmp_path, window=700, responder=_responder(lambda: NOTHING))
    _run(s, 40)
    summaries = [m["content"] for m in s.messages if m.get("summary")]
    assert summaries and _failed(s, "uninformative")
    for text in summaries:
        assert "Goal: none" not in text and "Verified facts: none" not in text
        assert text.count("Earlier summary, carried verbatim") == 0   # nothing to carry
    check_invariants(s)


def test_after_two_summaries_that_said_nothing_the_model_is_asked_again_after_3_then_6_12_24(tmp_path):
    asked = []

    def says():
        asked.append(1)
        return NOTHING
    eng, s = make("hard", tmp_path=tmp_path, window=700, responder=_responder(says))
    _run(s, 200)
    ready = [e for e in s.events if e.name == "summary_ready"]
    assert len(ready) >= SAID_NOTHING_LIMIT + 3 + 1 + 6 + 1 + 2, len(ready)
    # the model wrote the first two; then 3 without it, then it is asked again (nothing again): 6 without
    # it, then 12, then 24 and 24 from then on
    pattern = [not e.fallback for e in ready]
    expect = [True] * SAID_NOTHING_LIMIT
    for wait in [ASK_AGAIN_AFTER, 6, 12, 24] + [24] * len(ready):
        expect += [False] * wait + [True]
    assert pattern == expect[:len(pattern)]
    assert len(asked) == sum(pattern)
    skipped = _failed(s, "uninformative")
    assert [e.attempt for e in skipped if e.attempt == 0] and all("said nothing" in e.detail or e.attempt
                                                                   for e in skipped)
    check_invariants(s)


def test_a_model_that_says_something_again_is_asked_every_time(tmp_path):
    n = [0]

    def says():   # nothing twice (then a restated request), then real summaries
        n[0] += 1
        if n[0] <= SAID_NOTHING_LIMIT:
            return NOTHING if n[0] == 1 else "Goal: Step 0 w0_1 w0_2.\nNext step: none"
        return f"Goal: test.\nVerified facts: checksum {n[0]} matched, parser rewritten {n[0] * 7}."
    eng, s = make("hard", tmp_path=tmp_path, window=700, responder=_responder(says))
    _run(s, 120)
    ready = [e for e in s.events if e.name == "summary_ready"]
    pattern = [not e.fallback for e in ready]
    # asked twice (nothing), skipped 3 times, asked: it says something, so it is asked from then on
    assert pattern[:SAID_NOTHING_LIMIT + ASK_AGAIN_AFTER + 1] == [True] * 2 + [False] * 3 + [True]
    assert all(pattern[SAID_NOTHING_LIMIT + ASK_AGAIN_AFTER:]), pattern
    check_invariants(s)


def _quiet_session(tmp_path, says=lambda: NOTHING, mode="hard"):
    asked = []

    def respond():
        asked.append(1)
        return says()
    eng, s = make(mode, tmp_path=tmp_path, window=700, responder=_responder(respond))
    i = 0
    while s._maker.asks_model():   # until the model is no longer asked
        s.chat(user_msg(i), max_tokens=8)
        i += 1
    assert len(asked) == SAID_NOTHING_LIMIT
    return eng, s, asked


def test_a_manual_compaction_with_instructions_always_asks_the_model(tmp_path):
    for mode in ("hard", "background"):
        eng, s, asked = _quiet_session(tmp_path / mode, mode=mode)
        before = len(asked)
        e = s.compact("list every order id")
        assert isinstance(e, pk.events.Rebased) and e.trigger == "manual"
        assert len(asked) == before + 1   # the model was asked, with the instructions
        check_invariants(s)


def test_the_model_summary_is_kept_even_when_it_restates_what_the_message_carries(tmp_path):
    eng, s = make("hard", tmp_path=tmp_path, window=700, responder=_responder(
        lambda: "Goal: Step 0 w0_1 w0_2.\nVerified facts: the failing tests pass now."))
    _run(s, 30)
    summary = next(m["content"] for m in s.messages if m.get("summary"))
    assert "the failing tests pass now" in summary   # not news by its words, still kept


def test_the_counters_survive_save_and_load(tmp_path):
    eng, s, asked = _quiet_session(tmp_path)
    state = (s._maker.said_nothing, s._maker.not_asked)
    assert not s._maker.asks_model()
    s.save(tmp_path / "snap")
    s2 = pk.Session.load(eng, tmp_path / "snap")
    assert (s2._maker.said_nothing, s2._maker.not_asked) == state and not s2._maker.asks_model()
    s2.close()
    s.close()


def test_the_tool_asks_the_model_even_over_a_preparation_written_without_it(tmp_path):
    eng, s, asked = _quiet_session(tmp_path, mode="background")
    i = 1000
    def pending_without_model():
        p = s._compactor.prep
        return p is not None and p.job.summary is not None and p.job.summary.attempts == 0
    while not pending_without_model():   # a preparation written without the model is pending
        s.chat(user_msg(i), max_tokens=8)
        i += 1
        assert i < 1100
    assert s._compactor.prep.job.summary.reason == "uninformative"
    before = len(asked)
    assert s._compactor.defer("tool")
    for j in range(6):
        s.chat(user_msg(i + j), max_tokens=8)
        if [e for e in s.events if e.name == "rebased" and e.trigger == "tool"]:
            break
    assert len(asked) == before + 1
    assert [e for e in s.events if e.name == "preparation_restarted" and e.reason == "asks_model"]
    check_invariants(s)


def test_the_extractive_summary_does_not_repeat_a_request_the_message_carries_whole():
    from pykvcompact.compaction.summary.summarizer import (LAST_REQUEST, NEXT_STEP_LINE, fallback_summary,
                                                           without_repeated_requests)
    msgs = [{"role": "user", "content": "Sub-goal 5: settle  ACC-8546."}, {"role": "assistant", "content": "ok"}]
    text = fallback_summary(msgs)
    assert LAST_REQUEST in text
    # kept verbatim (whitespace aside) or listed as a standing instruction: said once, not twice
    assert LAST_REQUEST not in without_repeated_requests(text, ["Sub-goal 5: settle ACC-8546."])
    with_standing = fallback_summary(msgs, standing=["Sub-goal 5: settle ACC-8546."])
    assert LAST_REQUEST not in without_repeated_requests(with_standing, ["Sub-goal 5: settle ACC-8546."])
    # a clipped copy is not the message: the request line stays
    assert without_repeated_requests(text, ["Sub-goal 5: settle … 8546."]) == text
    # a model that copies the extractive summary's last line carries nothing forward by it
    assert informative("Goal: settle ACC-8546\n" + NEXT_STEP_LINE) == "Goal: settle ACC-8546"
    assert informative(NEXT_STEP_LINE + "\nGoal: settle ACC-8546") == "Goal: settle ACC-8546"
    for echo in ("- " + NEXT_STEP_LINE, "**Next step:** continue from the most recent messages below",
                 "Next step: continue from the most recent messages below"):
        assert informative("Goal: settle ACC-8546\n" + echo) == "Goal: settle ACC-8546", echo
    # (from the review) with lines under it, the heading stays over them
    step = "Decisions: use tabs.\n" + NEXT_STEP_LINE + "\n- then deploy to staging on port 8080"
    assert informative(step) == step


def test_a_fallback_summary_message_says_the_task_once(tmp_path):
    from test_results import mk, run_task
    _, s = mk(tmp_path, faults=["exception"] * 200)   # every summary is the extractive one
    run_task(s)
    task = "Reconcile the accounts one by one and note each settled total."
    fallbacks = [m["content"] for m in s.transcript if m.get("summary") and "Automatic summary" in m["content"]]
    assert len(fallbacks) >= 2
    for text in fallbacks:
        assert text.count(task) == 1, text   # kept verbatim, not repeated as "Last user request"
    check_invariants(s)


def test_a_smaller_swap_that_drops_the_kept_request_keeps_its_line(tmp_path, monkeypatch):
    # (from the review) the pool too full for the planned swap: the smallest one keeps no message verbatim,
    # and the extractive summary's "Last user request" line is then the request's only copy
    from pykvcompact import errors
    from pykvcompact.compaction.summary.summarizer import Summarizer
    from pykvcompact.compaction.swap import Swap
    import pykvcompact.compaction.summary.summaries as S
    levels, replacement, build = {}, S.SummaryMaker.replacement, Swap._build

    def at_level(self, mark, summary, level=0):
        rep = replacement(self, mark, summary, level)
        levels[id(rep.tokens)] = level
        return rep

    def only_the_smallest(self, span, repl, rb, mode):
        if repl and levels.get(id(repl), S.MAX_SHRINK) < S.MAX_SHRINK:
            if rb is not None:
                rb.cancel()
            raise errors.ContextFullError("no room (test)")
        return build(self, span, repl, rb, mode)
    monkeypatch.setattr(S.SummaryMaker, "replacement", at_level)
    monkeypatch.setattr(Swap, "_build", only_the_smallest)
    s = pk.Session(FakeEngine(n_ctx=16384), system="You are an agent.", history_dir=tmp_path, session_id="lv",
                   summarizer=Summarizer(faults=["exception"] * 500),
                   policy=pk.Policy(mode="hard", window=2000, compact_tool=False, history_tool=False,
                                    summary_max_tokens=256))
    s.chat("Task: fix bug 42 in the parser.", max_tokens=8)
    request = "Now rename parse_row to read_row; never touch billing.py."
    s.chat(request, max_tokens=8)
    for i in range(30):
        s.chat([call(i, "read_file"), out(i, " ".join(f"l{i}_{k}" for k in range(60)))], max_tokens=16)
        if any(e.name == "rebased" for e in s.events):
            break
    assert any(e.name == "rebased" for e in s.events) and S.MAX_SHRINK in levels.values()
    summary = next(m["content"] for m in s.messages if m.get("summary"))
    assert [e for e in s.events if e.name == "summary_ready"][0].fallback and request in summary
    check_invariants(s)


def test_a_reply_of_none_is_not_lost_by_the_extractive_summary(tmp_path):
    # (from the review) "None." is no standing instruction (split_standing drops "none" lines), so the
    # request line is its only copy once it leaves the kept messages
    from pykvcompact.compaction.summary.summarizer import LAST_REQUEST, Summarizer
    s = pk.Session(FakeEngine(n_ctx=16384), system="You are an agent.", history_dir=tmp_path, session_id="n",
                   summarizer=Summarizer(faults=["exception"] * 500),
                   policy=pk.Policy(mode="hard", window=1000, compact_tool=False, history_tool=False,
                                    summary_max_tokens=96, keep_user_tokens=0))
    s.chat("Task: fix bug 42 in the parser.", max_tokens=8)
    s.add([{"role": "assistant", "content": "Which files must I leave untouched?"}])
    s.chat("None.", max_tokens=8)
    for i in range(40):
        s.chat([call(i, "read_file"), out(i, " ".join(f"l{i}_{k}" for k in range(30)))], max_tokens=8)
        if any(e.name == "rebased" for e in s.events):
            break
    assert any(e.name == "rebased" for e in s.events)
    summary = next(m["content"] for m in s.messages if m.get("summary"))
    assert "None." in [m.get("content") for m in s.messages if not m.get("summary")] or \
        LAST_REQUEST + "None." in summary.split("\n"), summary
    check_invariants(s)
