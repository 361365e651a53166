"""Issue 8: the extractive pass — key results copied verbatim from the replaced history into every summary
message (the model's or the fallback), carried from summary to summary, within the summary's budget."""
from __future__ import annotations

import pytest

import pykvcompact as pk
from pykvcompact.compaction.summary.summarizer import Summarizer
from pykvcompact.compaction.policy import summary_message_budget
from pykvcompact.compaction.summary import results as R

from fake_engine import FakeEngine


def call(i, name, **args):
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": args}}]}


def out(i, text):
    return {"role": "tool", "tool_call_id": f"c{i}", "content": text}


def page(i, n=12):
    return "\n".join(f"tx ACC-77-{i}{k:02d} 2026-03-{k + 1:02d} {k * 13.5 - 40:+.2f} Acme" for k in range(n))


def listed(msgs):
    return R.merge([], R.extract(list(enumerate(msgs))))


# ------------------------------------------------------------------ what is listed: structure, not wording
def test_statements_first_then_short_outputs_whole_then_a_long_outputs_last_line():
    msgs = [call(0, "list_transactions", account="ACC-77", page=1), out(0, page(0)),
            {"role": "assistant", "content": "ACC-77 has 12 transactions on page 1."},
            call(1, "settle", account="ACC-77"), out(1, "Account ACC-77 reconciled: 12 transactions.\nSettled total: -1,204.50")]
    found = R.extract(list(enumerate(msgs)))
    assert [(r.tier, r.claim) for r in found] == [(3, False), (1, True), (2, False)]
    assert listed(msgs) == [
        "- list_transactions(account=ACC-77, page=1), last of 12 lines: tx ACC-77-011 2026-03-12 +108.50 Acme",
        "- (assistant) ACC-77 has 12 transactions on page 1.",
        "- settle(account=ACC-77): Account ACC-77 reconciled: 12 transactions. / Settled total: -1,204.50"]


def test_no_word_decides_what_is_listed():
    # what issue 33 found dropped or promoted by word lists: a hedged true fact, JSON, indented YAML keys,
    # a line that says "found" -- each is listed the same way, by its place and size
    for text in ("approximately 4,096 requests/min at peak", '{"max_pool_size": 47, "timeout_s": 30}',
                 "  max_pool_size: 47", "12 timeouts found in the auth logs; moving on.", "The code might be QX-1234."):
        assert listed([call(0, "read"), out(0, text)]) == [f"- read: {text.strip()}"], text
        assert listed([{"role": "assistant", "content": text}]) == [f"- (assistant) {text.strip()}"], text


def test_session_tools_and_empty_outputs_are_not_listed():
    msgs = [call(1, "search_history", query="total"), out(1, "[message 3, tool]\nSettled total: 99.50"),
            {"role": "tool", "tool_call_id": "x", "name": "compact_conversation", "content": "Compacted 1200 tokens."},
            call(2, "touch", path="a"), out(2, "  \n")]
    assert listed(msgs) == []


def test_a_repeated_call_supersedes_its_earlier_output_and_a_repeat_is_listed_once():
    msgs = [call(0, "run_tests"), out(0, "1 failed, 12 passed in 0.2s"),
            {"role": "assistant", "content": "Fixing the parser."},
            call(1, "run_tests"), out(1, "13 passed in 0.2s"),
            {"role": "assistant", "content": "Fixing the parser."},
            call(2, "read_file", path="a.py"), out(2, "x = 1"), call(3, "read_file", path="b.py"), out(3, "y = 2")]
    assert listed(msgs) == ["- run_tests: 13 passed in 0.2s", "- (assistant) Fixing the parser.",
                            "- read_file(path=a.py): x = 1", "- read_file(path=b.py): y = 2"]
    # across summaries too: the carried line of the same call goes
    assert R.merge(["- run_tests: 1 failed, 12 passed in 0.2s"], R.extract([(9, out(1, "13 passed"))], [call(1, "run_tests")])) \
        == ["- run_tests: 13 passed"]


