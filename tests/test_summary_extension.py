"""A summary is extended, not rewritten, while the addition fits (compaction/summary/extension.py): the previous
summary's text stays as it was, so its tokens (and their KV) are reused by the next swap."""
from __future__ import annotations

import pykvcompact as pk
from pykvcompact.compaction.policy import summary_message_budget
from pykvcompact.compaction.summary import results as R
from pykvcompact.compaction.summary.extension import LATER_HEADING, extend
from pykvcompact.compaction.summary.keeper import Candidate, SummaryMeta

from fake_engine import FakeEngine
from test_results import call, out, page


def count(text):
    return len(text.split())


def _meta():
    return SummaryMeta([Candidate(1, "user", "Reconcile every account.", 6, False, True)], "",
                       ["Never touch ACC-9."], ["- settle(account=ACC-0): Settled total: -1000.00"], 0)


PREVIOUS = "[Summary]\n\nUser messages, verbatim (oldest first):\nReconcile every account.\n\n- settle ..."


def test_an_extension_keeps_the_previous_text_and_adds_only_what_is_new():
    meta = _meta()
    fresh = "- settle(account=ACC-1): Settled total: -1037.25"
    got = extend(PREVIOUS, meta, kept=meta.kept + [Candidate(7, "user", "Now ACC-1, please.", 6, False, False)],
                 standing=["Never touch ACC-9.", "Report in EUR."], text="",
                 results=meta.results + [fresh], cap=100, limit=200, count=count, searchable=False)
    assert got is not None
    content, new_meta = got
    assert content.startswith(PREVIOUS + "\n\n" + LATER_HEADING)
    added = content[len(PREVIOUS):]
    assert "Now ACC-1, please." in added and "Report in EUR." in added and fresh in added
    assert "Reconcile every account." not in added and "Never touch ACC-9." not in added   # held already
    assert meta.results[0] not in added
    assert [c.tidx for c in new_meta.kept] == [1, 7]
    assert new_meta.standing == ["Never touch ACC-9.", "Report in EUR."]
    assert new_meta.results == meta.results + [fresh]


def test_nothing_new_leaves_the_summary_as_it_was():
    meta = _meta()
    assert extend(PREVIOUS, meta, kept=meta.kept, standing=meta.standing, text="", results=meta.results, cap=50,
                  limit=200, count=count, searchable=False) == (PREVIOUS, meta)


def test_no_extension_past_the_budget_or_when_a_result_would_be_left_out():
    meta = _meta()
    big = [f"- settle(account=ACC-{i}): Settled total: -{1000 + i}.00" for i in range(1, 30)]
    # the limit is reached: the caller rewrites the summary
    assert extend(PREVIOUS, meta, kept=meta.kept, standing=[], text="word " * 300, results=meta.results, cap=100,
                  limit=200, count=count, searchable=False) is None
    # a short output's whole line does not fit the cap: a rewrite would make room for it, so no extension
    assert extend(PREVIOUS, meta, kept=meta.kept, standing=[], text="", results=meta.results + big, cap=20,
                  limit=400, count=count, searchable=False) is None
    # a long output's last line may be left out (it is the first a rewrite leaves out too)
    last = "- list_transactions(account=ACC-1, page=1), last of 12 lines: " + "tx " * 40
    content, new_meta = extend(PREVIOUS, meta, kept=meta.kept, standing=[], text="",
                               results=meta.results + [big[0], last], cap=30, limit=400, count=count,
                               searchable=True)
    assert big[0] in content and last not in content and new_meta.left_out == 1
    assert "1 earlier lines left out" in content


def test_a_newer_output_of_a_listed_call_makes_a_rewrite():
    # the summary lists settle(ACC-0): a newer output of the same call must replace it, which only a rewrite does
    meta = _meta()
    newer = "- settle(account=ACC-0): Settled total: -999.00"
    assert extend(PREVIOUS, meta, kept=meta.kept, standing=[], text="", results=[newer], cap=100, limit=400,
                  count=count, searchable=False) is None


def test_a_repeated_user_message_is_not_added_again():
    meta = _meta()
    again = Candidate(9, "user", "Reconcile  every account.", 6, False, False)   # the first one, sent again
    content, new_meta = extend(PREVIOUS, meta, kept=meta.kept + [again], standing=[], text="", results=meta.results,
                               cap=100, limit=400, count=count, searchable=False)
    assert content == PREVIOUS and [c.tidx for c in new_meta.kept] == [1]


# ------------------------------------------------------------------ in a session
def _session(tmp_path, engine, mode="hard", window=1600):
    return pk.Session(engine, system="You are an agent.", history_dir=tmp_path, session_id="ext",
                      policy=pk.Policy(mode=mode, window=window, compact_tool=False, history_tool=False,
                                       summary_max_tokens=200, notes=False))


