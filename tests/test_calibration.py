"""The probe's calibration: a registry model's measured threshold is the session's default, a model whose
probe carries no signal is not asked (the schedule compacts), an explicit threshold always wins; and the
calibration bench's statistics (Youden's threshold, the relative score, the report)."""
from __future__ import annotations

import dataclasses
import sys
import pathlib
import warnings

import pytest

import pykvcompact as pk
from pykvcompact.compaction.prober import ProbeSettings
from pykvcompact.models import calibration, registry as models
from pykvcompact.models.calibration import ProbeCalibration

from fake_engine import FakeEngine

sys.path.append(str(pathlib.Path(__file__).resolve().parents[1]))
from bench.eval import calibrate  # noqa: E402


@pytest.fixture
def registry(monkeypatch):
    """Set the probe calibration of a registry entry for one test."""
    def set_probe(name, cal):
        monkeypatch.setitem(models.REGISTRY, name, dataclasses.replace(models.REGISTRY[name], probe=cal))
    return set_probe


def _engine(probe_p, name="qwen2.5-coder-1.5b"):
    eng = FakeEngine(n_ctx=8192, probe_fn=lambda text: probe_p)
    eng.model_name, eng.model_path = name, f"/models/{name}.gguf"  # a local engine, as pk.Engine(name)
    return eng


def _run(eng, tmp_path, tool_output=lambda i: "result " * 30, steps=14, **pol):
    s = pk.Session(eng, system="You are a test.", history_dir=tmp_path,
                   policy=pk.Policy(mode="rubric", window=1400, summary_max_tokens=48, compact_tool=False,
                                    history_tool=False, probe_min_fill=0.0, **pol))
    for i in range(steps):
        s.add([{"role": "user", "content": f"step {i} " + "word " * 30},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": f"c{i}", "type": "function", "function": {"name": "look", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": f"c{i}", "content": tool_output(i)}])
    return s


def test_calibrated_threshold_is_the_default_and_explicit_wins(registry, tmp_path):
    registry("qwen2.5-coder-1.5b", ProbeCalibration(threshold=0.8, auc=0.9, points=100, source="x.json"))
    s = _run(_engine(0.7), tmp_path / "a")
    probes = [e for e in s.events if e.name == "probe"]
    assert probes and all(e.verdict == "CONTINUE" for e in probes)  # 0.7 < the calibrated 0.8
    s.close()
    s = _run(_engine(0.7), tmp_path / "b", threshold=0.5)
    assert any(e.name == "probe" and e.verdict == "COMPRESS" for e in s.events)
    s.close()


def test_no_signal_model_is_not_probed_and_compacts_on_the_schedule(registry, tmp_path):
    registry("qwen2.5-coder-1.5b", ProbeCalibration(threshold=0.7, auc=0.52, points=100, source="x.json"))
    with pytest.warns(RuntimeWarning, match=r"no signal on this model \(AUC 0.52"):
        s = _run(_engine(0.99), tmp_path / "a")
    skipped = [e for e in s.events if e.name == "probe_skipped"]
    assert skipped and all(e.reason == "no_signal" for e in skipped)
    assert not any(e.name == "probe" for e in s.events)
    reb = [e for e in s.events if e.name == "rebased"]
    assert reb and all(e.trigger == "hard" for e in reb)  # the schedule, not the (ignored) probe
    s.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an explicit threshold: asked, no warning
        s = _run(_engine(0.99), tmp_path / "b", threshold=0.9)
    assert any(e.name == "probe" and e.verdict == "COMPRESS" for e in s.events)
    s.close()


