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
from pykvcompact import calibration, models
from pykvcompact.calibration import ProbeCalibration, ProbeSettings

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
    assert calibration.for_engine(ByPath()) is cal
    assert calibration.for_engine(Unknown()) is None
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


def test_a_model_that_needs_the_cue_is_asked_only_after_a_stated_result(registry, tmp_path):
    """needs_cue: without the cue the calibrated probe did not say COMPRESS, so it is not asked there."""
    registry("qwen2.5-coder-1.5b", ProbeCalibration(threshold=0.6, auc=0.7, points=100, source="x.json",
                                                    needs_cue=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the model is asked: no warning
        s = _run(_engine(0.45), tmp_path / "a", tool_output=_every_third_states_a_result, steps=8)
    asked = [e for e in s.events if e.name == "probe"]
    skipped = [e for e in s.events if e.name == "probe_skipped" and e.reason == "no_cue"]
    assert asked and all(e.cue for e in asked), asked        # asked only where the cue fired
    assert all(e.verdict == "COMPRESS" and e.reason == "model+cue" for e in asked)  # 0.45 + 0.2 >= 0.6
    assert skipped and all(e.trigger in ("tool_result", "interval") for e in skipped)
    assert len(asked) + len(skipped) >= 6
    s.close()
    # the cue switched off (result_cue=0) or an explicit threshold: the probability decides, asked anywhere
    for name, pol in (("b", {"result_cue": 0.0}), ("c", {"threshold": 0.6})):
        s = _run(_engine(0.45), tmp_path / name, tool_output=_every_third_states_a_result, steps=8, **pol)
        assert not any(e.name == "probe_skipped" and e.reason == "no_cue" for e in s.events), name
        assert any(e.name == "probe" and not e.cue for e in s.events), name
        s.close()


def test_the_report_says_whether_the_probe_needs_the_cue():
    pts = [{"family": "ledger", "seed": 1, "step": i, "label": "boundary" if i % 3 == 2 else "mid",
            "cue": i % 3 == 2, "p": {"boundary": 0.45 if i % 3 == 2 else 0.40}} for i in range(9)]
    rep = calibrate.report(pts)
    w = rep["variants"]["boundary+cue"]["without_cue"]
    assert w["points"] == 6 and w["max_p"] == 0.40 and w["needs_cue"] and w["compress"] == {"boundary": 0, "mid": 0}
    pts[0]["p"]["boundary"] = 0.9  # one point without the cue above the +cue threshold (0.65)
    w = calibrate.report(pts)["variants"]["boundary+cue"]["without_cue"]
    assert not w["needs_cue"] and w["compress"] == {"boundary": 0, "mid": 1}


def test_the_shipped_needs_cue_is_what_its_calibration_measured():
    import json
    for spec in models.REGISTRY.values():
        cal = spec.probe
        if cal is None or not cal.needs_cue:
            continue
        data = json.loads((pathlib.Path(__file__).resolve().parents[1] / cal.source).read_text())
        w = data["report"]["variants"][f"{cal.rubric}+cue"]["without_cue"]
        assert w["needs_cue"] and w["points"] > 0, spec.name  # measured on cue-less points, not on none
        assert w["max_p"] is not None and w["max_p"] < cal.threshold, spec.name


def test_without_cue_claims_nothing_from_zero_cue_less_points():
    """Every point carried the cue: there is no evidence about the probe without it, so no needs_cue."""
    pts = [{"family": "ledger", "seed": 1, "step": i, "label": "boundary" if i % 3 == 2 else "mid", "cue": True,
            "p": {"boundary": 0.45 if i % 3 == 2 else 0.40}} for i in range(9)]
    w = calibrate.report(pts)["variants"]["boundary+cue"]["without_cue"]
    assert w["points"] == 0 and w["max_p"] is None and not w["needs_cue"], w
