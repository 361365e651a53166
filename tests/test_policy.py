"""Pure policy rules (no engine): thresholds, window sizing, mark selection, context-shift plan, verdicts."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

import pykvcompact as pk
from pykvcompact.compaction import policy as P
from pykvcompact.compaction import rubrics


def test_defaults_match_the_spec():
    p = pk.Policy()
    assert (p.mode, p.window, p.hard, p.soft, p.fixed_at, p.keep_recent) == ("background", None, 0.85, 2 / 3, 0.30, 0.10)
    assert (p.probe_every, p.probe_on_tool_result, p.rubric, p.threshold, p.rebase) == (256, True, "boundary", None, "exact")
    assert p.history_tool is None and p.offers_search and p.compact_tool  # both tools offered (auto: window None)
    assert (p.compact_tool, p.tool_min_fill, p.summary_max_tokens) == (True, 0.5, None)
    assert (p.max_stall_ms, p.keep_user_tokens, p.probe_every_tools) == (500, None, 1)
    # the summary budget and the kept user messages scale with the window (1/8; the summary at most 512)
    assert (p.summary_tokens(1024), p.summary_tokens(8192), p.user_tokens(1024)) == (128, 512, 128)
    assert pk.Policy(summary_max_tokens=64).summary_tokens(1024) == 64  # an explicit budget is respected...
    with pytest.raises(ValueError, match="summary_max_tokens"):          # ...and checked against the window
        pk.Policy(summary_max_tokens=900).limits(1024)


@pytest.mark.parametrize("kw", [dict(mode="x"), dict(hard=1.5), dict(hard=0), dict(soft=0.9), dict(keep_recent=0.9),
                                dict(rebase="copy"), dict(window=0), dict(window=1.5), dict(probe_every=0),
                                dict(summary_max_tokens=2), dict(threshold=-0.1), dict(rubric="nope"),
                                dict(mode="fixed", fixed_at=0.05), dict(max_stall_ms=-1), dict(keep_user_tokens=-1),
                                dict(probe_every_tools=0), dict(probe_min_fill=2.0)])
def test_bad_policies_raise_value_error(kw):
    with pytest.raises(ValueError):
        pk.Policy(**kw)


def test_rubrics_load():
    assert set(rubrics.names()) >= {"default", "math", "search", "coding"}
    for n in ("default", "math", "search", "coding"):
        t = rubrics.load(n)
        assert "COMPRESS" in t and "CONTINUE" in t
    assert "boxed" in rubrics.load("math") or "lemma" in rubrics.load("math")
    custom = "Compress when the answer is final. Continue otherwise."
    assert rubrics.load(custom) == custom
    assert pk.Policy(rubric=custom).rubric == custom


@given(free=st.integers(200, 40000), mode=st.sampled_from(P.MODES), smt=st.integers(16, 600),
       probe=st.integers(0, 400), summ=st.integers(0, 600))
@settings(max_examples=200, deadline=None)
def test_resolve_window_is_the_largest_that_fits(free, mode, smt, probe, summ):
    p = pk.Policy(mode=mode, summary_max_tokens=smt)
    need = lambda w: w + P.reserve_cells(p, w, probe_tokens=probe, summarizer_tokens=summ)
    try:
        w = P.resolve_window(p, free, probe_tokens=probe, summarizer_tokens=summ)
    except ValueError:
        assert need(64) > free
        return
    assert need(w) <= free < need(w + 1)
    # an explicit window that fits is accepted as is; one that does not is refused
    assert P.resolve_window(p.with_(window=w), free, probe_tokens=probe, summarizer_tokens=summ) == w
    if mode == "none":  # truncation needs no fork: an explicit window up to the pool is accepted
        assert P.resolve_window(p.with_(window=free), free) == free
        return
    with pytest.raises(ValueError, match="does not fit"):
        P.resolve_window(p.with_(window=w + 1), free, probe_tokens=probe, summarizer_tokens=summ)


def test_none_mode_reserves_only_the_compact_fork():
    # window=None keeps room for a /compact summary fork (issue 7 bug 10); an explicit window may take it all
    w = P.resolve_window(pk.Policy(mode="none"), 4096, summarizer_tokens=300)
    assert w + 300 + pk.Policy().summary_tokens(w) + P.PROBE_SLACK <= 4096
    assert w > P.resolve_window(pk.Policy(), 4096, summarizer_tokens=300)
    assert P.resolve_window(pk.Policy(mode="none", window=4096), 4096) == 4096
    assert P.resolve_window(pk.Policy(), 4096, probe_tokens=200, summarizer_tokens=300) < 3000


def _infos():
    def one(role, n, tc):
        return P.MsgInfo(role, n, tool_call=tc and role == "assistant")
    group = st.builds(lambda k, n, m: [P.MsgInfo("assistant", n, tool_call=True)] + [P.MsgInfo("tool", m)] * k,
                      st.integers(1, 3), st.integers(1, 50), st.integers(1, 300))
    plain = st.builds(lambda r, n: [P.MsgInfo(r, n)], st.sampled_from(["user", "assistant"]), st.integers(1, 200))
    summ = st.builds(lambda n: [P.MsgInfo("user", n, summary=True)], st.integers(1, 100))
    return st.lists(st.one_of(group, plain, summ), min_size=1, max_size=20).map(lambda ls: sum(ls, []))


@given(msgs=_infos(), keep=st.integers(0, 500), min_span=st.integers(1, 300), extra=st.integers(0, 100),
       dangling=st.booleans())
@settings(max_examples=300, deadline=None)
def test_choose_cut_properties(msgs, keep, min_span, extra, dangling):
    msgs = [P.MsgInfo("system", 30)] + msgs
    if dangling:  # an assistant tool call still waiting for its result
        msgs.append(P.MsgInfo("assistant", 20, tool_call=True))
    m = P.choose_cut(msgs, 1, keep, min_span=min_span, extra_tail=extra)
    st_ = P.starts(msgs)
    total = st_[-1] + extra
    allowed = [k for k in range(2, len(msgs) + 1) if P.cut_allowed(msgs, k) and total - st_[k] >= keep]
    if m is None:
        assert not allowed or sum(x.tokens for x in msgs[1:max(allowed)] if not x.summary) < min_span
        return
    assert m == max(allowed)
    assert total - st_[m] >= keep                               # keep_recent stays raw
    assert m == len(msgs) or msgs[m].role != "tool"             # never cut before a tool result
    assert not (m == len(msgs) and msgs[-1].tool_call)         # never cut after an unanswered call
    assert sum(x.tokens for x in msgs[1:m] if not x.summary) >= min_span


@given(msgs=_infos(), need=st.integers(1, 2000))
@settings(max_examples=200, deadline=None)
def test_drop_plan_frees_enough_at_an_allowed_cut(msgs, need):
    msgs = [P.MsgInfo("system", 30)] + msgs
    m = P.drop_plan(msgs, 1, need)
    st_ = P.starts(msgs)
    if m is None:
        assert all(st_[k] - st_[1] < need for k in range(2, len(msgs) + 1) if P.cut_allowed(msgs, k))
        return
    assert P.cut_allowed(msgs, m) and st_[m] - st_[1] >= need


def test_thresholds_and_verdicts():
    p = pk.Policy(mode="rubric", threshold=0.6)
    lim = p.limits(1000)
    assert (lim.hard, lim.soft, lim.fixed, lim.keep_recent, lim.tool_min) == (850, 666, 300, 100, 425)
    assert lim.probe_min == 212  # probe_min_fill x the mode's own trigger: the model may decide early
    assert P.verdict(p, lim, 0.99, 100) == ("CONTINUE", "below_floor")
    assert P.verdict(p, lim, 0.99, 300) == ("COMPRESS", "model")
    assert P.verdict(p, lim, 0.61, 500) == ("COMPRESS", "model")
    assert P.verdict(p, lim, 0.59, 500) == ("CONTINUE", "model")
    assert P.verdict(p, lim, float("nan"), 500)[0] == "CONTINUE"
    assert not P.tool_allowed(p, lim, 424) and P.tool_allowed(p, lim, 425)
    assert P.sync_due(p, lim, 850) and not P.sync_due(p, lim, 849)
    assert P.sync_due(pk.Policy(mode="fixed"), lim, 300)
    assert P.sync_due(pk.Policy(mode="none"), lim, 1001) and not P.sync_due(pk.Policy(mode="none"), lim, 1000)
    assert P.probe_due(p, generated_since_probe=256) and not P.probe_due(p, generated_since_probe=255)
    assert P.probe_due(p, after_tool_result=True)
    assert not P.probe_due(pk.Policy(mode="hard"), after_tool_result=True)
    assert P.preparation_due(pk.Policy(), pk.Policy().limits(1000), 666)
    assert P.probe_due(p.with_(probe_every_tools=3), tool_results_since_probe=3)
    assert not P.probe_due(p.with_(probe_every_tools=3), tool_results_since_probe=2)


def test_thresholds_are_fractions_of_each_modes_own_trigger():
    """Issue 7 bug 7: the tool minimum and the probe floor used ``x hard`` in every mode."""
    fixed = pk.Policy(mode="fixed").limits(1000)
    assert fixed.trigger == 300 and fixed.tool_min == 150          # the tool can compact below fixed_at
    assert P.tool_allowed(pk.Policy(mode="fixed"), fixed, 200)
    rub = pk.Policy(mode="rubric").limits(1000)
    assert rub.probe_min < 425                                      # the model may decide before 42.5%
    assert not P.tool_allowed(pk.Policy(mode="none"), pk.Policy(mode="none").limits(1000), 999)
    for mode in P.MODES:
        lim = pk.Policy(mode=mode).limits(1000)
        assert lim.tool_min <= lim.trigger and lim.probe_min <= lim.trigger


def test_restart_rule():
    p = pk.Policy(window=1000, summary_max_tokens=100)
    assert P.needs_restart(p, 1000, summary_tokens=100, tail_tokens=100, prefix_tokens=50) == ""
    assert P.needs_restart(p, 1000, summary_tokens=100, tail_tokens=420, prefix_tokens=50) == ""  # soft..hard: keep
    assert P.needs_restart(p, 1000, summary_tokens=100, tail_tokens=400, prefix_tokens=300) == "tail_outgrew_hard"
    assert P.needs_restart(p.with_(soft=0.84, hard=0.99, early_start=0.0), 1000, summary_tokens=100, tail_tokens=500) == "tail_outgrew_budget"
    assert P.needs_restart(p.with_(mode="hard"), 1000, summary_tokens=100, tail_tokens=5000) == ""