def test_a_mode_without_probes_never_warns(registry, tmp_path):
    registry("qwen2.5-coder-1.5b", ProbeCalibration(threshold=0.7, auc=0.5, points=10, source="x.json"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        s = pk.Session(_engine(0.9), history_dir=tmp_path, policy=pk.Policy(mode="hard", window=1400))
    assert [str(w.message) for w in seen] == []
    s.close()


def test_engine_to_calibration_by_name_and_by_file(registry):
    cal = ProbeCalibration(threshold=0.6, auc=0.8, points=10, source="x.json")
    registry("smollm2-135m", cal)

    class ByPath:
        model_name = "/somewhere/SmolLM2-135M-Instruct.Q4_1.gguf"
        model_path = "/somewhere/SmolLM2-135M-Instruct.Q4_1.gguf"

    class Unknown:
        model_name = "/x/other.gguf"
        model_path = "/x/other.gguf"
    assert models.for_engine(ByPath()) is cal
    assert models.for_engine(Unknown()) is None
    assert ProbeSettings.of(pk.Policy(), Unknown()) == ProbeSettings(True, calibration.DEFAULT_THRESHOLD, "")
    assert ProbeSettings.of(pk.Policy(threshold=0.3), ByPath()).threshold == 0.3


def test_shipped_calibrations_are_consistent():
    for spec in models.REGISTRY.values():
        if spec.probe is not None:
            assert 0.0 <= spec.probe.threshold <= 1.0 and 0.0 <= spec.probe.auc <= 1.0
            assert (pathlib.Path(__file__).resolve().parents[1] / spec.probe.source).is_file(), spec.probe.source


def test_youden_relative_and_report():
    t = calibrate.youden([0.9, 0.8], [0.1, 0.2, 0.85])
    assert t["threshold"] == 0.8 and t["tpr"] == 1.0 and abs(t["fpr"] - 1 / 3) < 1e-9
    assert calibrate.relative([0.5, 0.7, 0.4]) == [0.0, pytest.approx(0.2), pytest.approx(-0.2)]
    pts = [{"family": "ledger", "seed": 1, "step": i, "label": "boundary" if i % 3 == 2 else "mid",
            "p": {"family": 0.9 if i % 3 == 2 else 0.3, "boundary": 0.5}} for i in range(9)]
    rep = calibrate.report(pts)
    assert rep["variants"]["family"]["all"]["auc"] == 1.0
    assert rep["variants"]["boundary"]["all"]["auc"] == 0.5  # constant: ties count one half
    assert set(rep["variants"]) == {"family", "boundary", "family-relative", "boundary-relative"}


def test_a_calibration_applies_to_its_rubric_and_labels_only(registry):
    registry("smollm2-135m", ProbeCalibration(threshold=0.7, auc=0.5, points=10, source="x.json", rubric="boundary"))

    class Local:
        model_name, model_path = "smollm2-135m", "/x/SmolLM2-135M-Instruct.Q4_1.gguf"

    class Remote:  # a server's model name, no local file: never the registry's measurement
        model_name = "smollm2-135m"
    assert not ProbeSettings.of(pk.Policy(rubric="boundary"), Local()).ask
    assert ProbeSettings.of(pk.Policy(rubric="default"), Local()) == ProbeSettings(True, 0.5, "")
    assert ProbeSettings.of(pk.Policy(rubric="boundary"), Local(), labels=("YES", "NO")).ask
    assert ProbeSettings.of(pk.Policy(rubric="boundary"), Remote()).ask


def test_threshold_at_a_bounded_false_positive_rate():
    pos, neg = [0.9, 0.7, 0.5], [0.1, 0.2, 0.3, 0.4, 0.6, 0.8, 0.15, 0.25, 0.35, 0.05]
    t = calibrate.at_fpr(pos, neg, 0.1)
    assert t == {"threshold": 0.7, "tpr": 2 / 3, "fpr": 0.1}  # 0.8 is the one false positive allowed
    assert calibrate.at_fpr([0.1], [0.9], 0.1)["threshold"] == 1.0  # none possible: never COMPRESS


def _every_third_states_a_result(i):
    return f"Settled total for ACC-{i}: {100 + i}.25" if i % 3 == 2 else "record " * 30


def test_a_calibrated_model_is_asked_wherever_the_cadence_says_whatever_the_output_says(registry, tmp_path):
    """No probe waits for a tool output's wording (the removed needs_cue): a stated result and a page of
    records are asked alike, and the verdict is the probability against the calibrated threshold."""
    registry("qwen2.5-coder-1.5b", ProbeCalibration(threshold=0.6, auc=0.7, points=100, source="x.json"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the model is asked: no warning
        s = _run(_engine(0.45), tmp_path / "a", tool_output=_every_third_states_a_result, steps=8, cue_weight=0.2)
    asked = [e for e in s.events if e.name == "probe"]
    assert not any(e.name == "probe_skipped" and e.reason not in ("no_cut_point", "below_floor") for e in s.events)
    # every step is asked but where the structure leaves nothing to compact (how many depends on what each
    # summary holds: 5 of 8 with the test model's summaries)
    skipped = [e for e in s.events if e.name == "probe_skipped"]
    assert len(asked) + len(skipped) == 8 and len(asked) >= 4
    # each step brings a user message (structure): the cue holds at every probe, 0.45 + 0.2 >= 0.6
    assert all(e.cue and (e.verdict, e.reason) == ("COMPRESS", "model+cue") for e in asked)
    s.close()
    # the default weight (0): the probability alone decides, CONTINUE everywhere, the cue still reported
    s = _run(_engine(0.45), tmp_path / "b", tool_output=_every_third_states_a_result, steps=8)
    asked = [e for e in s.events if e.name == "probe"]
    assert asked and all(e.cue and (e.verdict, e.reason) == ("CONTINUE", "model") for e in asked)
    s.close()


def test_settings_of_a_model_without_signal_out_of_family():
    """A registry entry whose pooled leave-one-family-out AUC is below MIN_AUC: not asked, and says why."""
    cal = ProbeCalibration(threshold=0.45, auc=0.55, points=150, source="x.json",
                           tuned_on=("ledger", "search"), lofo_tpr=0.4, lofo_fpr=0.35)
    assert not cal.has_signal

    class Local:
        model_name, model_path = "qwen2.5-coder-1.5b", "/x/qwen.gguf"

    import pykvcompact.models.registry as M
    old = M.REGISTRY["qwen2.5-coder-1.5b"]
    M.REGISTRY["qwen2.5-coder-1.5b"] = dataclasses.replace(old, probe=cal)
    try:
        st = ProbeSettings.of(pk.Policy(), Local())
        assert not st.ask and "no signal" in st.why and "AUC 0.55" in st.why and st.threshold == 0.45
        assert ProbeSettings.of(pk.Policy(threshold=0.5), Local()) == ProbeSettings(True, 0.5, "")
    finally:
        M.REGISTRY["qwen2.5-coder-1.5b"] = old


def _pts(family, boundary, mid, cue=None):
    out = [{"family": family, "seed": 1, "step": i, "label": "boundary", "p": {"boundary": x}}
           for i, x in enumerate(boundary)]
    out += [{"family": family, "seed": 1, "step": 10 + i, "label": "mid", "p": {"boundary": x}}
            for i, x in enumerate(mid)]
    for p in out:
        p["structural"] = "" if cue is None else cue(p)
    return out


def test_leave_one_family_out_arithmetic():
    # a and b separate at 0.5; c is shifted up (its mid points sit at 0.6) and inverted
    pts = _pts("a", [0.6, 0.7], [0.2, 0.3, 0.4]) + _pts("b", [0.55, 0.8], [0.1, 0.45, 0.5]) + \
        _pts("c", [0.5, 0.55], [0.6, 0.65, 0.7])
    rep = calibrate.lofo(pts, lambda p: p["p"]["boundary"])
    fam = rep["families"]
    # held out a: Youden on b and c ... the lowest threshold with the best J there
    for name, r in fam.items():
        others = [p for p in pts if p["family"] != name]
        y = calibrate.youden([p["p"]["boundary"] for p in others if p["label"] == "boundary"],
                             [p["p"]["boundary"] for p in others if p["label"] == "mid"])
        assert r["threshold"] == y["threshold"] and r["tuned_on"] == sorted({"a", "b", "c"} - {name})
        held = [p for p in pts if p["family"] == name]
        assert r["tpr"] == sum(p["p"]["boundary"] >= y["threshold"] for p in held if p["label"] == "boundary") / 2
        assert r["fpr"] == sum(p["p"]["boundary"] >= y["threshold"] for p in held if p["label"] == "mid") / 3
    assert fam["a"]["auc"] == 1.0 and fam["b"]["auc"] == 1.0 and fam["c"]["auc"] == 0.0
    po = rep["pooled"]
    assert po["auc_min"] == 0.0 and po["auc_mean"] == pytest.approx(2 / 3)
    assert po["n_boundary"] == 6 and po["n_mid"] == 9
    assert po["tpr"] == pytest.approx(sum(r["tpr"] * 2 for r in fam.values()) / 6)
    assert po["fpr"] == pytest.approx(sum(r["fpr"] * 3 for r in fam.values()) / 9)
    assert po["j"] == pytest.approx(po["tpr"] - po["fpr"])
    # pooled AUC: all held-out scores together (family c's offset counts against it)
    allpos = [p["p"]["boundary"] for p in pts if p["label"] == "boundary"]
    allneg = [p["p"]["boundary"] for p in pts if p["label"] == "mid"]
    assert po["auc"] == calibrate.auc(allpos, allneg)
    # the cue variants: the weight is added where the structural cue held
    cued = _pts("a", [0.6, 0.7], [0.2, 0.3, 0.4], cue=lambda p: "user" if p["step"] == 10 else "") + \
        _pts("b", [0.55, 0.8], [0.1, 0.45, 0.5], cue=lambda p: "user" if p["step"] == 10 else "")
    lr = calibrate.lofo_report(cued, weights=[0.5])
    assert set(lr["variants"]) == {"boundary", "boundary+cue0.5"}
    assert lr["variants"]["boundary"]["youden"]["families"]["a"]["auc"] == 1.0
    assert lr["variants"]["boundary+cue0.5"]["youden"]["families"]["a"]["auc"] == 0.75  # mid 0.2+0.5: above 0.6, ties 0.7
    assert lr["variants"]["boundary"]["all_families"]["tuned_on"] == ["a", "b"]


def test_structural_cues_of_stored_points_are_rebuilt_from_the_script():
    """No model: a point's cue is "user" where its step opens a sub-goal (the step's user turn), else none."""
    from bench.eval.episode import Size
    from bench.eval.families import FAMILIES
    ep = FAMILIES["ledger"](1, Size.for_window(1024))
    pts = [{"family": "ledger", "seed": 1, "step": i, "label": "boundary" if s.closes else "mid",
            "p": {"boundary": 0.5}} for i, s in enumerate(ep.steps)]
    got = calibrate.with_structural(pts, 1024)
    assert [p["structural"] for p in got] == ["user" if s.opens else "" for s in ep.steps]
    bad = [dict(pts[0], label="boundary")]
    with pytest.raises(ValueError, match="does not match"):
        calibrate.with_structural(bad, 1024)


def test_the_report_adds_the_structural_cue():
    pts = [{"family": "ledger", "seed": 1, "step": i, "label": "boundary" if i % 3 == 2 else "mid",
            "structural": "user" if i % 3 == 0 else "", "p": {"boundary": 0.45 if i % 3 == 2 else 0.40}}
           for i in range(9)]
    rep = calibrate.report(pts)
    weights = calibrate.cue_weights()
    assert set(rep["variants"]) == {"boundary", "boundary-relative"} | {f"boundary+cue{w:g}" for w in weights}
    assert rep["variants"]["boundary"]["all"]["auc"] == 1.0
    w = max(weights)
    assert rep["variants"][f"boundary+cue{w:g}"]["all"]["auc"] < 1.0  # the cue lifts mid points here
    assert "without_cue" not in rep["variants"][f"boundary+cue{w:g}"]


def test_the_shipped_calibration_is_its_lofo_report():
    """The registry's figures are the leave-one-family-out file's: pooled AUC, held-out TPR/FPR, and the
    threshold fit on the families it names."""
    import json
    for spec in models.REGISTRY.values():
        cal = spec.probe
        if cal is None:
            continue
        data = json.loads((pathlib.Path(__file__).resolve().parents[1] / cal.source).read_text())
        v = data["report"]["variants"][cal.rubric]
        assert cal.auc == pytest.approx(v["youden"]["pooled"]["auc"], abs=5e-4), spec.name
        assert cal.lofo_tpr == pytest.approx(v["youden"]["pooled"]["tpr"], abs=5e-4), spec.name
        assert cal.lofo_fpr == pytest.approx(v["youden"]["pooled"]["fpr"], abs=5e-4), spec.name
        assert cal.threshold == pytest.approx(v["all_families"]["youden"]["threshold"], abs=5e-5), spec.name
        assert sorted(cal.tuned_on) == v["all_families"]["tuned_on"], spec.name
        assert cal.points == data["meta"]["points"], spec.name


def test_a_probe_at_chance_held_out_is_not_asked_even_above_min_auc():
    """Issue 33: pooled AUC above MIN_AUC is not enough: held out, at a threshold that keeps false COMPRESS to
    10% on the families it was fit on, the probe must beat chance (calibration.MIN_HELD_OUT_J)."""
    from pykvcompact.models.calibration import MIN_HELD_OUT_J, ProbeCalibration
    weak = ProbeCalibration(threshold=0.45, auc=0.68, points=150, source="x.json", held_out_j=0.04)
    strong = ProbeCalibration(threshold=0.45, auc=0.68, points=150, source="x.json", held_out_j=0.3)
    assert not weak.has_signal and strong.has_signal and MIN_HELD_OUT_J == 0.2
    assert ProbeCalibration(threshold=0.45, auc=0.68, points=150, source="x.json").has_signal   # not measured


def test_the_default_model_ships_no_signal_held_out():
    from pykvcompact.models.registry import REGISTRY
    cal = REGISTRY["qwen2.5-coder-1.5b"].probe
    assert cal.held_out_j is not None and cal.held_out_j < 0.2 and not cal.has_signal
    assert set(cal.tuned_on) == {"code", "instructions", "ledger", "math", "search"}


def test_background_mode_on_a_no_signal_model_lets_the_schedule_decide_without_a_warning(registry, tmp_path):
    registry("qwen2.5-coder-1.5b", ProbeCalibration(threshold=0.45, auc=0.68, points=150, source="x.json",
                                                    held_out_j=0.04))
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # the default mode on the default model: no warning per session
        s = pk.Session(_engine(0.99), system="You are a test.", history_dir=tmp_path,
                       policy=pk.Policy(mode="background", window=1400, summary_max_tokens=48, compact_tool=False,
                                        history_tool=False, probe_min_fill=0.0))
        for i in range(14):
            s.add([{"role": "user", "content": f"step {i} " + "word " * 30},
                   {"role": "assistant", "content": None, "tool_calls": [
                       {"id": f"c{i}", "type": "function", "function": {"name": "look", "arguments": "{}"}}]},
                   {"role": "tool", "tool_call_id": f"c{i}", "content": "result " * 30}])
    assert not any(e.name == "probe" for e in s.events)
    assert any(e.name == "probe_skipped" and e.reason == "no_signal" for e in s.events)
    assert any(e.name == "rebased" for e in s.events)
    s.close()
