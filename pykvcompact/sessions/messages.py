"""Checking what callers hand the session: messages (OpenAI shape) and tool schemas."""
from __future__ import annotations

import copy
import json
import time
import uuid
from typing import List

ROLES = ("system", "user", "assistant", "tool")
SESSION_KEYS = ("summary", "pinned")  # the session's own message fields, never rendered


class ContextWindowError(ValueError):
    """A message (or the system prompt) cannot fit in the session's window even after compaction."""


def view_of(msg: dict) -> dict:
    """What the chat template sees of a message (the session's own fields removed)."""
    return {k: v for k, v in msg.items() if k not in SESSION_KEYS}


def normalize_messages(x) -> List[dict]:
    if isinstance(x, str):
        return [{"role": "user", "content": x}]
    if isinstance(x, dict):
        x = [x]
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"messages must be a str, a message dict or a list of message dicts, got {type(x).__name__}")
    out = []
    for m in x:
        if isinstance(m, str):
            m = {"role": "user", "content": m}
        if not isinstance(m, dict):
            raise TypeError(f"each message must be a dict, got {type(m).__name__}")
        role = m.get("role")
        if role not in ROLES:
            raise ValueError(f"message role must be one of {ROLES}, got {role!r}")
        m = dict(m)
        if "pinned" in m and not isinstance(m["pinned"], bool):
            raise TypeError(f"message 'pinned' must be a bool, got {type(m['pinned']).__name__}")
        c = m.get("content")
        if isinstance(c, list):  # OpenAI content parts: keep the text parts
            parts = []
            for p in c:
                if isinstance(p, dict) and p.get("type") == "text":
                    parts.append(str(p.get("text", "")))
                elif isinstance(p, str):
                    parts.append(p)
                else:
                    raise ValueError("only text content parts are supported")
            m["content"] = "".join(parts)
        elif c is None:
            if not (role == "assistant" and m.get("tool_calls")):
                raise ValueError(f"a {role} message needs string content")
        elif not isinstance(c, str):
            raise TypeError(f"message content must be a str, got {type(c).__name__}")
        if m.get("tool_calls") is not None:
            if role != "assistant" or not isinstance(m["tool_calls"], list):
                raise ValueError("tool_calls must be a list on an assistant message")
            calls = []
            for i, tc in enumerate(m["tool_calls"]):
                if not isinstance(tc, dict):
                    raise ValueError("each tool call must be a dict")
                f = tc.get("function", tc)
                if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                    raise ValueError("each tool call needs function.name")
                args = f.get("arguments", "{}")
                if not isinstance(args, str):
                    args = json.dumps(args, ensure_ascii=False)
                calls.append({"id": tc.get("id") or f"call_{uuid.uuid4().hex[:8]}", "type": "function",
                              "function": {"name": f["name"], "arguments": args}})
            m["tool_calls"] = calls
        out.append(m)
    return out


def check_tools(tools) -> List[dict]:
    if tools is None:
        return []
    if not isinstance(tools, (list, tuple)):
        raise TypeError("tools must be a list of OpenAI tool schemas")
    out = []
    for t in tools:
        if not isinstance(t, dict):
            raise TypeError("each tool must be a dict (OpenAI tool schema)")
        f = t.get("function", t)
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise ValueError("each tool needs function.name")
        out.append(t if "function" in t else {"type": "function", "function": t})
    return out


SAMPLING = ("temperature", "top_p", "seed", "stop", "grammar")


def check_sampling(sampling: dict):
    """``(sampling without stop, stop strings as a tuple)``; an unknown argument is a TypeError."""
    sampling = dict(sampling)
    for k in sampling:
        if k not in SAMPLING:
            raise TypeError(f"unknown sampling argument {k!r}; use one of {SAMPLING}")
    stop = sampling.pop("stop", None) or ()
    return sampling, ((stop,) if isinstance(stop, str) else tuple(stop))




def completion(cid: str, model: str, content, tool_calls: list, finish: str, prompt_tokens: int,
               completion_tokens: int, fill: float) -> dict:
    """An OpenAI chat-completion dict for one reply (``tool_calls``: the calls left for the caller)."""
    msg = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = copy.deepcopy(tool_calls)
        finish = "tool_calls"
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
            "fill": fill}


__all__ = ["ContextWindowError", "check_sampling", "normalize_messages", "check_tools", "view_of", "ROLES",
           "completion"]
