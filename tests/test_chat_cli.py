"""``pykvcompact chat`` and the CLI's script-facing behaviour: the chat loop with fake input/output on
the tiny model (streamed reply, every /command), the real command fed through stdin, ``--json``, and
one-line errors unless ``--debug``."""
from __future__ import annotations

import io
import json
import os
import subprocess
import tempfile
import sys

import pytest

import pykvcompact as pk
from pykvcompact.cli.chat import ChatApp
from pykvcompact.cli.chat_ui import PlainUI


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from tiny_model import make_tiny_gguf

    path = make_tiny_gguf(tmp_path_factory.mktemp("chatmodel") / "tiny.gguf", seed=0)
    eng = pk.Engine(path, n_ctx=4096, n_seq_max=8, n_threads=1)
    yield eng
    eng.close()


def run_app(engine, lines, tmp_path, **policy):
    out = io.StringIO()
    feed = iter(lines)

    def read(prompt):
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    app = ChatApp(engine, pk.Policy(**policy), system="You are terse.", ui=PlainUI(out), read=read,
                  history_dir=str(tmp_path), max_tokens=6, sampling={"temperature": 0.0})
    assert app.run() == 0
    return app, out.getvalue()


def test_chat_streams_replies_and_runs_commands(engine, tmp_path):
    save = tmp_path / "chat.json"
    app, out = run_app(engine, ["Hello there", "/status", "/mode hard", "/rubric math", "Again", f"/save {save}",
                                "/nope", "/quit", "never read"], tmp_path, window=1024)
    assert app.session.transcript[-1]["role"] == "assistant"
    status = json.loads(out[out.index("{"):out.index("}") + 1])
    assert status["mode"] == "background" and 0 < status["fill"] < 1 and status["offload_path"]
    assert status["tokens_per_s"] > 0
    assert "mode hard; 2 messages carried over" in out and "rubric math" in out
    assert app.policy.mode == "hard" and app.policy.rubric == "math"
    saved = json.loads(save.read_text())
    assert [m["content"] for m in saved["transcript"] if m["role"] == "user"] == ["Hello there", "Again"]
    assert "unknown command /nope" in out
    assert engine.stats()["live_sequences"] == 0  # the chat closed its session on /quit


def test_bad_command_arguments_do_not_end_the_chat(engine, tmp_path):
    app, out = run_app(engine, ["/mode sideways", "/rubric", "/save", "Still here?"], tmp_path, window=1024)
    assert out.count("error:") == 3
    assert app.session.transcript[-1]["role"] == "assistant"


def test_compact_command(engine, tmp_path):
    app, out = run_app(engine, ["Hi", "/compact"], tmp_path, window=1024, summary_max_tokens=32, mode="hard")
    assert "nothing to compact yet" in out
    fillers = [" ".join(f"fact {i} is {i * 7}." for i in range(k * 12, k * 12 + 12)) for k in range(5)]
    app, out = run_app(engine, fillers + ["/compact keep the facts"], tmp_path, window=1024,
                       summary_max_tokens=32, mode="hard")
    assert "compacted: swap" in out
    assert [e.trigger for e in app.session.events if e.name == "rebased"][-1] == "manual"


def _cli(*args, stdin=None, timeout=300):
    env = dict(os.environ, PYKVCOMPACT_PROGRESS="0")
    # from outside the checkout: its pykvcompact/ source tree would shadow the installed package
    return subprocess.run([sys.executable, "-m", "pykvcompact", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=tempfile.gettempdir())


def test_chat_command_through_stdin(engine, tmp_path):
    r = _cli("chat", "--model", str(engine.model_path), "--n-ctx", "4096", "--max-tokens", "4", "--threads", "1",
             "--history-dir", str(tmp_path), stdin="Hi\n/status\n/quit\n")
    assert r.returncode == 0, r.stderr
    assert '"fill"' in r.stdout and "window" in r.stdout


def test_models_json_and_one_line_errors(tmp_path):
    r = _cli("models", "--json")
    assert r.returncode == 0 and {m["name"] for m in json.loads(r.stdout)} >= {"smollm2-135m"}
    r = _cli("--json", "models")
    assert r.returncode == 0 and isinstance(json.loads(r.stdout), list)
    missing = str(tmp_path / "missing.gguf")
    r = _cli("chat", "--model", missing)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "not found" in r.stderr
    r = _cli("chat", "--model", missing, "--debug")
    assert r.returncode != 0 and "Traceback" in r.stderr
