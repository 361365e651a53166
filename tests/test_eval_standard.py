"""bench.eval --standard: the run that fits this machine, resumable, reported per place and on the families
nothing was tuned on (no model: the engine and the episodes are stubbed where a model would run)."""
import json
import types

import pytest

from bench.eval import __main__ as cli
from bench.eval import metrics, report
from bench.eval.families import FAMILIES, HELD_OUT_FAMILIES, TUNED_ON
from bench.eval.policies import STANDARD_POLICIES, standard


def test_standard_runs_every_family_at_two_seeds_under_four_policies():
    args = cli.parse(["--standard"])
    assert args.policies == list(STANDARD_POLICIES) and args.episodes == 2 and args.resume
    assert args.families == list(FAMILIES) and set(HELD_OUT_FAMILIES) <= set(args.families)
    # at least four agent families, at most two of them tuned on, the rest held out
    from bench.eval.agent_families import AGENT_FAMILIES
    assert len(AGENT_FAMILIES) >= 4 and len(set(TUNED_ON) & set(AGENT_FAMILIES)) <= 2
    assert set(TUNED_ON).isdisjoint(HELD_OUT_FAMILIES) and set(HELD_OUT_FAMILIES) | set(TUNED_ON) >= set(FAMILIES)
    # what the user names still counts
    args = cli.parse(["--standard", "--episodes=3", "--policies", "full,background"])
    assert args.episodes == 3 and args.policies == ["full", "background"]
    with pytest.raises(SystemExit):   # an abbreviation would be taken for the option and then overridden
        cli.parse(["--standard", "--pol", "full"])
    with pytest.raises(SystemExit):
        cli.parse(["--standard", "--quick"])


def _episode(family, seed, policy, correct=True, place="middle"):
    return {"family": family, "seed": seed, "policy": policy, "wall_s": 1.0, "answers": [
        {"prompt": "q", "answer": "42", "reply": "42" if correct else "7", "early": True, "place": place,
         "correct": correct}], "tokens": {k: 1 for k in ("prefill", "decode", "probe", "background", "total")},
        "compactions": [], "probes": [], "summaries": [], "stalls_ms": [], "timeline": [], "events": [],
        "boundaries": 1, "notes": []}


def _previous_run(path, settings, episodes, model="qwen2.5-coder-1.5b"):
    meta = {"model": model, "date": "d", "families": list(FAMILIES), "policies": list(STANDARD_POLICIES),
            "duration_s": 100.0, "settings": settings, "quick": False}
    path.write_text(json.dumps({"meta": meta, "episodes": episodes}))


def test_resume_keeps_the_matching_episodes_and_refuses_other_settings(tmp_path):
    args = cli.parse(["--standard"])
    out = str(tmp_path / "run")
    eps = [_episode("coding", 1000, "full"), _episode("coding", 1005, "full"), _episode("coding", 1000, "none")]
    _previous_run(tmp_path / "run.json", vars(standard()), eps)
    kept, earlier = cli._resumed(args, standard(), out)
    # seed 1005 is past --episodes 2, policy none is not in the run: kept all the same (written back, not rerun)
    assert [(e["family"], e["seed"], e["policy"]) for e in kept] == [("coding", 1000, "full"),
                                                                     ("coding", 1005, "full"), ("coding", 1000, "none")]
    assert earlier == 100.0
    (tmp_path / "run.json").write_text('{"meta": {"model": "qwen2.5-coder-1.5b"')   # cut off mid-write
    with pytest.raises(SystemExit, match="cannot resume"):
        cli._resumed(args, standard(), out)
    bad = [dict(_episode("coding", 1000, "full"), seed="1000")]
    _previous_run(tmp_path / "run.json", vars(standard()), bad)
    with pytest.raises(SystemExit, match="seed"):
        cli._resumed(args, standard(), out)
    other = dict(vars(standard()), window=1024)
    _previous_run(tmp_path / "run.json", other, eps)
    with pytest.raises(SystemExit, match="window"):
        cli._resumed(args, standard(), out)
    _previous_run(tmp_path / "run.json", vars(standard()), eps, model="smollm2-135m")
    with pytest.raises(SystemExit, match="models"):
        cli._resumed(args, standard(), out)
    assert cli._resumed(args, standard(), str(tmp_path / "absent")) == ([], 0.0)


def test_a_resumed_run_runs_only_what_is_missing(monkeypatch, tmp_path):
    import pykvcompact
    import pykvcompact.models.registry
    from bench.eval import run

    ran = []

    class Engine:
        def __init__(self, *a, **k):
            pass

        def tokenize(self, text):
            return text.split()

        def close(self):
            pass

    monkeypatch.setattr(pykvcompact, "Engine", Engine)
    monkeypatch.setattr(pykvcompact.models.registry, "resolve_model", lambda name: "model.gguf")
    monkeypatch.setattr(run, "infeasible", lambda *a: "")
    monkeypatch.setattr(run, "run_episode", lambda engine, ep, pol, s, h: ran.append((ep.family, ep.seed, pol))
                        or _episode(ep.family, ep.seed, pol))
    args = types.SimpleNamespace(threads=1, model="m", policies=["full", "background"], families=["coding"],
                                 episodes=2, seed=1000, quick=False)
    previous = [_episode("coding", 1000, "full"), _episode("coding", 1001, "background")]
    results = run.run_all(args, standard(), str(tmp_path), lambda s: None, previous=previous)
    assert ran == [("coding", 1000, "background"), ("coding", 1001, "full")]
    assert len(results) == 4