def test_a_tool_call_written_as_text_is_not_a_statement():
    # measured on Qwen2.5-Coder-1.5B (math, window 2048): this reply, a call the parser did not take, was
    # copied into the summary and the model answered 581 to "R1 + R2" (9136 in the history)
    msgs = [call(0, "finish", sheet=2), out(0, "Checked. R2 = 4541"),
            {"role": "assistant", "content": '{{"name": "finish", "arguments": {"result": "R1 + R2 = 581'},
            {"role": "assistant", "content": '<tool_call>\n{"name": "finish", "arguments": {"total": 12}}'},
            {"role": "assistant", "content": "So the final total is 12."}]
    assert listed(msgs) == ["- finish(sheet=2): Checked. R2 = 4541", "- (assistant) So the final total is 12."]
    # a statement that quotes call-like text is still a statement
    for said in ['Final total for {"name": "ACC-7"} is 581.', 'Total is 9136 (via {"name": "add", "arguments": {"a": 1}}).']:
        assert listed([{"role": "assistant", "content": said}]) == ["- (assistant) " + said]


def test_a_long_statement_is_clipped_and_its_code_left_out():
    reply = "I changed the parser.\n```python\n" + "\n".join(f"x{k} = {k}" for k in range(80)) + "\n```\nAll 13 tests pass."
    [line] = listed([{"role": "assistant", "content": reply}])
    assert line == "- (assistant) I changed the parser. [code] All 13 tests pass."
    [long] = listed([{"role": "assistant", "content": "word " * 400 + "the end: 47"}])
    assert len(long) <= R.MAX_LINE_CHARS + 20 and long.endswith("the end: 47") and " … " in long


def test_merge_keeps_the_carried_list_first_without_duplicates():
    carried = ["- settle(account=A): Settled total: 1.50"]
    new = [R.Result(5, "- settle(account=A): Settled total: 1.50", False), R.Result(6, "- settle(account=B): total 2.50", False)]
    assert R.merge(carried, new) == ["- settle(account=A): Settled total: 1.50", "- settle(account=B): total 2.50"]


def test_fit_drops_long_outputs_first_then_short_ones_then_statements_oldest_first():
    count = lambda t: len(t.split())  # noqa: E731
    lines = [f"- t(k={k}): result {k} is {100 + k}" for k in range(4)]
    lines.insert(1, "- (assistant) the final total is 12345")
    lines.insert(3, "- read(f=x), last of 40 lines: the last line 9")
    kept, dropped = R.fit(lines, 40, count)
    assert "- read(f=x), last of 40 lines: the last line 9" not in kept
    assert "- (assistant) the final total is 12345" in kept
    tools = [x for x in kept if x.startswith("- t(")]
    assert tools == [x for x in lines if x.startswith("- t(")][-len(tools):]   # the newest short outputs stay
    assert dropped == 6 - len(kept) and count(R.section(kept, dropped, True)) <= 40
    assert "search_history finds them" in R.section(kept, dropped, True)
    assert R.fit(lines, 3, count) == ([], 0)   # not even the note fits


# ------------------------------------------------------------------ in a session
def mk(tmp_path, faults=None, mode="hard", window=1000, **pol):
    eng = FakeEngine(n_ctx=8192)
    pol.setdefault("summary_max_tokens", 96)
    s = pk.Session(eng, system="You are an agent.", history_dir=tmp_path, session_id="res",
                   summarizer=Summarizer(faults=faults) if faults else None,
                   policy=pk.Policy(mode=mode, window=window, compact_tool=False, history_tool=False, **pol))
    return eng, s


def run_task(s, accounts=4, pages=4):
    """An agent that works by tool calls alone (its turns are added, not generated: the fake model's replies
    would be statements, which the summary lists first); the settled totals are short tool outputs, the
    pages long ones."""
    totals, i = {}, 0
    s.chat("Reconcile the accounts one by one and note each settled total.", max_tokens=8)
    for a in range(accounts):
        for p in range(pages):
            s.add([call(i, "list_transactions", account=f"ACC-{a}", page=p + 1), out(i, page(i))])
            i += 1
        totals[a] = f"{-1000 - 37.25 * a:.2f}"
        s.add([call(i, "settle", account=f"ACC-{a}"), out(i, f"Account ACC-{a} reconciled. Settled total: {totals[a]}")])
        i += 1
    s.chat("Go on.", max_tokens=8)
    return totals


def summary_text(s):
    return "\n".join(m["content"] for m in s.messages if m.get("summary"))


