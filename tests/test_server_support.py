"""Helpers shared by the server tests (no tests here): a server on a free loopback port, the official
OpenAI client, and conversations driven through it."""
from __future__ import annotations

import contextlib
from typing import List

import openai

from pykvcompact.server import ServerConfig, ServerThread

API_KEY = "test-key"


@contextlib.contextmanager
def running_server(engine, tmp_path, **config):
    config.setdefault("window", 1024)
    config.setdefault("summary_max_tokens", 48)
    cfg = ServerConfig(model=getattr(engine, "model_name", "local"), host="127.0.0.1", port=0,
                       n_ctx=engine.n_ctx, history_dir=str(tmp_path), api_key=API_KEY, **config)
    with ServerThread(cfg, engine) as srv:
        yield srv


def client(srv, api_key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key=api_key, max_retries=0, timeout=600)


def converse(c: openai.OpenAI, questions: List[str], *, session: str, max_tokens: int = 16,
             system: str = "You are concise.") -> List[str]:
    """A conversation, one user turn at a time, greedy; the replies."""
    msgs = [{"role": "system", "content": system}]
    out = []
    for q in questions:
        msgs.append({"role": "user", "content": q})
        r = c.chat.completions.create(model="local", messages=msgs, max_tokens=max_tokens, temperature=0,
                                      user=session)
        out.append(r.choices[0].message.content)
        msgs.append({"role": "assistant", "content": out[-1]})
    return out


def test_the_session_steps_and_tools_in_effect_are_public(tmp_path):
    """What the server needs of a Session is public: a plain reply that can be stopped after any chunk
    (``steps``, yielding ``CHUNK_DONE``) and the tools the context renders (``tools_in_effect``)."""
    import pykvcompact as pk
    from fake_engine import FakeEngine

    s = pk.Session(FakeEngine(n_ctx=4096), system="s", history_dir=tmp_path,
                   policy=pk.Policy(mode="hard", window=2048, compact_tool=True))
    names = [t["function"]["name"] for t in s.tools_in_effect]
    assert "compact_conversation" in names
    s.tools_in_effect.clear()                      # a copy: the session's own list is untouched
    assert s.tools_in_effect
    items = list(s.steps("Hello there", max_tokens=8))
    assert pk.CHUNK_DONE in items and s.last_response["choices"][0]["message"]["role"] == "assistant"
    n = len(s.transcript)
    it = s.steps("Again", max_tokens=64)
    next(x for x in it if x is pk.CHUNK_DONE)      # the first chunk, then the caller stops
    it.close()
    assert len(s.transcript) == n + 2 and s.transcript[-1]["role"] == "assistant"
    s.close()
