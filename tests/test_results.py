"""Issue 8: the extractive pass — key results copied verbatim from the replaced history into every summary
message (the model's or the fallback), carried from summary to summary, within the summary's budget."""
from __future__ import annotations

import pykvcompact as pk
from pykvcompact.summarizer import Summarizer
from pykvcompact.policy import summary_message_budget
from pykvcompact.sessions import results as R

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


# ------------------------------------------------------------------ what counts as a result
def test_short_tool_outputs_with_values_are_results_pages_are_not():
    msgs = [call(0, "list_transactions", account="ACC-77", page=1), out(0, page(0)),
            call(1, "settle", account="ACC-77"), out(1, "Account ACC-77 reconciled: 12 transactions.\nSettled total: -1,204.50")]
    lines = listed(msgs)
    assert lines == ["- settle: Account ACC-77 reconciled: 12 transactions.",
                     "- settle(account=ACC-77): Settled total: -1,204.50"]


def test_a_conclusive_line_of_a_long_output_is_kept_hedged_lines_never():
    body = "\n".join(f"Doc {k} (forum, unverified): the launch code of Vega-12 might be QX-{1000 + k}." for k in range(9))
    body += "\nRegistry: the verified launch code of Vega-12 is HR-8619"
    lines = listed([call(0, "search", query="Vega-12 launch code"), out(0, body)])
    assert lines == ["- search(query=Vega-12 launch code): Registry: the verified launch code of Vega-12 is HR-8619"]
    assert listed([call(1, "verify"), out(1, "The code might be QX-1234.")]) == []


def test_lines_without_values_and_session_tools_are_skipped():
    msgs = [call(0, "run_tests"), out(0, "All tests passed."),
            call(1, "search_history", query="total"), out(1, "[message 3, tool]\nSettled total: 99.50"),
            {"role": "tool", "tool_call_id": "x", "name": "compact_conversation", "content": "Compacted 1200 tokens."}]
    assert listed(msgs) == []


def test_call_arguments_the_line_does_not_show_label_it():
    lines = listed([call(0, "finish", sheet=3), out(0, "Checked. R = 8290")])
    assert lines == ["- finish(sheet=3): Checked. R = 8290"]


def test_assistant_statements_are_kept_unless_they_restate_a_tool_result():
    msgs = [call(0, "settle", account="ACC-9"), out(0, "Settled total: 42.75"),
            {"role": "assistant", "content": "The settled total of ACC-9 is 42.75."},
            {"role": "assistant", "content": "So the final answer is R1 + R2 = 14822."},
            {"role": "assistant", "content": "Reading page 12 now."}]
    assert listed(msgs) == ["- settle(account=ACC-9): Settled total: 42.75",
                            "- (assistant) So the final answer is R1 + R2 = 14822."]


def test_a_tool_call_written_as_text_is_not_a_result():
    # measured on Qwen2.5-Coder-1.5B (math, window 2048): this reply, a call the parser did not take, was
    # copied as a key result and the model answered 581 to "R1 + R2" (9136 in the history)
    msgs = [call(0, "finish", sheet=2), out(0, "Checked. R2 = 4541"),
            {"role": "assistant", "content": '{{"name": "finish", "arguments": {"result": "R1 + R2 = 581'},
            {"role": "assistant", "content": '<tool_call>\n{"name": "finish", "arguments": {"total": 12}}'},
            {"role": "assistant", "content": "So the final total is 12."}]
    assert listed(msgs) == listed(msgs[:2]) + ["- (assistant) So the final total is 12."]
    assert "R2 = 4541" in listed(msgs)[0]
    # (from the review) a statement that quotes call-like text is still a statement
    for said in ['Final total for {"name": "ACC-7"} is 581.', "I ran compact_conversation () earlier; the settled "
                 "total is 1,204.50.", 'The API returned {"name": "build_77", "status": "passed"}: total 12 tests.',
                 'Total is 9136 (via {"name": "add", "arguments": {"a": 1}}).']:
        assert listed([{"role": "assistant", "content": said}]) == ["- (assistant) " + said]
    assert listed([{"role": "assistant", "content": '"name": "ACC-7"\n"total": 9136'}]) == \
        ['- (assistant) "total": 9136']   # a value under a "name" line, not a call