def test_accuracy_by_place_is_reported_on_the_held_out_families():
    held = HELD_OUT_FAMILIES[0]
    eps = [_episode(held, 1, "background", True, "middle"), _episode(held, 2, "background", False, "middle"),
           _episode(held, 1, "background", True, "assistant"), _episode("ledger", 1, "background", False, "")]
    table = metrics.table(eps)
    row = table["background"]
    assert row[metrics.HELD_OUT]["by_place"]["middle"]["correct"] == 1
    assert row[metrics.HELD_OUT]["by_place"]["middle"]["questions"] == 2
    assert row[metrics.HELD_OUT]["accuracy"] == pytest.approx(2 / 3)   # the tuned-on ledger is not pooled
    assert row["all"]["accuracy"] == pytest.approx(2 / 4)
    md = report.markdown({"model": "m", "date": "d", "episodes_per_family": 1, "window": 2048, "duration_s": 1},
                         table, [held, "ledger"], ["background"])
    assert "by where the fact lived" in md and "| background | 1/1 | 1/2 | 2/3 (0.67) |" in md
    assert "tuned on: ledger" in md


def test_what_the_model_wrote_is_judged_on_the_facts_of_its_span():
    ep = _episode("coding", 1, "background")
    ep["notes"] = [{"lines": ["MAX = 42"], "required": ["42"], "carried": ["42"], "ms": 1.0},
                   {"lines": ["x"], "required": ["77"], "carried": [], "ms": 1.0},
                   {"lines": ["y"], "required": [], "carried": [], "ms": 1.0}]
    ep["summaries"] = [{"recall": None, "model_text": "- port 42", "span_facts": ["42", "77"], "model_carried": ["42"]},
                       {"recall": None, "model_text": "nothing", "span_facts": [], "model_carried": []},
                       {"recall": None, "model_text": None, "span_facts": ["9"], "model_carried": None}]
    ep["events"] = [{"name": "note_skipped", "reason": "no_room"}, {"name": "summary_failed", "reason": "no_time"}]
    m = metrics.summarize([ep])
    assert (m["notes"], m["notes_on_fact_outputs"], m["notes_informative"]) == (3, 2, 1)
    assert m["note_fact_recall"] == pytest.approx(0.5)
    assert m["model_summaries"] == 2
    assert m["model_summaries_informative"] == pytest.approx(1.0)   # the one whose span established facts
    assert m["model_text_fact_recall"] == pytest.approx(0.5)
    assert m["notes_skipped"] == {"no_room": 1} and m["model_summaries_failed"] == {"no_time": 1}
    md = report.markdown({"model": "m", "date": "d", "episodes_per_family": 1, "window": 2048, "duration_s": 1},
                         metrics.table([ep]), ["coding"], ["background"])
    assert "What the model wrote" in md


def test_each_swap_is_judged_on_the_model_text_it_used():
    """Review: two swaps read in one go got the second one's text on the first and none on the second."""
    from pykvcompact import events as ev
    from bench.eval.episode import Episode, Fact, Step
    from bench.eval.recorder import Recorder

    steps = [Step(0, "read", {}, "port = 4242\nx\ny"), Step(0, "read", {}, "user_id = 777\nx\ny")]
    ep = Episode("coding", 1, "sys", "task", [], steps, [], [Fact(0, "4242"), Fact(1, "777")])
    rec = Recorder(ep, 2048)
    out0, out1 = ({"role": "tool", "content": s.output} for s in steps)
    s1 = {"role": "user", "content": "[Summary] port = 4242", "summary": True}
    s2 = {"role": "user", "content": "[Summary] user_id = 777", "summary": True}
    session = types.SimpleNamespace(
        events=[ev.SummaryReady(10, 1.0, text="- port = 4242"), ev.Rebased("exact", 100, 50, 1.0, 0),
                ev.SummaryReady(10, 1.0, fallback=True, text="(fallback)"), ev.Rebased("exact", 90, 40, 1.0, 0,
                                                                                     fallback=True)],
        transcript=[out0, s1, out1, s2], offloaded=[out0, out1], fill=0.5,
        policy=types.SimpleNamespace(cue_weight=0.0))
    rec.after(session, 1, adding=True)
    assert [s["model_text"] for s in rec.summaries] == ["- port = 4242", None]
    assert rec.summaries[0]["model_carried"] == ["4242"] and rec.summaries[1]["model_carried"] is None


def test_the_checkpoint_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "run.json"
    report.write_json(str(path), {"episodes": [1]})

    def killed(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(json, "dump", killed)
    with pytest.raises(KeyboardInterrupt):
        report.write_json(str(path), {"episodes": [1, 2]})
    assert json.loads(path.read_text()) == {"episodes": [1]}   # the previous checkpoint, intact
