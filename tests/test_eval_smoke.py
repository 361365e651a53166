"""The evaluation harness (bench/eval): its arithmetic, and a tiny smoke run on SmolLM2 whose metrics must
be consistent (not good: SmolLM2 is weak).  The smoke run is ``--episodes 2 --quick`` on one family and four
policies (hard+search included) with short episodes (1.2 x the window): ~9 min for ours plus the peer's, measured
here on 2026-12-02 (it was 2-3 minutes with three policies on 2 idle cores);
``--threads 1`` because on a shared, loaded machine two ggml threads per process are ~10x slower."""
import json
import subprocess

import pytest

from bench.eval.metrics import auc, summarize, wilson
from bench.eval.scoring import carries, is_correct



def test_wilson_interval_known_values():
    lo, hi = wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-3) and hi == pytest.approx(0.7634, abs=1e-3)
    assert wilson(0, 4)[0] == 0.0 and wilson(4, 4)[1] == pytest.approx(1.0)
    assert wilson(0, 0) == (0.0, 1.0)
    for n in range(1, 12):  # exact ends: the formula leaves rounding dust (0/3 gave 5.6e-17, which broke a plot)
        assert wilson(0, n)[0] == 0.0 and wilson(n, n)[1] == 1.0


def test_auc_is_mann_whitney():
    assert auc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert auc([0.1], [0.9]) == 0.0
    assert auc([0.5, 0.7], [0.5]) == 0.75        # a tie counts one half
    assert auc([], [0.3]) is None


def test_scoring_is_normalised_whole_token_match():
    assert is_correct("The total is **5,032.39**.", "5032.39")
    assert not is_correct("15032.39", "5032.39")
    assert is_correct("rel7-", "rel7-") and is_correct("Friday.", "friday")
    assert not is_correct("", "7943")
    assert carries("Verified facts: R1 = 2447", "2447") and not carries("R1 = 244", "2447")


def test_policy_names_with_the_search_suffix(capsys):
    from bench.eval.__main__ import parse
    from bench.eval.policies import is_known
    assert is_known("background+search") and is_known("hard") and not is_known("peer+search")
    assert not is_known("full+search") and not is_known("nope+search")
    assert parse(["--policies", "hard,background+search"]).policies == ["hard", "background+search"]
    with pytest.raises(SystemExit):
        parse(["--policies", "peer+search"])
    err = capsys.readouterr().err   # the error names the suffixes too, not only the base policies
    assert "unknown ['peer+search']" in err and "+search" in err.split("choose from")[1] and "+noprobe" in err


def test_background_without_the_probe():
    from bench.eval.__main__ import parse
    from bench.eval.policies import Settings, is_known, make_policy
    assert is_known("background+noprobe") and not is_known("hard+noprobe") and not is_known("peer+noprobe")
    assert is_known("background+noprobe+search") and not is_known("background+search+noprobe")
    assert make_policy("background+noprobe+search", "ledger", Settings()).history_tool is True
    assert not is_known("hard+search+search") and not is_known("+search")
    with pytest.raises(SystemExit):
        parse(["--policies", "rubric+noprobe"])
    off, on = (make_policy(n, "ledger", Settings()) for n in ("background+noprobe", "background"))
    assert off.mode == on.mode == "background" and on.probe_on_tool_result and not off.probe_on_tool_result
    import pykvcompact.compaction.policy as P
    assert not P.probe_due(off, generated_since_probe=10 ** 6, tool_results_since_probe=50, after_tool_result=True)
    assert P.probe_due(on, tool_results_since_probe=1, after_tool_result=True)


