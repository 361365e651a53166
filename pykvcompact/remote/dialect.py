"""Which OpenAI-compatible server this is, and the few request fields that differ between them.

Every server here speaks ``/v1/completions`` with a raw prompt string, ``max_tokens``, ``temperature``,
``top_p``, ``seed``, ``logprobs`` and ``stream``.  They differ in their extras:

==================  ============================  =============================  =======================
dialect             tokenize / detokenize          grammar field                  detected by
==================  ============================  =============================  =======================
llama-server        ``/tokenize``, ``/detokenize``  ``grammar``                    ``GET /props``
vllm (and SGLang)   ``/tokenize``, ``/detokenize``  ``guided_grammar``             ``GET /version``
llama-cpp-python    ``/extras/tokenize``, ...       ``grammar``                    ``POST /extras/tokenize``
openai              none (a local tokenizer)        none                           otherwise
==================  ============================  =============================  =======================
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from .errors import RemoteConnectionError, RemoteError, RemoteHTTPError, RemoteTimeoutError

DIALECTS = ("llama-server", "vllm", "llama-cpp-python", "openai")


@dataclass
class ServerInfo:
    dialect: str
    n_ctx: Optional[int] = None            # the server's context per request, when it says
    chat_template: Optional[str] = None    # llama-server's /props has it
    models: List[str] = field(default_factory=list)


def _try(f):
    try:
        return f()
    except (RemoteConnectionError, RemoteTimeoutError):
        raise  # the server is not there: say so, not "unknown dialect"
    except RemoteHTTPError as e:
        if e.status in (401, 403):
            raise  # a wrong or missing api_key: say so, not "unknown dialect" (or a wrong one)
        return None
    except RemoteError:
        return None


def detect(http, model: str, dialect: Optional[str] = None) -> ServerInfo:
    """Ask the server what it is (at most four small requests, once); ``dialect`` skips the guessing."""
    if dialect is not None and dialect not in DIALECTS:
        raise ValueError(f"server must be one of {DIALECTS}, got {dialect!r}")
    info = ServerInfo(dialect or "openai")
    models = _try(lambda: http.get("/v1/models", timeout=10.0))
    if isinstance(models, dict):
        for m in models.get("data") or []:
            if isinstance(m, dict):
                info.models.append(str(m.get("id")))
                if m.get("max_model_len") and (m.get("id") == model or info.n_ctx is None):
                    info.n_ctx = int(m["max_model_len"])  # vLLM
    if dialect in (None, "llama-server"):
        props = _try(lambda: http.get("/props", timeout=10.0))
        if isinstance(props, dict) and ("default_generation_settings" in props or "chat_template" in props):
            info.dialect = "llama-server"
            info.chat_template = props.get("chat_template") or None
            gen = props.get("default_generation_settings") or {}
            n = gen.get("n_ctx") or props.get("n_ctx")
            if n:
                info.n_ctx = int(n)
            return info
    if dialect in (None, "vllm"):
        ver = _try(lambda: http.get("/version", timeout=10.0))
        if isinstance(ver, dict) and "version" in ver:
            info.dialect = "vllm"
            return info
    if dialect in (None, "llama-cpp-python"):
        tok = _try(lambda: http.post("/extras/tokenize", {"input": "a", "model": model}, timeout=30.0))
        if isinstance(tok, dict) and "tokens" in tok:
            info.dialect = "llama-cpp-python"
            return info
    return info


def completion_extras(dialect: str, *, grammar: Optional[str] = None, cache_prompt: Optional[bool] = None) -> dict:
    """Fields beyond the OpenAI ones, for this dialect.  Sampling is plain (no repeat penalty: the local
    engine has none, and llama-cpp-python's default of 1.1 would make its greedy text differ)."""
    out: dict = {}
    if dialect == "llama-cpp-python":
        out["repeat_penalty"] = 1.0
    if dialect == "llama-server":
        out["repeat_penalty"] = 1.0
        out["cache_prompt"] = True if cache_prompt is None else bool(cache_prompt)
    elif cache_prompt is not None:
        out["cache_prompt"] = bool(cache_prompt)  # ignored by servers that do not know it
    if grammar:
        if dialect in ("llama-server", "llama-cpp-python"):
            out["grammar"] = grammar
        elif dialect == "vllm":
            out["guided_grammar"] = grammar
        else:
            from ..errors import UnsupportedOperationError
            raise UnsupportedOperationError("this server takes no GBNF grammar (a llama.cpp or vLLM server does)")
    return out


__all__ = ["ServerInfo", "detect", "completion_extras", "DIALECTS"]