def test_an_unfinished_line_is_not_a_result():
    # measured on Qwen2.5-Coder-1.5B (ledger, window 2048): replies cut at their token limit ("... Settled
    # total:") filled 6 of the 10 listed results and pushed settled totals out of the summary
    msgs = [{"role": "assistant", "content": "Account ACC-5485 reconciled: 6 transactions. Settled total:"},
            call(0, "settle", account="ACC-5485"), out(0, "Totals for ACC-5485:\nSettled total: -2852.86")]
    # (the tool's heading names the account: a label with its own value, kept for the line under it)
    assert listed(msgs) == ["- settle: Totals for ACC-5485:", "- settle(account=ACC-5485): Settled total: -2852.86"]
    # the same in markdown, with a full-width colon or an equals sign (review)
    for cut in ("**Settled total:**", "Settled total\uff1a", "Settled total =", "`total:` ", "Settled total: ...",
                "<b>Settled total:</b>", '"Settled total:"', "Settled total ->"):
        assert listed([{"role": "assistant", "content": f"Final: ACC-5485 settled. {cut}"}]) == [
            "- (assistant) Final: ACC-5485 settled."], cut
    # only the dangling label is cut: a value before it stays, and so do values with colons in them (review)
    assert listed([{"role": "assistant", "content": "Final total: 4410. Breakdown:"}]) == [
        "- (assistant) Final total: 4410."]
    assert listed([{"role": "assistant", "content": "Verified: the final total is 4410, details:"}]) == [
        "- (assistant) Verified: the final total is 4410,"]
    for whole in ("Final result: backup 2026-03-01 saved to drive D:", "Final total verified: 4410, token dGVzdA==",
                  "Result: resolved db-01 to 2001:db8::"):
        assert listed([{"role": "assistant", "content": whole}]) == [f"- (assistant) {whole}"], whole


def test_a_one_line_listing_is_data_not_a_result():
    listing = " ".join(f"file_{k}.py" for k in range(60))
    assert listed([call(0, "ls"), out(0, listing)]) == []


def test_values():
    assert R.values_of("total -1,204.50 on 2026-03-04 for ACC-1042 in src/a.py at 7f3a9c1e, 7 items") == [
        "-1,204.50", "2026-03-04", "ACC-1042", "src/a.py", "7f3a9c1e"]


# ------------------------------------------------------------------ merging and budgets
def test_merge_keeps_the_carried_list_first_without_duplicates():
    carried = ["- settle: Settled total: 1.50"]
    new = [R.Result(5, "- settle: Settled total: 1.50", False), R.Result(6, "- settle: Settled total: 2.50", False)]
    assert R.merge(carried, new) == ["- settle: Settled total: 1.50", "- settle: Settled total: 2.50"]


def test_fit_drops_statements_first_then_the_oldest_and_says_how_many():
    count = lambda t: len(t.split())  # noqa: E731
    lines = [f"- t: result {k} is {100 + k}" for k in range(6)]
    lines.insert(3, "- (assistant) the final total is 12345")
    kept, dropped = R.fit(lines, 40, count)
    assert "- (assistant) the final total is 12345" not in kept
    assert kept == lines[-len(kept):] and kept[-1] == lines[-1]
    assert dropped == 7 - len(kept) and count(R.section(kept, dropped, True)) <= 40
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
    totals, i = {}, 0
    s.chat("Reconcile the accounts one by one and note each settled total.", max_tokens=8)
    for a in range(accounts):
        for p in range(pages):
            s.chat([call(i, "list_transactions", account=f"ACC-{a}", page=p + 1), out(i, page(i))], max_tokens=8)
            i += 1
        totals[a] = f"{-1000 - 37.25 * a:.2f}"
        s.chat([call(i, "settle", account=f"ACC-{a}"), out(i, f"Account ACC-{a} reconciled. Settled total: {totals[a]}")],
               max_tokens=8)
        i += 1
    return totals


