"""bench.eval.metrics.boundary_use: how a policy's compactions met the sub-goal boundaries, and the most
that could have, given how many compactions it made (issue 8: ">= 70% of compactions at boundaries")."""
from __future__ import annotations

from bench.eval.episode import Size
from bench.eval.families import FAMILIES
from bench.eval.metrics import boundary_use, summarize


def _comp(step, phase, at=None):
    c = {"step": step, "phase": phase, "fill": 0.8, "trigger": "hard", "kind": "rebased"}
    if at is not None:
        c["at"] = at
    return c


def _result(comps, boundaries=5):
    return {"answers": [], "tokens": dict.fromkeys(("prefill", "decode", "probe", "background", "total"), 0),
            "compactions": comps, "summaries": [], "probes": [], "stalls_ms": [], "wall_s": 1.0,
            "events": [], "boundaries": boundaries}


def test_two_compactions_at_one_boundary_compact_it_once():
    # a COMPRESS after step 5's output and a swap making room for step 6 both sit at boundary 5
    r = _result([_comp(5, "boundary", at=5), _comp(6, "boundary", at=5), _comp(8, "mid", at=7)])
    assert boundary_use([r]) == {"boundaries": 5, "boundaries_compacted": 1, "compactions_boundary_ceiling": 3}


def test_the_ceiling_is_the_boundaries_when_compactions_outnumber_them():
    many = _result([_comp(i, "mid", at=i) for i in range(12)], boundaries=5)
    few = _result([_comp(5, "boundary", at=5), _comp(7, "mid", at=7)], boundaries=5)
    got = boundary_use([many, few])
    assert got["compactions_boundary_ceiling"] == 5 + 2 and got["boundaries"] == 10
    assert got["boundaries_compacted"] == 1
    assert summarize([many, few])["compactions_boundary_ceiling"] == 7


def test_result_files_without_boundaries_report_none_rather_than_a_guess():
    r = _result([_comp(5, "boundary")])
    del r["boundaries"]
    assert boundary_use([r, _result([])]) == {"boundaries": None, "boundaries_compacted": None,
                                              "compactions_boundary_ceiling": None}


def test_every_family_has_one_boundary_per_sub_goal():
    size = Size(sub_goals=4, steps=3, rows=3)
    for fam, make in FAMILIES.items():
        ep = make(7, size)
        assert ep.boundaries() == 4, fam


def test_a_swap_before_the_first_steps_output_is_at_none_of_the_boundaries():
    ep = FAMILIES["ledger"](7, Size(sub_goals=1, steps=3, rows=3))
    last = len(ep.steps) - 1
    got = boundary_use([_result([_comp(0, "boundary", at=-1), _comp(last, "boundary", at=last)],
                                boundaries=ep.boundaries())])
    assert ep.boundaries() == 1 and got["boundaries_compacted"] == 1, got


def test_the_report_prints_the_ceiling_beside_the_boundaries_compacted():
    from bench.eval import report
    # six compactions at the five boundaries (two at the first): 6 at a boundary, 5 of 5 compacted, at most 5
    comps = [_comp(5, "boundary", at=5), _comp(6, "boundary", at=5)] + [
        _comp(s, "boundary", at=s) for s in (11, 17, 23, 29)]
    m = summarize([_result(comps, boundaries=5)])
    md = report.markdown({"model": "m", "date": "d", "episodes_per_family": 1, "window": 2048, "duration_s": 1},
                         {"background": {"all": m}}, [], ["background"])
    row = next(line for line in md.splitlines() if line.startswith("| background |") and "| 6 |" in line)
    header = next(line for line in md.splitlines() if "boundaries compacted (at most)" in line)
    col = [c.strip() for c in header.split("|")].index("boundaries compacted (at most)")
    assert [c.strip() for c in row.split("|")][col] == "5/5 (5)", row
