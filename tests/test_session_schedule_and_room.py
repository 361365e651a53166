"""The preparation schedule and the room for large calls (on FakeEngine): each test says what should happen."""
from __future__ import annotations

import pykvcompact as pk
from fake_engine import FakeEngine
from test_session_logic import check_invariants


def words(n, tag):
    return " ".join(f"{tag}{k}" for k in range(n))


def test_one_large_call_does_not_restart_the_preparation_on_every_call(tmp_path):
    """443d81c sizes the room a prepared swap must leave by the largest call of the last 16
    (``peak_turn_tokens``).  One early call of 330 tokens in a window of 512 (then 64-token calls) makes
    ``_restart_if_needed`` find "tail_outgrew_window" after *every* new message for 16 calls: the
    preparation is cancelled and restarted at the newest cut twice per call (19 restarts), so no summary
    that takes a few engine steps (bg_polls=3) is ever ready before the edge and every swap is an
    unprepared, synchronous one (0 of 3 prepared).  With the 4-call memory of the previous commit the same
    run has 3 restarts and 5 of 6 swaps prepared.

    Should: a restart that cannot itself be ready before the edge (or a second restart before the first
    one's summary is in) is not worth throwing the running preparation away; at most about one restart
    per swap, and most swaps prepared."""
    eng = FakeEngine(n_ctx=16384, bg_polls=3)
    s = pk.Session(eng, system="You are a test. " + words(20, "sys"), history_dir=tmp_path,
                   policy=pk.Policy(mode="background", window=512, summary_max_tokens=24, keep_user_tokens=64,
                                    compact_tool=False, history_tool=False))
    for i, n in enumerate([153] + [20] * 16):
        s.chat(f"u{i} " + words(n, f"c{i}_"), max_tokens=32)
        check_invariants(s)
        assert len(s.tokens) <= s.window
    reb = [e for e in s.events if isinstance(e, pk.events.Rebased)]
    restarts = [e for e in s.events if isinstance(e, pk.events.PreparationRestarted)]
    assert len(restarts) <= len(reb) + 1, (len(restarts), len(reb))
    assert sum(e.prepared for e in reb) * 2 >= len(reb), [(e.tokens_before, e.prepared) for e in reb]
    s.close()


def test_a_no_gain_skip_does_not_stop_the_schedule_for_the_rest_of_the_session(tmp_path):
    """A summary that gains nothing sets ``Compactor.no_gain_until = len(ctx) + min_span`` (an absolute
    token count) and nothing ever resets it.  Here it is set at 950 live tokens (window 1024: 1014, above
    the window edge): after the swap that follows, the context is back to ~220 tokens but ``start()``
    refuses every scheduled start (soft / next_turns / schedule) while ``len(ctx) < 1014``, i.e. forever.
    Every later preparation is started only at ``hard`` by ``make_room`` (reason "hard"), too late to be
    ready (with bg_polls=4 the first three swaps after it are unprepared).

    Should: the no-gain memory is about one history; a swap (any change of the history before the mark)
    clears it, and the schedule starts preparations at ``soft`` at the latest again."""
    eng = FakeEngine(n_ctx=8192, bg_polls=4)
    s = pk.Session(eng, system="You are a test. " + words(20, "sys"), history_dir=tmp_path,
                   policy=pk.Policy(mode="background", window=1024, summary_max_tokens=24, keep_user_tokens=0,
                                    compact_tool=False, history_tool=False))
    for i, n in enumerate([40, 40, 340] + [40] * 30):
        s.chat(f"u{i} " + words(n, f"c{i}_"), max_tokens=8)
        check_invariants(s)
    names = [e.name for e in s.events]
    assert "compaction_skipped" in names  # the no-gain skip happened (call 3)
    first_swap = names.index("rebased")
    later = [e.reason for e in s.events[first_swap:] if isinstance(e, pk.events.SummaryStarted)]
    assert any(r in ("soft", "schedule", "next_turns") for r in later), later
    s.close()


