"""bench/eval/reach.py: the answer-in-context check replays an episode through a real Session (SmolLM2's
tokenizer and template, no decoding) and finds what the recall puts back — and it can fail."""
from __future__ import annotations

import pytest

from bench.eval import reach
from bench.eval.families import FAMILIES
from bench.eval.policies import standard
from bench.eval.sizing import fit


@pytest.fixture(scope="module")
def episode(smollm_engine):
    s = standard()
    return fit(FAMILIES["support"], 1000, s.window, smollm_engine.tokenize, ratio=s.ratio,
               shape=(s.sub_goals, s.steps))


def test_the_whole_history_in_context_reaches_every_answer(smollm_engine, episode):
    got, cost = reach.replay(smollm_engine, episode, "full", standard())
    assert cost["recalls"] == 0 and cost["steps"] == len(episode.steps)   # nothing offloaded: nothing recalled
    assert [q["place"] for q in got] == [q.place for q in episode.questions]
    assert all(q["reached"] for q in got)


def test_the_recall_reaches_mid_output_facts_and_without_it_they_are_lost(smollm_engine, episode, monkeypatch):
    with_recall, cost = reach.replay(smollm_engine, episode, "hard", standard())
    assert 1 <= cost["recalls"] and cost["recalled_tokens"] > 0
    middle = [q["reached"] for q in with_recall if q["place"] in ("middle", "json")]
    assert any(middle)
    # the same episode with the recall off (a budget of 0): the facts only in the middle of an output are
    # not in the context when asked (the summary lists a long output's last line only)
    import pykvcompact.session.session as session_module
    monkeypatch.setattr(session_module, "default_recall_budget", lambda window: 0)
    without, cost = reach.replay(smollm_engine, episode, "hard", standard())
    assert cost["recalls"] == 0
    assert not any(q["reached"] for q in without if q["place"] in ("middle", "json"))
    assert sum(q["reached"] for q in without) < sum(q["reached"] for q in with_recall)


def test_the_table_and_the_seeds():
    rows = [{"family": "support", "seed": 1, "policy": "hard", "recalls": 4, "recalled_tokens": 300,
             "questions": [{"place": "middle", "reached": True}, {"place": "middle", "reached": False},
                           {"place": "user", "reached": True}]}]
    tab = reach.table(rows)
    assert tab["hard"]["middle"] == [1, 2] and tab["hard"]["all"] == [2, 3]
    md = reach.markdown(tab, ["support", "coding"])
    assert tab["hard"]["_cost"] == [4, 300, 1]
    assert "tuned on: coding" in md and "| policy | middle | user | all | recalls (tokens) per episode |" in md
    assert "| hard | 1/2 | 1/1 | 2/3 | 4.0 (300) |" in md
    assert reach.seeds_of("1000-1002,7") == [1000, 1001, 1002, 7]


def test_a_reply_prompt_that_is_missing_is_an_error():
    with pytest.raises(RuntimeError, match="no reply prompt"):
        reach.reply_prompt(["a summary request"], "What is X?")
