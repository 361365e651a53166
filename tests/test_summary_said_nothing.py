"""A summary that says nothing (fake engine): every heading "none" is what Qwen2.5-Coder-1.5B wrote on the
evaluation's episodes, 21 summaries of 21.  Such lines are not carried forward, and after two such
summaries in a row the model is not asked (the extractive summary serves) until it is tried again."""
from __future__ import annotations

import pykvcompact as pk
from pykvcompact.sessions.novelty import informative, novel_words, says_something_new
from pykvcompact.sessions.summaries import ASK_AGAIN_AFTER, SAID_NOTHING_LIMIT
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


def test_after_two_summaries_that_said_nothing_the_model_is_asked_again_only_every_fourth_time(tmp_path):
    asked = []

    def says():
        asked.append(1)
        return NOTHING
    eng, s = make("hard", tmp_path=tmp_path, window=700, responder=_responder(says))
    _run(s, 120)
    ready = [e for e in s.events if e.name == "summary_ready"]
    assert len(ready) >= SAID_NOTHING_LIMIT + ASK_AGAIN_AFTER + 2, len(ready)
    # the model wrote the first two; then 3 without it, then it is asked again, and so on
    pattern = [not e.fallback for e in ready]
    expect = [True] * SAID_NOTHING_LIMIT + ([False] * ASK_AGAIN_AFTER + [True]) * len(ready)
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
