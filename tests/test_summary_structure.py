"""What a summary message keeps is decided by structure (issue 33): a summarizing mode never drops the
summary or the user's words to make room, and a user message repeated turn after turn is kept once."""
from __future__ import annotations

import pykvcompact as pk
from pykvcompact.compaction.summary import results as R

from fake_engine import FakeEngine

RULES = "Rules for the whole task: answer in English; never touch billing.py; report every value with its unit."


def call(i, name, **args):
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": args}}]}


def out(i, text):
    return {"role": "tool", "tool_call_id": f"c{i}", "content": text}


def tool_page(i, lines=30):
    return "\n".join(f"2026-03-{i % 28 + 1:02d}T10:{k:02d}:00Z worker-{i} INFO processed batch {i * 100 + k}"
                     for k in range(lines))


def session(tmp_path, mode, window, **pol):
    eng = FakeEngine(n_ctx=8192)
    pol.setdefault("summary_max_tokens", 64)
    return pk.Session(eng, system="You are an agent.", history_dir=tmp_path, session_id=mode,
                      policy=pk.Policy(mode=mode, window=window, compact_tool=False, history_tool=False, **pol))


def test_large_tool_pages_never_drop_the_summary_or_the_users_words(tmp_path):
    # issue 33: in hard at window 1024 with ~340-token pages, the fifth page dropped the summary message
    # that carried the user's first message, and the rules were gone for the rest of the session
    for mode in ("hard", "background"):
        s = session(tmp_path / mode, mode, 1024)
        s.chat(RULES, max_tokens=8)
        for i in range(14):
            s.add([call(i, "read_log", page=i + 1), out(i, tool_page(i))])
            assert "never touch billing.py" in s.render(), (mode, i)
            assert len(s.tokens) <= s.window
        dropped = [e for e in s.events if e.name == "dropped"]
        assert not dropped, (mode, dropped)
        assert sum(e.name == "rebased" for e in s.events) >= 3
        s.close()


def test_a_repeated_user_message_is_kept_once(tmp_path):
    s = session(tmp_path, "hard", 1200, keep_user_tokens=300)
    s.chat("Fix the parser task. " + RULES, max_tokens=8)
    for i in range(12):
        s.chat("Apply the next change for the parser task and run the tests.", max_tokens=8)
        s.add([call(i, "run_tests"), out(i, f"{i} failed, {12 - i} passed in 0.2s")])
        s.add([call(100 + i, "read_file", path=f"src/p{i}.py"), out(100 + i, tool_page(i, 12))])
    summaries = [m["content"] for m in s.messages if m.get("summary")]
    assert summaries and sum(e.name == "rebased" for e in s.events) >= 2
    text = summaries[-1]
    assert text.count("Apply the next change for the parser task and run the tests.") <= 1
    # the newest output of the repeated call supersedes the earlier ones in the copied lines
    assert sum(line.startswith("- run_tests") for line in text.split("\n")) <= 1
    s.close()


def test_an_assistant_statement_outlives_tool_output_in_the_copied_lines(tmp_path):
    s = session(tmp_path, "hard", 2048, summary_max_tokens=256)   # the default's budget at this window
    s.chat("Audit the service configs. " + RULES, max_tokens=8)
    for i in range(10):
        s.add([call(i, "read_file", path=f"services/s{i}/config.toml"),
               out(i, "\n".join(f"key_{k} = {k * i}" for k in range(30))),
               {"role": "assistant", "content": f"services/s{i}/config.toml sets max_pool_size = {40 + i}."}])
    text = "\n".join(m["content"] for m in s.messages if m.get("summary"))
    gone = [i for i in range(10) if not any(f"max_pool_size = {40 + i}" in (m.get("content") or "")
                                            for m in s.messages if not m.get("summary"))]
    assert gone, "the scenario must compact the statements away"
    assert all(f"sets max_pool_size = {40 + i}." in text for i in gone)
    assert R.RESULTS_HEADING in text
    s.close()


def test_a_context_shift_in_a_summarizing_mode_summarizes_instead_of_dropping(tmp_path):
    """The last resort of a full window with no cut point (Compactor.drop): in a summarizing mode, a span
    holding the summary or the user's words is replaced by a summary written without the model, which
    carries them; only mode none drops."""
    s = session(tmp_path, "hard", 1024)
    s.chat(RULES, max_tokens=8)
    for i in range(6):
        s.add([call(i, "read_log", page=i + 1), out(i, tool_page(i, 12))])
    assert any(m.get("summary") for m in s.messages) and "never touch billing.py" in s.render()
    before = len(s.events)
    comp = s._compactor   # (the path a full window with no cut point takes; forced here)
    assert comp.drop(60, "no_cut_point")
    new = [e.name for e in s.events[before:]]
    assert "dropped" not in new and "rebased" in new
    assert "never touch billing.py" in s.render()
    assert s.messages[1].get("summary")
    s.close()

    n = session(tmp_path / "none", "none", 1024)
    n.chat(RULES, max_tokens=8)
    for i in range(3):
        n.add([call(i, "read_log", page=i + 1), out(i, tool_page(i, 12))])
    before = len(n.events)
    assert n._compactor.drop(60, "truncation")
    assert "dropped" in [e.name for e in n.events[before:]]
    n.close()