def _work(s, accounts=5, pages=4):
    totals, i = {}, 0
    s.chat("Reconcile the accounts one by one and note each settled total.", max_tokens=8)
    for a in range(accounts):
        for p in range(pages):
            s.add([call(i, "list_transactions", account=f"ACC-{a}", page=p + 1), out(i, page(i))])
            i += 1
        totals[a] = f"{-1000 - 37.25 * a:.2f}"
        s.add([call(i, "settle", account=f"ACC-{a}"), out(i, f"Account ACC-{a} reconciled. Settled total: {totals[a]}")])
        i += 1
        if a == 2:
            s.chat("From now on, report totals in EUR.", max_tokens=8)
    return totals


def _summaries(s):
    return [m["content"] for m in s.transcript if m.get("summary")]


def _kept_totals(s, totals):
    text = "\n".join(m.get("content") or "" for m in s.messages)
    return {a for a, v in totals.items() if v in text}


def test_a_session_extends_its_summary_and_the_swap_reuses_the_previous_tokens(tmp_path, monkeypatch):
    import pykvcompact.compaction.summary.summaries as maker
    with monkeypatch.context() as m:   # the same work, every summary rewritten: what it keeps is the bar
        m.setattr(maker, "extend", lambda *a, **k: None)
        plain = _session(tmp_path / "plain", FakeEngine(n_ctx=8192))
        plain_totals = _work(plain)
        assert not any(LATER_HEADING in t for t in _summaries(plain))
        bar = _kept_totals(plain, plain_totals)
        swaps = [e for e in plain.events if e.name == "rebased"]
        plain_rows = sum(e.summary_tokens - e.summary_reused for e in swaps) / len(swaps)
    s = _session(tmp_path, FakeEngine(n_ctx=8192))
    totals = _work(s)
    rebased = [e for e in s.events if e.name == "rebased"]
    texts = _summaries(s)
    assert len(rebased) == len(texts) >= 4
    extended = [i for i in range(1, len(texts)) if texts[i].startswith(texts[i - 1] + "\n\n" + LATER_HEADING)]
    assert extended, "no swap extended the summary before it"
    for i in extended:   # the previous summary's tokens were in place: the swap reused them
        assert rebased[i].summary_reused >= 0.9 * rebased[i - 1].summary_tokens
    budget = summary_message_budget(s.policy, s.window)
    assert all(e.summary_tokens <= budget for e in rebased)
    text = "\n".join(m.get("content") or "" for m in s.messages)
    assert "From now on, report totals in EUR." in text   # the user's words survive extension and rewrite
    assert _kept_totals(s, totals) >= bar and len(bar) >= 4   # keeps what rewriting every time keeps
    rows = sum(e.summary_tokens - e.summary_reused for e in rebased) / len(rebased)
    assert rows < plain_rows   # and a swap computes fewer summary tokens again
    assert R.RESULTS_HEADING in s.messages[1]["content"]
    assert s.tokens == s.sequence.tokens and len(s.tokens) == s.n_tokens


def test_an_extended_summary_is_extended_again_after_a_reload(tmp_path):
    eng = FakeEngine(n_ctx=8192)
    s = _session(tmp_path, eng)
    _work(s, accounts=3)
    before = _summaries(s)
    live = s.messages[1]["content"]
    log = s.log_path
    s.close()
    back = pk.Session.load(eng, log)
    assert back.messages[1]["content"] == live
    i = 100
    for p in range(8):
        back.add([call(i, "list_transactions", account="ACC-7", page=p + 1), out(i, page(i))])
        i += 1
        back.add([call(i, "settle", account="ACC-7"), out(i, f"Account ACC-7 reconciled. Settled total: -7.{p}0")])
        i += 1
    after = _summaries(back)
    assert len(after) > len(before)
    # the summary that the reload brought back was extended, not rewritten (its meta came back with it)
    first_new = after[len(before)]
    assert first_new.startswith(live + "\n\n" + LATER_HEADING)


def test_the_real_engine_reuses_the_previous_summary_cells(tiny_model_path, tmp_path):
    eng = pk.Engine(tiny_model_path, n_ctx=4096, n_seq_max=4, seed=0, flash_attn=False)
    try:
        s = _session(tmp_path, eng, mode="background", window=1600)
        _work(s, accounts=4)
        rebased = [e for e in s.events if e.name == "rebased"]
        assert any(e.summary_reused > 0 for e in rebased)
        assert eng.stats()["rebase_reused_rows"] > 0
        # the live sequence holds exactly what the live messages render to
        assert s.tokens == eng.tokenize(s.render(), add_special=False, parse_special=True)
        s.close()
    finally:
        eng.close()
