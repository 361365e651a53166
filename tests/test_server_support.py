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
