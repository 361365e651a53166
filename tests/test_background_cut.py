"""Where a background preparation cuts the history (fake engine): ``keep_recent`` is the raw tail the swap
leaves, so a preparation the schedule starts below ``hard`` counts what arrives before ``hard`` toward
it, and a COMPRESS verdict cuts after the message that closed the sub-task."""
from __future__ import annotations

from test_session_logic import check_invariants, make, user_msg


def _started(s):
    return [e for e in s.events if e.name == "summary_started"]


def _add_until_started(s) -> int:
    """Add user messages until a preparation starts; the number added."""
    i = 0
    while not _started(s):
        s.add([{"role": "user", "content": user_msg(i)}])
        i += 1
    return i


def test_a_preparation_started_well_below_hard_cuts_after_the_last_message(tmp_path):
    eng, s = make("background", tmp_path=tmp_path, window=1000, keep_recent=0.1, soft=0.5, hard=0.85,
                  early_start=0.0, probe_fn=lambda t: 0.0)
    i = _add_until_started(s)
    st, n = _started(s)[0], len(s.tokens)
    assert st.reason in ("soft", "next_turns", "schedule")
    assert s.limits.hard - n >= s.limits.keep_recent   # what arrives before hard covers keep_recent...
    assert st.mark_tokens == n                          # ...so nothing was left raw at the start
    while not [e for e in s.events if e.name == "rebased"]:
        s.add([{"role": "user", "content": user_msg(i)}])
        i += 1
    reb = [e for e in s.events if e.name == "rebased"][0]
    # the swap came at hard: what arrived since the cut is the raw tail, at least keep_recent of it
    assert reb.trigger == "hard" and reb.tokens_before - st.mark_tokens >= s.limits.keep_recent
    check_invariants(s)


def test_a_preparation_started_near_hard_keeps_what_is_missing_of_keep_recent(tmp_path):
    # soft just below hard: the start leaves raw what the tokens until hard do not cover
    eng, s = make("background", tmp_path=tmp_path, window=1000, keep_recent=0.2, soft=0.8, hard=0.85,
                  early_start=0.0, probe_fn=lambda t: 0.0)
    _add_until_started(s)
    st, n = _started(s)[0], len(s.tokens)
    missing = s.limits.keep_recent - max(0, s.limits.hard - n)
    assert missing > 0
    assert n - st.mark_tokens >= missing                # at least that much stays raw...
    assert st.mark_tokens > 0 and n - st.mark_tokens < s.limits.keep_recent + 60  # ...about one message more
    check_invariants(s)


def test_a_compress_verdict_summarizes_the_finished_sub_task_whole(tmp_path):
    # the probe says COMPRESS after every tool result; the cut follows the message it judged
    eng, s = make("background", tmp_path=tmp_path, window=1000, keep_recent=0.2, probe_fn=lambda t: 0.95,
                  threshold=0.5, probe_min_fill=0.0)
    i = 0
    while not _started(s):
        s.chat(user_msg(i), max_tokens=16)
        i += 1
    st = _started(s)[0]
    assert st.reason == "compress"
    before = s.events[:s.events.index(st)]
    probe = [e for e in before if e.name == "probe"][-1]
    assert probe.verdict == "COMPRESS"
    n_at = round(probe.fill * s.window)
    # keep_recent (200) would have left the last messages raw; the cut is after the last whole message,
    # before the reply being written (a probe runs every 32 generated tokens)
    assert 0 <= n_at - st.mark_tokens <= 48, (n_at, st.mark_tokens)
    for k in range(6):
        s.chat(user_msg(100 + k), max_tokens=16)
    assert any(e.name == "rebased" and e.trigger == "compress" for e in s.events)
    check_invariants(s)


def _raw_after_summary(s):
    msgs = s.messages
    idx = max([i for i, m in enumerate(msgs) if m.get("summary")], default=0)
    return msgs[idx + 1:]


def test_a_cut_over_an_unanswered_tool_result_waits_for_the_reply(tmp_path):
    # the agent adds a call and its result; the probe says COMPRESS at once: the cut follows the result,
    # but the swap waits until the model has written its reply to it
    eng, s = make("background", tmp_path=tmp_path, window=1000, keep_recent=0.2, probe_fn=lambda t: 0.0,
                  threshold=0.5, probe_min_fill=0.0)
    for i in range(8):
        s.add([{"role": "user", "content": user_msg(i)}])
    eng.probe_fn = lambda t: 0.95
    call = {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}
    s.add([{"role": "assistant", "content": None, "tool_calls": [call]},
           {"role": "tool", "tool_call_id": "c1", "name": "run", "content": "RESULT_MARKER " + "o " * 40}])
    assert _started(s)[-1].reason == "compress"
    assert not [e for e in s.events if e.name == "rebased"] and "RESULT_MARKER" in s.render()
    s.chat("what did it say?", max_tokens=8)
    s.chat("go on", max_tokens=8)
    reb = [e for e in s.events if e.name == "rebased"]
    assert reb and reb[0].trigger == "compress"
    check_invariants(s)


def test_compact_after_a_scheduled_start_still_keeps_keep_recent_raw(tmp_path):
    # a preparation the schedule started cut after the last message; /compact now must not reuse that cut
    eng, s = make("background", tmp_path=tmp_path, window=1000, keep_recent=0.2, soft=0.5, hard=0.85,
                  early_start=0.0, probe_fn=lambda t: 0.0)
    _add_until_started(s)
    assert _started(s)[0].mark_tokens == len(s.tokens)
    e = s.compact()
    assert e is not None and e.trigger == "manual"
    assert any(x.name == "preparation_restarted" and x.reason == "keep_recent" for x in s.events)
    raw = sum(len(s.engine.tokenize(m["content"])) for m in _raw_after_summary(s))
    assert raw >= s.limits.keep_recent * 0.8, raw   # (message tokens only: the template adds a few more)
    check_invariants(s)


def test_an_agent_that_only_adds_messages_still_swaps_at_hard(tmp_path):
    # no reply is ever asked for: the guard waits only on tool results and replies being written
    eng, s = make("background", tmp_path=tmp_path, window=1000, keep_recent=0.2, probe_fn=lambda t: 0.0)
    for i in range(60):
        s.add([{"role": "user", "content": user_msg(i)}])
        assert len(s.tokens) <= s.window
    reb = [e for e in s.events if e.name == "rebased"]
    assert len(reb) >= 3 and all(e.tokens_before < s.limits.hard + 60 for e in reb), [e.tokens_before for e in reb]
    check_invariants(s)
