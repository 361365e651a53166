"""The pure scheduler (no engine): property tests of when a background preparation starts, and what
happens at the window edge (commit, keep going in the headroom, wait at most max_stall_ms, fall back)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

import pykvcompact as pk
from pykvcompact.compaction import scheduler as S

rates = st.builds(S.Rates,
                  growth_tok_s=st.one_of(st.none(), st.floats(1, 5000)),
                  turn_tokens=st.integers(0, 600),
                  summary_tok_s=st.one_of(st.none(), st.floats(0.5, 500)),
                  prefill_tok_s=st.one_of(st.none(), st.floats(5, 5000)))
windows = st.integers(512, 16384)


def policy(window, **kw):
    return pk.Policy(mode="background", window=window, **kw)


@given(window=windows, frac=st.floats(0, 1.2), r=rates, prefill=st.integers(0, 2000))
@settings(max_examples=400, deadline=None)
def test_preparation_starts_by_soft_and_never_before_earliest(window, frac, r, prefill):
    p = policy(window)
    lim = p.limits(window)
    n = int(frac * window)
    why = S.start_reason(p, lim, S.State(tokens=n, tokens_after=n, prefill_left=prefill), r)
    if n >= lim.soft:
        assert why == "soft"                      # never later than soft
    elif n < lim.earliest:
        assert why == ""                          # never earlier than soft - early_start
    # a preparation already running is never started twice
    assert S.start_reason(p, lim, S.State(tokens=n, tokens_after=n, prep="summarizing"), r) == ""


@given(window=windows, r=rates, a=st.floats(0, 1), b=st.floats(0, 1))
@settings(max_examples=300, deadline=None)
def test_start_is_monotonic_in_fill(window, r, a, b):
    """Once the schedule says start at some fill, it says start at every higher fill (same rates)."""
    p = policy(window)
    lim = p.limits(window)
    lo, hi = sorted((int(a * window), int(b * window)))
    if S.start_reason(p, lim, S.State(lo, lo), r):
        assert S.start_reason(p, lim, S.State(hi, hi), r)


@given(window=windows, n_frac=st.floats(0.4, 0.84), growth=st.floats(1, 500), summ=st.floats(1, 200),
       prefill=st.floats(10, 2000))
@settings(max_examples=300, deadline=None)
def test_starts_when_time_to_hard_is_no_longer_than_preparation(window, n_frac, growth, summ, prefill):
    p = policy(window)
    lim = p.limits(window)
    n = int(n_frac * window)
    r = S.Rates(growth_tok_s=growth, turn_tokens=0, summary_tok_s=summ, prefill_tok_s=prefill)
    st_ = S.State(n, n, summary_left=lim.summary, prefill_left=lim.summary + lim.keep_recent)
    need = S.predicted_prep_s(r, lim.summary, st_.prefill_left)
    left = S.time_to_hard_s(lim, n, r)
    why = S.start_reason(p, lim, st_, r)
    if lim.earliest <= n < lim.soft:
        assert bool(why) == (left <= need)


@given(window=windows, after_frac=st.floats(0, 1.2), prep=st.sampled_from(S.PREP_STATES),
       waited=st.floats(0, 2000), stall=st.floats(0, 1000), headroom=st.booleans())
@settings(max_examples=500, deadline=None)
def test_edge_never_waits_past_max_stall_and_never_overflows(window, after_frac, prep, waited, stall, headroom):
    p = policy(window, max_stall_ms=stall)
    lim = p.limits(window)
    after = int(after_frac * window)
    margin = 24
    a = S.edge_action(p, lim, S.State(tokens=min(after, window), tokens_after=after, prep=prep,
                                      waited_ms=waited, headroom_ok=headroom), margin)
    assert a.kind in S.ACTIONS
    if after < lim.hard:
        assert a.kind == "none"                   # nothing happens below hard
        return
    if a.kind == "wait":
        assert waited < stall and prep in ("summarizing", "ready")
    if a.kind == "fallback":
        assert waited >= stall                    # the fallback only after max_stall_ms
    if a.kind == "commit":
        assert prep == "caught_up"                # a commit at hard is of a caught-up preparation
    if a.kind == "none":                          # keep going above hard: only inside the headroom
        assert after <= window - margin and headroom and prep in ("summarizing", "ready")
    if prep == "caught_up":
        assert a.kind == "commit"
    if prep == "none":
        assert a.kind == "compact_now"


@given(window=windows, after_frac=st.floats(0, 1.2), prep=st.sampled_from(S.PREP_STATES), r=rates)
@settings(max_examples=300, deadline=None)
def test_decide_in_synchronous_modes_is_the_trigger(window, after_frac, prep, r):
    for mode in ("fixed", "hard", "rubric", "tool"):
        p = pk.Policy(mode=mode, window=window)
        lim = p.limits(window)
        after = int(after_frac * window)
        a = S.decide(p, lim, S.State(after, after, prep=prep), r)
        assert a.kind == ("compact_now" if after >= lim.trigger else "none")


def test_rate_meter_recent_turns():
    m = S.RateMeter()
    assert m.rates() == S.Rates(None, 0, None, None)
    for k in range(6):
        m.turn(100 + k, 1.0)
    m.summary(64, 2.0)
    m.prefill(300, 1.5)
    r = m.rates()
    assert r.turn_tokens == 105 and 100 <= r.growth_tok_s <= 105
    assert r.summary_tok_s == 32 and r.prefill_tok_s == 200


def test_rate_meter_peak_remembers_a_large_turn_longer_than_the_pace():
    """A file read every few tasks: the pace forgets it after 4 turns, the room a swap leaves must not."""
    m = S.RateMeter(turns=4, peak_turns=16)
    m.turn(250, 1.0)
    for _ in range(8):
        m.turn(60, 1.0)
    r = m.rates()
    assert r.turn_tokens == 60 and r.peak_turn_tokens == 250
    for _ in range(8):
        m.turn(60, 1.0)
    assert m.rates().peak_turn_tokens == 60


def test_rate_meter_growth_is_tokens_over_time_not_a_mean_of_rates():
    """An agent adds a tool result (250 tokens in 1 s) then asks for a reply (24 tokens in 3 s): it grows
    274 tokens in 4 s, not at the mean of 250 and 8 tokens a second (issue 8: the eval's add + chat)."""
    m = S.RateMeter(turns=4)
    for _ in range(3):
        m.turn(250, 1.0)
        m.turn(24, 3.0)
    assert m.rates().growth_tok_s == pytest.approx(274 / 4.0)


def test_a_preparation_without_a_model_summary_is_predicted_by_its_prefill_alone():
    r = S.Rates(growth_tok_s=100.0, summary_tok_s=None, prefill_tok_s=50.0)
    assert S.predicted_prep_s(r, 0, 500) == 10.0
    assert S.predicted_prep_s(r, 64, 500) is None   # the writing pace is unknown
