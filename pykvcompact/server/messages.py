"""Client messages as the session takes them, and the keys that recognise a conversation.

Clients resend the whole conversation on every request. A conversation is recognised when the
messages we have seen (including the replies we gave) are a prefix of the new request; the key of a
message ignores what clients add or regenerate (ids, ``refusal``, whitespace around the content)."""
from __future__ import annotations

import json
from typing import List, Sequence, Tuple

from .schemas import Message


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content)
    return content


def _args(arguments) -> str:
    if isinstance(arguments, dict):
        return json.dumps(arguments, ensure_ascii=False)
    return arguments


def to_session_message(m: Message) -> dict:
    """A plain dict with only what the session and the chat template use."""
    role = "system" if m.role == "developer" else m.role
    out = {"role": role, "content": _text(m.content) if m.content is not None else None}
    if m.tool_calls:
        out["tool_calls"] = [{"id": tc.id, "type": "function",
                              "function": {"name": tc.function.name, "arguments": _args(tc.function.arguments)}}
                             for tc in m.tool_calls]
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.name:
        out["name"] = m.name
    return out


def _canonical_args(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(arguments).strip()


def message_key(m: dict) -> Tuple:
    calls = tuple((c["function"]["name"], _canonical_args(c["function"]["arguments"]))
                  for c in (m.get("tool_calls") or ()))
    return (m["role"], (m.get("content") or "").strip(), calls)


def keys_of(messages: Sequence[dict]) -> List[Tuple]:
    return [message_key(m) for m in messages]


def is_prefix(prefix: Sequence[Tuple], keys: Sequence[Tuple]) -> bool:
    return len(prefix) <= len(keys) and list(keys[:len(prefix)]) == list(prefix)