def test_results_survive_repeated_compactions_and_stay_within_the_budget(tmp_path):
    _, s = mk(tmp_path, window=1600, summary_max_tokens=200)
    totals = run_task(s)
    rebased = [e for e in s.events if e.name == "rebased"]
    assert len(rebased) >= 3
    assert all(e.summary_tokens <= summary_message_budget(s.policy, s.window) for e in rebased)
    gone = [a for a, v in totals.items() if not any(v in (m.get("content") or "") for m in s.messages
                                                    if not m.get("summary"))]
    assert len(gone) >= 2    # those totals left the raw context: only the summary can carry them
    text = summary_text(s)
    assert R.RESULTS_HEADING in text
    assert all(totals[a] in text for a in gone)


def test_the_fallback_summary_carries_the_results_too(tmp_path):
    _, s = mk(tmp_path, faults=["exception"] * 200, window=1600, summary_max_tokens=200)
    totals = run_task(s)
    assert any(e.name == "summary_failed" for e in s.events)
    text = summary_text(s)
    assert "Automatic summary" in text
    assert all(v in text for a, v in totals.items() if a < 2)


def test_background_mode_carries_the_results(tmp_path):
    # (notes off: the fake model would note a page's second line, which competes with the totals by recency;
    # tests/test_notes.py covers notes)
    _, s = mk(tmp_path, mode="background", window=1600, summary_max_tokens=200, notes=False)
    totals = run_task(s, accounts=5)
    assert any(e.name == "rebased" for e in s.events)
    assert totals[0] in summary_text(s) and totals[1] in summary_text(s)


def test_results_are_carried_after_a_load_from_the_log(tmp_path):
    _, s = mk(tmp_path, window=1600, summary_max_tokens=200)
    totals = run_task(s, accounts=3)
    log = s.log_path
    s.close()
    eng2 = FakeEngine(n_ctx=8192)
    s2 = pk.Session.load(eng2, log, recall_tokens=0)   # (recall would add lookups: not what is tested)
    assert totals[0] in summary_text(s2)
    for i in range(100, 112):   # more work: the next summary must still carry the first total
        s2.add([call(i, "list_transactions", account="ACC-9", page=i), out(i, page(i))])
    assert sum(e.name == "rebased" for e in s2.events) >= 1
    assert totals[0] in summary_text(s2)


def test_the_summary_points_to_search_history_when_the_session_offers_it(tmp_path):
    eng = FakeEngine(n_ctx=8192)
    s = pk.Session(eng, history_dir=tmp_path, session_id="ptr",
                   policy=pk.Policy(mode="hard", window=1200, compact_tool=False, history_tool=True,
                                    summary_max_tokens=96))
    run_task(s, accounts=3)
    assert "search_history looks up" in summary_text(s)
    _, s2 = mk(tmp_path / "b")
    run_task(s2, accounts=3)
    assert "search_history" not in summary_text(s2)


# (the probe's cue is structural now, not a tool output's wording: tests/test_cue.py)


# ------------------------------------------------------------------ a model summary sized to the time left
def background(tmp_path, **pol):
    eng = FakeEngine(n_ctx=8192)
    s = pk.Session(eng, system="You are an agent.", history_dir=tmp_path, session_id="pace",
                   policy=pk.Policy(mode="background", window=1200, compact_tool=False, history_tool=False,
                                    summary_max_tokens=96, max_stall_ms=20, **pol))
    return eng, s


def failed(s, reason):
    return [e for e in s.events if e.name == "summary_failed" and e.reason == reason]


