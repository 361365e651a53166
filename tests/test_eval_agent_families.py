"""The agent families (bench/eval/agent_families.py), pure Python: each episode is deterministic, every asked
value sits in exactly one message and that message is of the kind its place says, outputs grow with
``Size.rows`` and stay within their line budget, and none of the older families' wording leaks in."""
import json
import re
from functools import lru_cache

import pytest

from bench.eval.agent_families import AGENT_FAMILIES
from bench.eval.episode import PLACES, Episode, Size
from bench.eval.families import ASK, SYSTEM

SEEDS = range(1, 6)
SIZES = [(5, 6, 3), (5, 6, 12), (3, 5, 4)]
CASES = [(f, seed, size) for f in AGENT_FAMILIES for seed in SEEDS for size in SIZES]
OLD_WORDING = ("Settled total", "verified launch code", "All tests passed. Final")


@lru_cache(maxsize=None)
def episode(family: str, seed: int, size: tuple) -> Episode:
    return AGENT_FAMILIES[family](seed, Size(*size))


def messages(ep: Episode):
    """Every message of the episode as (step, kind, text); the first user message is step -1, kind "task"."""
    out = [(-1, "task", ep.task)]
    for i, s in enumerate(ep.steps):
        out += [(i, kind, text) for kind, text in (("user", s.user), ("output", s.output), ("say", s.say)) if text]
    return out


def inside_json(text: str, value: str) -> bool:
    """The value is part of a JSON document: the whole text, or one that starts on a line at or above it."""
    try:
        json.loads(text)
        return True
    except ValueError:
        pass
    at = text.lower().find(value.lower())
    decoder = json.JSONDecoder()
    for start in [i for i in range(at + 1) if text[i] in "[{" and (i == 0 or text[i - 1] == "\n")]:
        try:
            _, end = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if start <= at < end:
            return True
    return False


def placement_problems(ep: Episode) -> list:
    """Why the asked values are not where their places say (empty when all is well)."""
    bad, msgs = [], messages(ep)
    last_goal = ep.steps[-1].subgoal
    for q in ep.questions:
        a = q.answer.lower()
        if a in q.prompt.lower():
            bad.append(f"{q.answer!r} is in its own prompt")
        hits = [(i, kind, text) for i, kind, text in msgs if a in text.lower()]
        if len(hits) != 1:
            bad.append(f"{q.answer!r} ({q.place}) is in {len(hits)} messages: {[(i, k) for i, k, _ in hits]}")
            continue
        i, kind, text = hits[0]
        if q.place == "assistant" and kind != "say":
            bad.append(f"{q.answer!r}: assistant place but found in a {kind}")
        if q.place == "user" and (kind != "user" or i < 0):
            bad.append(f"{q.answer!r}: user place but found in a {kind} (step {i})")
        if q.place == "json" and (kind != "output" or not inside_json(text, q.answer)):
            bad.append(f"{q.answer!r}: json place but not inside a JSON output")
        if q.place == "middle":
            lines = text.split("\n")
            line = next(k for k, t in enumerate(lines) if a in t.lower())
            if kind != "output" or len(lines) < 15 or not 0.25 <= line / len(lines) <= 0.75:
                bad.append(f"{q.answer!r}: middle place but line {line} of {len(lines)} of a {kind}")
        if q.place == "recent" and (i < 0 or ep.steps[i].subgoal != last_goal):
            bad.append(f"{q.answer!r}: recent place but in step {i}, not in the last sub-goal")
        if q.place != "recent" and i >= 0.7 * len(ep.steps):
            bad.append(f"{q.answer!r}: an early fact in step {i} of {len(ep.steps)}")
        facts = [f for f in ep.facts if f.text == q.answer]
        if len(facts) != 1 or (facts[0].step, facts[0].source) != (i, "output" if kind == "task" else kind) or \
                q.answer not in (ep.source_text(facts[0]) or ""):
            bad.append(f"{q.answer!r}: no Fact pointing at its message")
    return bad


def words(ep: Episode) -> int:
    return sum(len(text.split()) for _, _, text in messages(ep))


@pytest.mark.parametrize("family,seed,size", CASES)
def test_deterministic_from_the_seed(family, seed, size):
    a, b = AGENT_FAMILIES[family](seed, Size(*size)), AGENT_FAMILIES[family](seed, Size(*size))
    assert a.to_dict() == b.to_dict()
    assert a.to_dict() != AGENT_FAMILIES[family](seed + 100, Size(*size)).to_dict()
    assert a.family == family and a.seed == seed and a.system == SYSTEM