def test_keep_recent_reaches_the_summarizing_policies_and_a_bad_one_is_refused_before_loading(capsys):
    from bench.eval.__main__ import main
    from bench.eval.policies import Settings, make_policy
    s = Settings(keep_recent=0.05)
    assert all(make_policy(n, "ledger", s).keep_recent == 0.05 for n in ("fixed", "hard", "background", "tool"))
    assert make_policy("hard", "ledger", Settings()).keep_recent == 0.10  # None: the policy's default
    with pytest.raises(SystemExit, match="policy 'fixed'.*keep_recent"):
        main(["--keep-recent", "0.4", "--policies", "hard,fixed", "--model", "/nonexistent.gguf"])
    # window 2048, hard 1740: ceil(0.7 * 2048) = 1434 + the 256-token summary + its message >= 1740
    with pytest.raises(SystemExit, match="invalid settings for policy 'hard'"):
        main(["--keep-recent", "0.7", "--policies", "hard", "--model", "/nonexistent.gguf"])


def _consistent(m: dict) -> None:
    if m["accuracy"] is not None:
        assert 0.0 <= m["accuracy"] <= 1.0
        assert m["ci95"][0] <= m["accuracy"] <= m["ci95"][1]
    t = m["tokens"]
    assert t["prefill"] > 0 and t["decode"] > 0 and min(t.values()) >= 0
    assert t["total"] == t["prefill"] + t["decode"] + t["probe"] + t["background"]
    assert m["compactions_at_boundary"] + m["compactions_mid"] <= m["compactions"]  # + the questions phase
    # every episode records its sub-goal boundaries; each compacted one holds a compaction at a boundary
    assert m["boundaries"] >= m["episodes"]
    assert m["boundaries_compacted"] <= min(m["compactions_at_boundary"], m["boundaries"],
                                            m["compactions_boundary_ceiling"])
    assert m["fact_recall_mean"] is None or 0.0 <= m["fact_recall_mean"] <= 1.0
    assert m["probe_auc"] is None or 0.0 <= m["probe_auc"] <= 1.0


def test_smoke_run_on_smollm2(tmp_path):
    pytest.importorskip("matplotlib")
    from pykvcompact.models.registry import resolve_model
    try:
        resolve_model("smollm2-135m")
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"SmolLM2 is not installed: {exc}")
    out = tmp_path / "eval"
    from bench.eval.launch import command
    # the installed pykvcompact, as CI runs it (see bench/eval/launch.py)
    cmd = command("bench.eval", "--model", "smollm2-135m", "--episodes", "2", "--quick",
                  "--families", "instructions", "--policies", "full,hard,hard+search,peer", "--ratio", "1.2",
                  "--threads", "1", "--out", str(out), "--quiet")
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out.parent / "eval.json").read_text())
    for suffix in (".md", "-accuracy.png", "-fill.png"):
        assert (out.parent / f"eval{suffix}").stat().st_size > 0
    eps = data["episodes"]
    assert sorted((e["policy"], e["seed"]) for e in eps) == sorted(
        (p, s) for p in ("full", "hard", "hard+search", "peer") for s in (1000, 1001))
    assert "hard+search" in data["metrics"] and all(
        isinstance(e.get("search_calls", 0), int) for e in eps)
    for e in eps:
        assert e["answers"] and all(isinstance(a["correct"], bool) for a in e["answers"])
        assert e["wall_s"] > 0
        for c in e["compactions"]:
            assert c["phase"] in ("boundary", "mid", "questions") and 0.0 < c["fill"] <= 1.0
        for s in e["summaries"]:
            assert s["recall"] is None or 0.0 <= s["recall"] <= 1.0
            assert set(s["carried"]) <= set(s["required"])
        for p in e["probes"]:
            assert 0.0 <= p["p"] <= 1.0 and p["label"] in ("boundary", "mid", "questions")
        assert all(0.0 <= x["fill"] <= 1.0 for x in e["timeline"])
    # the full window never compacts; the hard policy and the peer must have compacted (else the run is vacuous)
    assert not any(e["compactions"] for e in eps if e["policy"] == "full")
    for pol in ("hard", "peer"):
        assert any(e["compactions"] for e in eps if e["policy"] == pol), pol
    for pol, fams in data["metrics"].items():
        for fam, m in fams.items():
            _consistent(m)
            assert m == summarize([e for e in eps if e["policy"] == pol and fam in ("all", e["family"])])
    table = (out.parent / "eval.md").read_text()
    for pol in ("full", "hard", "peer"):
        assert f"| {pol} |" in table