def test_after_a_summary_missed_the_edge_the_next_is_sized_to_the_measured_pace(tmp_path):
    eng, s = background(tmp_path)
    eng.bg_polls = 10 ** 6   # the model never finishes in time
    i = 0
    while not failed(s, "max_stall"):
        s.chat([call(i, "list_transactions", page=i), out(i, page(i))], max_tokens=8)
        i += 1
        assert i < 40
    assert s._compactor.background.paced
    meter = s._compactor.meter
    def slow():   # a second of prompt, then half a token a second: nothing fits before the edge
        meter._prompt_s, meter._write, meter._growth, meter._prefill = 1.0, 0.5, 500.0, 1000.0
    slow()
    # the fake engine's jobs show all their tokens at once: keep the paces of a slow machine
    meter.summary_pace = meter.prefill = meter.turn = lambda *a, **k: None
    n = len(failed(s, "max_stall"))
    for j in range(i, i + 12):
        s.chat([call(j, "list_transactions", page=j), out(j, page(j))], max_tokens=8)
        slow()
    skipped = failed(s, "no_time")
    assert len(skipped) >= 3, [e.name for e in s.events]
    assert all(e.attempt == 0 for e in skipped)   # the model was not asked
    # the model is asked again, uncapped, after RETRY_AFTER_SKIPS summaries without it (its pace may have
    # changed): only those attempts can still be abandoned at the edge
    from pykvcompact.compaction.background import RETRY_AFTER_SKIPS
    assert len(failed(s, "max_stall")) - n <= len(skipped) // RETRY_AFTER_SKIPS + 1
    after = [e for e in s.events if e.name == "rebased"][-1]
    assert after.fallback and after.prepared
    assert R.RESULTS_HEADING in summary_text(s) or "Automatic summary" in summary_text(s)


def test_a_fast_enough_model_still_writes_the_summary(tmp_path):
    eng, s = background(tmp_path)
    s._compactor.background.paced = True
    meter = s._compactor.meter
    for j in range(14):
        meter._prompt_s, meter._write, meter._growth, meter._prefill = 0.0, 1e6, 10.0, 1e6
        s.chat([call(j, "list_transactions", page=j), out(j, page(j))], max_tokens=8)
    assert not failed(s, "no_time")
    assert any(e.name == "rebased" and not e.fallback for e in s.events)


@pytest.mark.parametrize("fast", [False, True])
def test_at_the_window_edge_the_model_is_asked_only_for_what_it_writes_within_max_stall(tmp_path, fast):
    # the conversation waits for a swap at the edge: an uncapped summary would be abandoned at max_stall_ms,
    # its attempt having slowed the steps the swap waits on (before, a full window always asked the model)
    eng, s = background(tmp_path)
    for j in range(4):
        s.chat([call(j, "list_transactions", page=j), out(j, page(j))], max_tokens=8)
    compactor = s._compactor
    compactor.cancel(None)
    compactor.background.paced = True
    meter = compactor.meter
    meter._prompt_s, meter._write, meter._growth, meter._prefill = (0.0, 1e6, 10.0, 1e6) if fast else (1.0, 5.0, 10.0, 1e6)
    skips, missed = compactor.background.skips, compactor.background.missed
    n_skipped, n_missed = len(failed(s, "no_time")), len(failed(s, "max_stall"))
    prepared = []
    real_prepare = compactor.ctx.seq.prepare_rebase
    compactor.ctx.seq.prepare_rebase = lambda *a, **k: prepared.append(a) or real_prepare(*a, **k)
    rebased = compactor.compact("window_full", edge=True)
    assert rebased is not None and rebased.trigger == "window_full"
    started = [e for e in s.events if e.name == "summary_started"][-1]
    assert started.reason == "window_full"
    skipped = failed(s, "no_time")[n_skipped:]
    if fast:
        assert not skipped                            # it can write in time: asked
    else:
        assert len(skipped) == 1 and skipped[0].attempt == 0 and rebased.fallback   # not asked
        assert compactor.background.skips == skips    # (the schedule's retries count only its own starts)
        assert len(prepared) == 1                     # one rebuilt context (not a fallback beside the fallback)
    # nothing missed the edge: no max_stall failure, no pace fed from a model that was not writing
    assert len(failed(s, "max_stall")) == n_missed and compactor.background.missed == missed


# ------------------------------------------------------------------ review of the first version (regressions)
def test_a_small_text_budget_still_asks_the_model_outside_the_paced_background(tmp_path):
    _, s = mk(tmp_path, summary_max_tokens=48)
    s.chat("Lint the repository.", max_tokens=8)
    for i in range(12):
        s.chat([call(i, "lint", path=f"src/m{i}.py"), out(i, f"Check lint: 0 errors in {40 + i} files")], max_tokens=8)
    assert not failed(s, "no_time")
    assert s.compact("keep the number of files checked") is not None
    assert any(e.name == "summary_ready" and not e.fallback for e in s.events)


