"""Checks of the Session's arguments: a clear TypeError or ValueError before anything is built or changed."""
from __future__ import annotations

import json
import math
import numbers
import uuid
from typing import Optional, Sequence

from ..chat.messages import check_json
from .tools import SESSION_TOOLS
from ..compaction.policy import Policy
from ..engine.port import check_engine


def check_arguments(engine, policy: Optional[Policy], system: Optional[str], recall_tokens: Optional[int]) -> Policy:
    """The policy to use (``Policy()`` for None); raises on a bad engine, policy, system prompt or recall
    budget."""
    policy = Policy() if policy is None else policy
    if recall_tokens is not None and (not isinstance(recall_tokens, int) or isinstance(recall_tokens, bool)
                                      or recall_tokens < 0):
        raise ValueError(f"recall_tokens must be an int >= 0 or None, got {recall_tokens!r}")
    if not isinstance(policy, Policy):
        raise TypeError("policy must be a pykvcompact.Policy")
    if system is not None and not isinstance(system, str):
        raise TypeError("system must be a str")
    check_json(system, "system")
    check_engine(engine)
    return policy


def check_labels(labels: Sequence[str]) -> tuple:
    """The probe's labels as a tuple; raises unless they are at least two distinct non-empty strings."""
    if isinstance(labels, str) or not isinstance(labels, (list, tuple)) or len(labels) < 2 or \
            not all(isinstance(x, str) and x for x in labels) or len(set(labels)) != len(labels):
        raise ValueError(f"labels must be a list of at least two distinct non-empty strings, got {labels!r}")
    check_json(list(labels), "labels")
    return tuple(labels)


def check_seconds(seconds) -> float:
    """``Session.idle``'s wait as a float (an int too large for one: as long as it takes)."""
    if not isinstance(seconds, numbers.Real) or isinstance(seconds, bool) or not seconds >= 0:
        raise ValueError(f"seconds must be a number >= 0, got {seconds!r}")
    try:
        return float(seconds)
    except OverflowError:
        return math.inf


def session_tool_call(name: str, arguments: Optional[dict]) -> dict:
    """The assistant's tool call that ``Session.call_tool(name, arguments)`` stands for; raises unless
    ``name`` is a tool the session runs and ``arguments`` a JSON-safe dict (or None)."""
    if name not in SESSION_TOOLS:
        raise ValueError(f"the session only runs {' and '.join(map(repr, SESSION_TOOLS))}; other tools "
                         "belong to the caller")
    if arguments is not None and not isinstance(arguments, dict):
        raise TypeError(f"arguments must be a dict, got {type(arguments).__name__}")
    check_json(arguments, "arguments")
    return {"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments or {})}}


__all__ = ["check_arguments", "check_labels", "check_seconds", "session_tool_call"]
