"""The timeline recorder and the PNG it draws: a session that compacts on the tiny model is recorded
(fill samples, streamed pieces, turns, events) and plotted; ``pykvcompact agent --plot`` writes one."""
from __future__ import annotations

import json

import matplotlib.image
import pytest

import pykvcompact as pk
from pykvcompact.cli import main as cli
from pykvcompact.timeline.plots import plot_timeline
from pykvcompact.timeline.record import Timeline


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    from tiny_model import make_tiny_gguf

    return make_tiny_gguf(tmp_path_factory.mktemp("plotmodel") / "tiny.gguf", seed=0)


def _is_png(path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_recorded_session_is_plotted(tiny_path, tmp_path):
    eng = pk.Engine(tiny_path, n_ctx=4096, n_seq_max=8, n_threads=1)
    try:
        tl = Timeline()
        s = tl.attach(pk.Session(eng, system="You are terse.", history_dir=str(tmp_path),
                                 policy=pk.Policy(mode="hard", window=512, summary_max_tokens=24)))
        for i in range(12):
            s.chat(" ".join(f"item {i}.{k} = {k * i}" for k in range(8)), max_tokens=8)  # chat is recorded too
        tl.finish()
        s.close()
    finally:
        eng.close()
    assert len(tl.turns) == 12 and tl.pieces and tl.tokens_per_s() > 0
    assert all(0 <= f <= 1 for _, f in tl.samples)
    assert any(e["event"] == "rebased" for e in tl.events)
    assert any(f1 < f0 for (_, f0), (_, f1) in zip(tl.samples, tl.samples[1:])), "the fill must drop at a swap"
    assert all(ms >= 0 for _, ms in tl.inter_token_ms())
    out = plot_timeline(tl, tmp_path / "sub" / "timeline.png")
    assert _is_png(out)
    h, w = matplotlib.image.imread(out).shape[:2]
    assert w > 600 and h > 300


def test_empty_timeline_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="empty"):
        plot_timeline(Timeline(), tmp_path / "x.png")


def test_agent_plot_command(tiny_path, tmp_path, monkeypatch, capsys):
    """The CLI records whatever session the demo creates; a short stand-in demo keeps the test quick."""
    import pykvcompact.cli.agent_demo as demo

    def short_demo(model=None, turns=2, window=1024, mode="background", out=print, **kw):
        eng = pk.Engine(model, n_ctx=4096, n_seq_max=8, n_threads=1)
        try:
            s = pk.Session(eng, policy=pk.Policy(mode=mode, window=window), history_dir=str(tmp_path))
            for i in range(turns):
                s.chat(f"turn {i}", max_tokens=8)
                out(f"turn {i} done")
            s.close()
            return {"turns": turns, "mode": mode}
        finally:
            eng.close()

    monkeypatch.setattr(demo, "run_agent_demo", short_demo)
    png = tmp_path / "agent.png"
    rc = cli.main(["agent", "--model", str(tiny_path), "--turns", "3", "--plot", str(png), "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary == {"turns": 3, "mode": "background", "plot": str(png)}
    assert _is_png(png)