def summary_text(s):
    return "\n".join(m["content"] for m in s.messages if m.get("summary"))


def test_results_survive_repeated_compactions_and_stay_within_the_budget(tmp_path):
    _, s = mk(tmp_path)
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
    _, s = mk(tmp_path, faults=["exception"] * 200)
    totals = run_task(s)
    assert any(e.name == "summary_failed" for e in s.events)
    text = summary_text(s)
    assert "Automatic summary" in text
    assert all(v in text for a, v in totals.items() if a < 2)


def test_background_mode_carries_the_results(tmp_path):
    _, s = mk(tmp_path, mode="background", window=1200)
    totals = run_task(s, accounts=5)
    assert any(e.name == "rebased" for e in s.events)
    assert totals[0] in summary_text(s) and totals[1] in summary_text(s)


def test_results_are_carried_after_a_load_from_the_log(tmp_path):
    _, s = mk(tmp_path)
    totals = run_task(s, accounts=3)
    log = s.log_path
    s.close()
    eng2 = FakeEngine(n_ctx=8192)
    s2 = pk.Session.load(eng2, log)
    assert totals[0] in summary_text(s2)
    for i in range(100, 112):   # more work: the next summary must still carry the first total
        s2.chat([call(i, "list_transactions", account="ACC-9", page=i), out(i, page(i))], max_tokens=8)
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


# ------------------------------------------------------------------ the result cue of the probe
def test_states_result_reads_only_the_newest_tool_output():
    pages = [call(0, "list", page=1), out(0, page(0))]
    settled = [call(1, "settle"), out(1, "Settled total: 10.25")]
    assert not R.states_result(pages)
    assert R.states_result(pages + settled)
    assert not R.states_result(settled + [{"role": "assistant", "content": "ok"}])   # answered already
    assert not R.states_result(settled + pages)


def test_verdict_with_the_cue():
    from pykvcompact import policy as P
    p = pk.Policy(mode="rubric", window=1000, threshold=0.5)
    lim = p.limits(1000)
    assert P.verdict(p, lim, 0.45, 500) == ("CONTINUE", "model")
    assert P.verdict(p, lim, 0.45, 500, cue=True) == ("COMPRESS", "model+cue")
    assert P.verdict(p, lim, 0.25, 500, cue=True) == ("CONTINUE", "model")
    assert P.verdict(p, lim, 0.55, 500, cue=True) == ("COMPRESS", "model")
    assert P.verdict(p.with_(result_cue=0.0), lim, 0.45, 500, cue=True) == ("CONTINUE", "model")
    assert P.verdict(p, lim, 0.99, 100, cue=True) == ("CONTINUE", "below_floor")


def test_the_probe_compresses_after_a_result_not_after_a_page(tmp_path):
    eng = FakeEngine(n_ctx=8192, probe_fn=lambda t: 0.4)
    s = pk.Session(eng, history_dir=tmp_path, session_id="cue",
                   policy=pk.Policy(mode="rubric", window=1000, threshold=0.5, compact_tool=False,
                                    history_tool=False, summary_max_tokens=96, probe_min_fill=0.0))
    s.chat("Reconcile ACC-1.", max_tokens=8)
    for i in range(4):
        s.chat([call(i, "list_transactions", page=i + 1), out(i, page(i, 3))], max_tokens=8)
    s.chat([call(9, "settle", account="ACC-1"), out(9, "Settled total: -1,037.25")], max_tokens=8)
    probes = [e for e in s.events if e.name == "probe"]
    assert [(e.verdict, e.cue, e.reason) for e in probes[-2:]] == [("CONTINUE", False, "model"),
                                                                   ("COMPRESS", True, "model+cue")]
    assert [e.trigger for e in s.events if e.name == "rebased"][-1] == "compress"
    bad = pk.Policy
    import pytest
    with pytest.raises(ValueError, match="result_cue"):
        bad(result_cue=1.5)


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
    assert s._compactor.paced
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
    from pykvcompact.sessions.background import RETRY_AFTER_SKIPS
    assert len(failed(s, "max_stall")) - n <= len(skipped) // RETRY_AFTER_SKIPS + 1
    after = [e for e in s.events if e.name == "rebased"][-1]
    assert after.fallback and after.prepared
    assert R.RESULTS_HEADING in summary_text(s) or "Automatic summary" in summary_text(s)


