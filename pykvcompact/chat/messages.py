"""Checking what callers hand the session: messages (OpenAI shape) and tool schemas."""
from __future__ import annotations

import copy
import json
import math
import numbers
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


def check_json(value, where: str) -> None:
    """``value`` is JSON data (it goes to the session log and the template) whose strings are valid
    Unicode: a lone surrogate cannot be written as UTF-8 nor tokenized."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{where} is not valid Unicode (a lone surrogate {value[e.start]!r} at "
                             f"position {e.start})") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where} has a non-string key {k!r}")
            check_json(k, f"{where} key {k!r}")
            check_json(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_json(v, f"{where}[{i}]")
    elif value is not None and not isinstance(value, (bool, int, float)):
        raise TypeError(f"{where} must be JSON data (str, number, bool, None, list, dict), "
                        f"got {type(value).__name__}")


def normalize_messages(x) -> List[dict]:
    if isinstance(x, str):
        check_json(x, "the message")
        return [{"role": "user", "content": x}]
    if isinstance(x, dict):
        x = [x]
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"messages must be a str, a message dict or a list of message dicts, got {type(x).__name__}")
    out = []
    for k, m in enumerate(x):
        if isinstance(m, str):
            m = {"role": "user", "content": m}
        if not isinstance(m, dict):
            raise TypeError(f"each message must be a dict, got {type(m).__name__}")
        role = m.get("role")
        if role not in ROLES:
            raise ValueError(f"message role must be one of {ROLES}, got {role!r}")
        check_json(m, f"message {k}")
        m = dict(m)
        if "pinned" in m and not isinstance(m["pinned"], bool):
            raise TypeError(f"message 'pinned' must be a bool, got {type(m['pinned']).__name__}")
        if m.get("summary"):  # the session's mark of its own summaries: one from a caller would be lost
            raise ValueError("message 'summary' is set by the session on the summaries it writes; a caller's "
                             "message cannot carry it")
        for key in ("tool_call_id", "name"):
            if m.get(key) is not None and not isinstance(m[key], str):
                raise TypeError(f"message {key!r} must be a str, got {type(m[key]).__name__}")
        c = m.get("content")
        if isinstance(c, list):  # OpenAI content parts: keep the text parts
            parts = []
            for p in c:
                if isinstance(p, dict) and p.get("type") == "text":
                    if not isinstance(p.get("text"), str):
                        raise TypeError("a text content part needs a str 'text'")
                    parts.append(p["text"])
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
                if tc.get("id") is not None and not isinstance(tc["id"], str):
                    raise TypeError(f"a tool call id must be a str, got {type(tc['id']).__name__}")
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
    check_json(list(tools), "tools")
    out = []
    for t in tools:
        if not isinstance(t, dict):
            raise TypeError("each tool must be a dict (OpenAI tool schema)")
        f = t.get("function", t)
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise ValueError("each tool needs function.name")
        out.append(t if "function" in t else {"type": "function", "function": t})
    return out


SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "grammar")


def check_sampling(sampling: dict):
    """``(sampling without stop, stop strings as a tuple)``; an unknown argument is a TypeError."""
    sampling = dict(sampling)
    for k in sampling:
        if k not in SAMPLING:
            raise TypeError(f"unknown sampling argument {k!r}; use one of {SAMPLING}")
    stop = sampling.pop("stop", None) or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(x, str) for x in stop):
        raise TypeError(f"stop must be a str or a list of str, got {stop!r}")
    check_json(list(stop), "stop")
    seed = sampling.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2 ** 64):
        raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
    # checked here, before the call's messages are added: the engine would refuse them only at the reply
    for name, ok, want in (("temperature", lambda x: 0 <= x < math.inf, "a finite number >= 0"),
                           ("top_p", lambda x: 0 < x <= 1, "a number in (0, 1]"),
                           ("min_p", lambda x: 0 <= x < 1, "a number in [0, 1) (0: off)")):
        if name in sampling:
            x = sampling[name]
            if isinstance(x, bool) or not isinstance(x, numbers.Real):
                raise TypeError(f"{name} must be {want}, got {x!r}")
            if not ok(float(x) if abs(x) < 1e300 else math.inf):
                raise ValueError(f"{name} must be {want}, got {x!r}")
    if "top_k" in sampling:
        k = sampling["top_k"]
        if isinstance(k, bool) or not isinstance(k, numbers.Integral):
            raise TypeError(f"top_k must be an integer >= 0 (0: off), got {k!r}")
        if k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0: off), got {k!r}")
    return sampling, tuple(stop)


def check_tool_results(msgs: List[dict], live: List[dict]) -> None:
    """A tool result answers a call: it follows the assistant message that made the call (or other results
    of it), and its ``tool_call_id``, when given, is the id of one of that message's calls.  ``live``: the
    messages before ``msgs``."""
    calls = None  # ids of the calls a tool result here may answer (None: no call)
    for m in reversed(live):
        if m.get("role") == "tool":
            continue
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [c.get("id") for c in m["tool_calls"]]
        break
    for k, m in enumerate(msgs):
        if m["role"] == "tool":
            if calls is None:
                raise ValueError(f"message {k}: a tool result must follow the assistant message with the tool "
                                 "call it answers (or another result of that message)")
            tid = m.get("tool_call_id")
            if tid and tid not in calls:
                raise ValueError(f"message {k}: tool_call_id {tid!r} answers no call of the assistant message "
                                 f"before it (its call ids: {calls})")
        elif m["role"] == "assistant" and m.get("tool_calls"):
            calls = [c["id"] for c in m["tool_calls"]]
        else:
            calls = None




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
           "completion", "check_json", "check_tool_results"]