def test_a_first_message_over_its_budget_keeps_its_head_and_end_verbatim(tmp_path):
    # a 300-token task at window 1024 is over the budget of messages always kept: it used to go to the
    # summarizer only, and when the model's summary did not restate it the task was gone after one swap
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()
    task = "\n".join(f"Rule {k}: always {words[k % 16]} the {words[k * 7 % 16]} before step {k}." for k in range(15))
    task += "\nLast rule: sign every report with TEAM-ZETA."
    for mode in ("hard", "background"):
        s = session(tmp_path / mode, mode, 1024)
        s.chat(task, max_tokens=8)
        for i in range(20):
            s.add([call(i, "read_file", path=f"f{i}.log"), out(i, tool_page(i))])
            s.chat(f"go on {i}", max_tokens=8)
            live = "\n".join(str(m.get("content")) for m in s.messages)
            assert "Rule 0: always alpha the alpha before step 0." in live, (mode, i)
            assert "Last rule: sign every report with TEAM-ZETA." in live, (mode, i)
        assert sum(e.name == "rebased" for e in s.events) >= 3, mode
        over = [e for e in s.events if e.name == "kept_over_budget"]
        assert over and {e.reason for e in over} == {"clipped"}, over
        summary = next(m["content"] for m in s.messages if m.get("summary"))
        assert "[… middle left out …]" in summary
        assert "Rule 7:" not in summary   # its middle is cut (it is in the history file)
        s.close()


TASK_RULES = "\n".join(f"Rule {k}: always {w} the report before step {k}." for k, w in enumerate(
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar".split()))


def test_a_clip_never_drops_the_word_after_a_long_run_without_spaces():
    from pykvcompact.compaction.summary.keeper import Candidate, clipped
    count = lambda t: len(t) // 4 + 1   # noqa: E731 - about 4 characters a token
    blob = "".join(f"{k:02x}" for k in range(256)) * 3
    for text, rule in [(f"Restore the database from this dump:\n{blob}\nNever delete the backups.",
                        "Never delete the backups."),
                       ("Import this CSV:\n" + "\n".join(f"{k},user{k},{k * 3.5}" for k in range(300))
                        + "\nSkip rows with amount over 900.", "Skip rows with amount over 900.")]:
        for budget in (40, 64, 128):
            c = clipped(Candidate(1, "user", text, count(text) + 4, False, True), budget, count)
            assert c is not None and c.content.endswith(rule), (budget, c.content[-80:])
            assert c.tokens <= budget and c.tokens >= budget // 2, (budget, c.tokens)   # the budget is used


def test_pinned_messages_that_fit_stay_whole_beside_a_clipped_first_message(tmp_path):
    pins = ["PINNED-ONE: " + " ".join(f"never edit module{k}.py" for k in range(14)),
            "PINNED-TWO: " + " ".join(f"always log case{k}" for k in range(14))]
    s = session(tmp_path, "hard", 2048)
    s.chat(TASK_RULES * 2, max_tokens=8)
    for p in pins:
        s.chat(p, max_tokens=8)
        s.pin(len(s.transcript) - 2)
    for i in range(12):
        s.add([call(i, "read_file", path=f"f{i}.log"), out(i, tool_page(i))])
        s.chat(f"go on {i}", max_tokens=8)
    assert sum(e.name == "rebased" for e in s.events) >= 2
    summary = next(m["content"] for m in s.messages if m.get("summary"))
    assert all(p in summary for p in pins) and "Rule 0: always alpha" in summary
    assert {e.reason for e in s.events if e.name == "kept_over_budget"} == {"clipped"}
    s.close()


def test_the_task_comes_back_after_a_swap_that_had_no_room_for_it(tmp_path):
    def tool_turn(i, n):
        c = {"id": f"c{i}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
        s.add([{"role": "assistant", "content": None, "tool_calls": [c]},
               {"role": "tool", "tool_call_id": f"c{i}", "content": " ".join(f"w{i}_{k}" for k in range(n))}])
    s = session(tmp_path, "hard", 800, keep_user_tokens=266)
    s.chat(TASK_RULES + "\nLast rule: sign every report with TEAM-ZETA.", max_tokens=8)
    tool_turn(0, 100)
    tool_turn(1, 280)   # a swap that must shrink its summary message: the task is left out of it
    assert ("no_room" in {e.reason for e in s.events if e.name == "kept_over_budget"})
    for k in range(4):
        s.chat(f"q{k}", max_tokens=8)
        tool_turn(2 + k, 30)
    live = "\n".join(str(m.get("content")) for m in s.messages)
    assert "Rule 0: always alpha" in live and "TEAM-ZETA" in live
    s.close()