def test_a_no_gain_skip_does_not_raise_the_hard_limit_for_the_rest_of_the_session(tmp_path):
    """Mode ``hard``: a no-gain skip at 851 live tokens (the first user message, kept verbatim, makes its
    summary as large as what it replaces) sets ``no_gain_until`` to ~915; ``room_ok`` then answers "room"
    below it for the rest of the session, even after later swaps replaced that history: a call ends
    above ``hard`` (~900 tokens, hard is 870) and every later compaction runs at 940-996 tokens instead
    of before crossing ``hard`` (in the same run without the skip they run at 788-848).

    Should: after a swap the skip is forgotten; in mode ``hard`` the context stays below ``hard``
    (compaction runs before the step that would cross it), as it does in the same run without the skip."""
    eng = FakeEngine(n_ctx=8192)
    s = pk.Session(eng, system="You are a test. " + words(20, "sys"), history_dir=tmp_path,
                   policy=pk.Policy(mode="hard", window=1024, summary_max_tokens=24, keep_user_tokens=0,
                                    compact_tool=False, history_tool=False))
    over = []
    for i, n in enumerate([150, 230, 20] + [40] * 12):
        s.chat(f"u{i} " + words(n, f"c{i}_"), max_tokens=8)
        check_invariants(s)
        if any(e.name == "rebased" for e in s.events) and len(s.tokens) >= s.limits.hard:
            over.append((i, len(s.tokens)))
    assert not over, (s.limits.hard, over)
    s.close()


def test_a_tool_result_is_live_when_the_model_answers_it(tmp_path):
    """The issue's scenario (window 1024, a tool result of ~180 tokens per call, background mode), summary
    steps taking a few engine steps (bg_polls=6).  At call 12 a caught-up preparation (mark 5; committing
    it would leave the new tool result raw, ~800 tokens) is thrown away at the turn end right after the
    tool result is appended: ``_restart_if_needed`` finds "tail_outgrew_window" and restarts with
    ``keep_recent=0`` at the newest cut, *after the tool result*; the reply's ``make_room`` is at ``hard``,
    so that preparation is committed (unprepared, after an edge wait) before the reply is generated.  The
    model then answers a tool result it never saw: it is only in the summary (and the history file).
    Calls 12, 17, 22 and 27 of 30 are answered that way.

    Should: the messages of the current call (what the reply is about to answer) stay raw until the
    reply is written; a restart / a turn-end start may cut before them, never after them."""
    eng = FakeEngine(n_ctx=8192, bg_polls=6)
    s = pk.Session(eng, system="You are a test. " + words(40, "sys"), history_dir=tmp_path,
                   policy=pk.Policy(mode="background", window=1024, compact_tool=False, history_tool=False))
    s.chat("Please read the files and fix the bug.", max_tokens=16)
    unseen = []
    for i in range(14):
        cid = f"call_{i}"
        res = f"RESULT{i}: " + words(90, f"r{i}_")
        msgs = [{"role": "assistant", "content": None,
                 "tool_calls": [{"id": cid, "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": cid, "content": res}]
        seen = False
        for x in s.stream(msgs, max_tokens=16):
            if isinstance(x, str) and not seen:  # the reply begins: what does the model see?
                seen = True
                if not any(m["role"] == "tool" and m["content"] == res for m in s.messages):
                    unseen.append(i)
        check_invariants(s)
    assert not unseen, unseen
    s.close()


def test_the_first_user_message_is_not_dropped_by_a_summarizing_mode(tmp_path):
    """Window 512: the task (first user message, ~150 tokens) then a 300-token message.  To make room the
    session summarizes the first call, but the first user message is kept verbatim in a summary (the
    "must" budget), so the summary gains nothing (``compaction_skipped: no_gain``); the session then
    *drops* the first user message — the task — from the live context (``Dropped(reason="no_cut_point")``,
    though a cut point existed) and keeps the assistant reply to it: the live context is
    [system, assistant, user, assistant], with no summary.  Same in hard, rubric, tool and background.

    Should: summarizing modes do not drop turns while a cut point exists (the issue's contract): when the
    kept messages make a summary gain nothing, summarize them (overflow: the summarizer is told to keep
    their constraints) rather than drop them; and a drop never says "no_cut_point" when a cut existed."""
    for mode in ("hard", "background"):
        eng = FakeEngine(n_ctx=8192)
        s = pk.Session(eng, system="You are a test. " + words(20, "sys"), history_dir=tmp_path,
                       policy=pk.Policy(mode=mode, window=512, summary_max_tokens=16, compact_tool=False, history_tool=False))
        s.chat("TASK: " + words(73, "t"), max_tokens=32)
        s.chat("DATA: " + words(150, "d"), max_tokens=32)
        check_invariants(s)
        dropped = [e for e in s.events if isinstance(e, pk.events.Dropped)]
        assert not dropped, (mode, dropped, [m["role"] for m in s.messages])
        assert any(m.get("summary") or "TASK" in (m["content"] or "") for m in s.messages), mode
        s.close()