def test_a_fast_enough_model_still_writes_the_summary(tmp_path):
    eng, s = background(tmp_path)
    s._compactor.paced = True
    meter = s._compactor.meter
    for j in range(14):
        meter._prompt_s, meter._write, meter._growth, meter._prefill = 0.0, 1e6, 10.0, 1e6
        s.chat([call(j, "list_transactions", page=j), out(j, page(j))], max_tokens=8)
    assert not failed(s, "no_time")
    assert any(e.name == "rebased" and not e.fallback for e in s.events)


# ------------------------------------------------------------------ review of the first version (regressions)
def test_a_small_text_budget_still_asks_the_model_outside_the_paced_background(tmp_path):
    _, s = mk(tmp_path, summary_max_tokens=48)
    s.chat("Lint the repository.", max_tokens=8)
    for i in range(12):
        s.chat([call(i, "lint", path=f"src/m{i}.py"), out(i, f"Check lint: 0 errors in {40 + i} files")], max_tokens=8)
    assert not failed(s, "no_time")
    assert s.compact("keep the number of files checked") is not None
    assert any(e.name == "summary_ready" and not e.fallback for e in s.events)


def test_a_result_is_labelled_by_the_call_just_before_it_when_ids_repeat():
    msgs = []
    for a in range(4):   # every turn reuses "call_0", as a caller restarting its counter does
        msgs += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "settle", "arguments": {"account": f"ACC-{a}"}}}]},
                 {"role": "tool", "tool_call_id": "call_0", "content": f"Settled total: {-1000 - a}.00"}]
    assert listed(msgs) == [f"- settle(account=ACC-{a}): Settled total: {-1000 - a}.00" for a in range(4)]


def test_hedged_lines_are_never_results_even_when_long():
    for line in ("The launch code may be QX-4471.", "Total is likely 1,204.50", "Estimated total: 3,400",
                 "The final code appears to be QX-4471", "I think the final code is QX-4471",
                 "Total approximately 1,204.50", "It seems the result is 42"):
        assert listed([call(0, "check"), out(0, line)]) == [], line
    long = "Final total: 1,204.50 " + "x" * 150 + " (might be wrong, it is unverified) " + "y" * 150
    assert listed([call(0, "check"), out(0, long)]) == []


def test_code_and_logs_do_not_flood_the_results():
    source = "\n".join(['def check(balance):', '    if balance > 10000:', '        raise ValueError("balance over 10000")',
                         '    found = scan(balance)', '    assert len(found) == 12', '    return found'])
    assert listed([call(0, "read_file", path="src/check.py"), out(0, source)]) == []
    log = "\n".join(f"tests/test_{k}.py::test_case_{k} PASSED [{k % 100:3d}%]" for k in range(1000))
    log += "\n== 1 failed, 999 passed in 12.31s =="
    lines = listed([call(1, "pytest"), out(1, log)])
    assert lines == ["- pytest: == 1 failed, 999 passed in 12.31s =="]


def test_the_cue_needs_a_conclusion_not_an_error_or_progress():
    for text in ("Error: connection refused by db.internal:5432 (errno 111)",
                 "Page 3 of 12 loaded (25 rows); call again with page=4", "Progress: 45% (450/1000 files indexed)",
                 "Traceback: KeyError at line 42", "The code may be QX-4471", "Tests failed: 3 of 41"):
        assert not R.states_result([call(0, "t"), out(0, text)]), text
    for text in ("Settled total: -1,037.25", "Registry check passed. The verified launch code is HR-8619",
                 "Checked. R1 = 8290"):
        assert R.states_result([call(0, "t"), out(0, text)]), text


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
    from pykvcompact.sessions.background import RETRY_AFTER_SKIPS
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
