"""bench.eval.merge: runs made separately pool into the report one run would have made."""
import copy
import json
import pathlib

import pytest

from bench.eval import metrics
from bench.eval.merge import main, merge

RUN = pathlib.Path(__file__).resolve().parents[1] / "bench" / "results" / "eval-qwen-ledger.json"


def _split(run: dict, policies) -> dict:
    part = copy.deepcopy(run)
    part["episodes"] = [e for e in part["episodes"] if e["policy"] in policies]
    part["meta"]["policies"] = [p for p in part["meta"]["policies"] if p in policies]
    part["meta"]["duration_s"] = 10.0
    return part


def test_two_halves_of_a_run_merge_into_its_metrics():
    run = json.loads(RUN.read_text())
    policies = run["meta"]["policies"]
    a, b = _split(run, policies[:2]), _split(run, policies[2:])
    merged = merge([a, b])
    assert merged["metrics"] == metrics.table(run["episodes"])  # as one run of all of them
    assert set(merged["metrics"]) == set(policies)
    assert merged["meta"]["policies"] == policies
    assert merged["meta"]["duration_s"] == 20.0
    assert len(merged["episodes"]) == len(run["episodes"])


def test_a_setting_that_differs_is_refused_by_name():
    run = json.loads(RUN.read_text())
    other = _split(run, run["meta"]["policies"][2:])
    other["meta"]["settings"]["window"] = 2048
    with pytest.raises(ValueError, match="window"):
        merge([_split(run, run["meta"]["policies"][:2]), other])


def test_an_episode_in_two_runs_is_refused():
    run = json.loads(RUN.read_text())
    with pytest.raises(ValueError, match="in two runs"):
        merge([run, run])


def test_the_cli_writes_the_report_and_refuses_a_missing_file(tmp_path, capsys):
    run = json.loads(RUN.read_text())
    policies = run["meta"]["policies"]
    paths = []
    for i, part in enumerate((_split(run, policies[:1]), _split(run, policies[1:]))):
        paths.append(tmp_path / f"part{i}.json")
        paths[-1].write_text(json.dumps(part))
    assert main([str(tmp_path / "all"), *map(str, paths), "--no-plots"]) == 0
    md = (tmp_path / "all.md").read_text()
    assert all(p in md for p in policies)
    with pytest.raises(SystemExit, match="cannot read"):
        main([str(tmp_path / "x"), str(tmp_path / "missing.json"), "--no-plots"])


def test_plots_of_a_run_with_no_correct_answer_and_a_failing_plot(tmp_path, capsys):
    """0/3 correct once crashed the accuracy plot (a negative error bar) and with it the whole run."""
    pytest.importorskip("matplotlib")
    from bench.eval import plots

    run = json.loads(RUN.read_text())
    eps = [dict(e, answers=[dict(a, correct=False) for a in e["answers"][:3]]) for e in run["episodes"]]
    files = plots.write_both(metrics.table(eps), eps, str(tmp_path / "r"), "m")
    assert [pathlib.Path(f).name for f in files] == ["r-accuracy.png", "r-fill.png"]
    broken = [dict(e, timeline=None) for e in eps]  # the fill plot fails; the other is still written
    files = plots.write_both(metrics.table(eps), broken, str(tmp_path / "b"), "m")
    assert [pathlib.Path(f).name for f in files] == ["b-accuracy.png"]
    assert "b-fill.png not written" in capsys.readouterr().err


def test_a_merged_report_merges_again_and_counts_its_episodes(tmp_path):
    run = json.loads(RUN.read_text())
    policies = run["meta"]["policies"]
    once = merge([_split(run, policies[:2]), _split(run, policies[2:])])
    later = copy.deepcopy(run)
    for e in later["episodes"]:
        e["seed"] += 1
    twice = merge([once, later])
    assert twice["meta"]["threads"] == [2] and twice["meta"]["episodes_per_family"] == 2
    assert twice["meta"]["seed"] == 1000
    assert twice["metrics"] == metrics.table(run["episodes"] + later["episodes"])


def test_a_run_from_before_a_setting_existed_merges_with_its_default():
    run = json.loads(RUN.read_text())
    run["meta"]["settings"]["tool_latency"] = 0.0
    old = copy.deepcopy(run)
    del old["meta"]["settings"]["tool_latency"]  # written before --tool-latency: it ran with 0
    for e in old["episodes"]:
        e["seed"] += 1
    assert len(merge([run, old])["episodes"]) == 2 * len(run["episodes"])
    old["meta"]["quick"] = True
    with pytest.raises(ValueError, match="quick"):
        merge([run, old])


@pytest.mark.parametrize("bad, says", [
    ([], "not an eval JSON"), (None, "not an eval JSON"),
    ({"meta": {"model": "m"}, "episodes": []}, "meta lacks"),
    ({"meta": {"model": "m", "date": "d", "families": [], "policies": [], "duration_s": 1, "settings": None},
      "episodes": []}, "settings"),
])
def test_what_is_not_an_eval_run_is_named(bad, says, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(SystemExit, match=says) as e:
        main([str(tmp_path / "sub" / "out"), str(path), "--no-plots"])
    assert "bad.json" in str(e.value)


def test_a_stored_run_whose_probe_skipped_events_carry_no_reason_still_merges():
    """Older result files have probe_skipped events without a reason: they pool, counted as "unknown"."""
    path = RUN.parent / "eval-smollm2-135m-small.json"
    run = json.loads(path.read_text())
    pooled = merge([run], [path.name])
    assert pooled["metrics"]


def test_keep_recent_left_at_its_default_merges_with_the_same_value_given_and_not_with_another():
    run = json.loads(RUN.read_text())
    given = _split(run, run["meta"]["policies"][2:])
    given["meta"]["settings"]["keep_recent"] = 0.10     # --keep-recent 0.1: the policy's default
    assert merge([_split(run, run["meta"]["policies"][:2]), given])["episodes"]
    given["meta"]["settings"]["keep_recent"] = 0.05
    with pytest.raises(ValueError, match="keep_recent"):
        merge([_split(run, run["meta"]["policies"][:2]), given])