def test_a_log_gives_its_last_line():
    log = "\n".join(f"tests/test_{k}.py::test_case_{k} PASSED [{k % 100:3d}%]" for k in range(1000))
    log += "\n== 1 failed, 999 passed in 12.31s =="
    assert listed([call(1, "pytest"), out(1, log)]) == ["- pytest, last of 1001 lines: == 1 failed, 999 passed in 12.31s =="]


def test_a_result_is_labelled_by_the_call_just_before_it_when_ids_repeat():
    msgs = []
    for a in range(4):   # every turn reuses "call_0", as a caller restarting its counter does
        msgs += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "settle", "arguments": {"account": f"ACC-{a}"}}}]},
                 {"role": "tool", "tool_call_id": "call_0", "content": f"Settled total: {-1000 - a}.00"}]
    assert listed(msgs) == [f"- settle(account=ACC-{a}): Settled total: {-1000 - a}.00" for a in range(4)]


def test_the_left_out_note_is_carried_to_the_next_summaries(tmp_path):
    _, s = mk(tmp_path, window=1000, summary_max_tokens=40)
    s.chat("Reconcile many accounts.", max_tokens=8)
    for a in range(14):
        s.chat([call(a, "settle", account=f"ACC-{a}"), out(a, f"Account ACC-{a} reconciled. Settled total: {-1000 - a}.25")],
               max_tokens=8)
        s.chat([call(100 + a, "list", page=a), out(100 + a, page(a, 6))], max_tokens=8)
    texts = [m["content"] for m in s.transcript if m.get("summary")]
    noted = [i for i, t in enumerate(texts) if "left out for space" in t]
    assert noted and noted == list(range(noted[0], len(texts)))   # once said, said in every later summary
    budget = summary_message_budget(s.policy, s.window)
    assert all(e.summary_tokens <= budget for e in s.events if e.name == "rebased")


def test_fit_counts_each_line_about_once():
    calls = []

    def count(t):
        calls.append(t)
        return len(t.split())
    lines = [f"- log: run {k} passed with 12 checks" for k in range(1000)]
    kept, left = R.fit(lines, 200, count)
    assert kept == lines[-len(kept):] and left == 1000 - len(kept)
    assert len(calls) <= len(lines) + 10


def test_a_pinned_tool_output_is_not_listed_twice(tmp_path):
    _, s = mk(tmp_path)
    s.chat("Reconcile.", max_tokens=8)
    s.chat([call(0, "settle", account="ACC-9"), out(0, "Settled total: 77.50")], max_tokens=8)
    s.pin(len(s.transcript) - 2)   # the tool result
    for i in range(1, 14):
        s.chat([call(i, "list", page=i), out(i, page(i))], max_tokens=8)
    text = summary_text(s)
    assert text.count("Settled total: 77.50") == 1


def test_retries_of_a_model_that_keeps_missing_the_edge_back_off(tmp_path):
    from pykvcompact.compaction.background import RETRY_AFTER_SKIPS
    eng, s = background(tmp_path)
    eng.bg_polls = 10 ** 6   # the model never finishes in time
    meter = s._compactor.meter

    def slow():   # as above: nothing fits before the edge at the measured pace
        meter._prompt_s, meter._write, meter._growth, meter._prefill = 1.0, 0.5, 500.0, 1000.0
    meter.summary_pace = meter.prefill = meter.turn = lambda *a, **k: None
    for j in range(150):
        s.chat([call(j, "list_transactions", page=j), out(j, page(j))], max_tokens=8)
        slow()
    seq = [e.reason for e in s.events if e.name == "summary_failed" and e.reason in ("max_stall", "no_time")]
    gaps, n = [], 0   # summaries without the model between two abandoned attempts
    for r in seq:
        if r == "max_stall":
            gaps.append(n)
            n = 0
        else:
            n += 1
    gaps = gaps[1:]   # (before the first: the pace was not known yet)
    assert len(gaps) >= 2, seq
    assert gaps[0] >= RETRY_AFTER_SKIPS and gaps[1] >= 2 * RETRY_AFTER_SKIPS, gaps
    assert gaps == sorted(gaps), gaps
    check = [e for e in s.events if e.name == "dropped"]
    assert not check