@pytest.mark.parametrize("family,seed,size", CASES)
def test_questions_cover_every_place(family, seed, size):
    ep = episode(family, seed, size)
    places = [q.place for q in ep.questions]
    assert set(places) <= set(PLACES)
    assert {"assistant", "middle", "json", "user", "recent"} <= set(places)
    assert 5 <= len(ep.questions) <= 6 and places.count("recent") == 1
    assert all(q.early == (q.place != "recent") for q in ep.questions)
    assert all(q.prompt.endswith(ASK) for q in ep.questions)
    assert len({q.answer.lower() for q in ep.questions}) == len(ep.questions)
    # distinctive, and matchable as written: "407" in a reply would not match an answer of "407.0"
    assert all(len(q.answer) >= 4 and not re.fullmatch(r"[\d,]*\.\d*0", q.answer) for q in ep.questions)


@pytest.mark.parametrize("family,seed,size", CASES)
def test_each_answer_lives_in_one_message_of_its_place(family, seed, size):
    assert placement_problems(episode(family, seed, size)) == []


@pytest.mark.parametrize("family", AGENT_FAMILIES)
def test_the_placement_check_catches_a_leak(family):
    """The check above is not vacuous: restating an asked value elsewhere, or moving it, is caught."""
    for q in episode(family, 1, (5, 6, 8)).questions:
        ep = Episode.from_dict(episode(family, 1, (5, 6, 8)).to_dict())
        ep.steps[-1].say = f"For the record: {q.answer}."
        assert any(repr(q.answer) in p for p in placement_problems(ep)), q.place
    ep = Episode.from_dict(episode(family, 1, (5, 6, 8)).to_dict())
    q = next(q for q in ep.questions if q.place == "middle")
    f = next(f for f in ep.facts if f.text == q.answer)
    lines = ep.steps[f.step].output.split("\n")
    at = next(k for k, t in enumerate(lines) if q.answer in t)
    ep.steps[f.step].output = "\n".join(lines[:at] + lines[at + 1:] + [lines[at]])    # the value moved to the end
    assert any("middle place" in p for p in placement_problems(ep))


@pytest.mark.parametrize("family,seed", [(f, s) for f in AGENT_FAMILIES for s in SEEDS])
def test_history_grows_with_rows(family, seed):
    small, large = episode(family, seed, (5, 6, 3)), episode(family, seed, (5, 6, 12))
    assert words(large) >= 2.5 * words(small)
    assert len(small.steps) == len(large.steps)


@pytest.mark.parametrize("family,seed,size", CASES + [(f, 1, (5, 6, r)) for f in AGENT_FAMILIES for r in (2, 8, 30)])
def test_no_output_over_its_line_budget(family, seed, size):
    ep = episode(family, seed, size)
    rows = size[2]
    assert max(len(s.output.split("\n")) for s in ep.steps) <= 4 * rows + 10


@pytest.mark.parametrize("family,seed,size", CASES)
def test_sub_goals_steps_and_statements(family, seed, size):
    ep = episode(family, seed, size)
    goals, per = size[0], size[1]
    assert abs(len(ep.steps) - goals * per) <= 0.2 * goals * per
    assert [s.subgoal for s in ep.steps] == sorted(s.subgoal for s in ep.steps)
    assert sorted({s.subgoal for s in ep.steps}) == list(range(goals))
    for i, s in enumerate(ep.steps):
        first = i == 0 or ep.steps[i - 1].subgoal != s.subgoal
        last = i == len(ep.steps) - 1 or ep.steps[i + 1].subgoal != s.subgoal
        assert (s.opens, s.closes) == (first, last), i
        if first:
            assert s.user, f"sub-goal {s.subgoal} opens without a user request"
    assert ep.boundaries() == goals
    says = sum(bool(s.say) for s in ep.steps)
    assert 0.2 * len(ep.steps) <= says <= 0.5 * len(ep.steps)
    assert ep.task and ep.task not in [s.user for s in ep.steps]


@pytest.mark.parametrize("family,seed,size", CASES)
def test_tool_calls_are_distinct_and_declared(family, seed, size):
    """The environment answers a model's own call by its arguments: two steps must not share them."""
    ep = episode(family, seed, size)
    calls = [(s.tool, json.dumps(s.args, sort_keys=True)) for s in ep.steps]
    assert len(set(calls)) == len(calls)
    declared = {t["function"]["name"]: t["function"]["parameters"]["properties"] for t in ep.tools}
    assert 2 <= len(declared) <= 3
    assert all(s.tool in declared and set(s.args) == set(declared[s.tool]) for s in ep.steps)


@pytest.mark.parametrize("family,seed,size", CASES)
def test_none_of_the_older_wording(family, seed, size):
    text = "\n".join(t for _, _, t in messages(episode(family, seed, size))).lower()
    assert not [w for w in OLD_WORDING if w.lower() in text]


@pytest.mark.parametrize("family,seed,size", CASES)
def test_round_trip_through_a_dict(family, seed, size):
    ep = episode(family, seed, size)
    again = Episode.from_dict(json.loads(json.dumps(ep.to_dict())))
    assert again == ep and again.to_dict() == ep.to_dict()
