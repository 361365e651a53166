"""Parse tool calls out of model output.

Forms understood:

- Qwen2.5 / Hermes: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (one or more; a last one
  left unclosed at the end of the output is accepted);
- plain JSON: the whole output (optionally in a ```json fence) is ``{"name": ..., "arguments": ...}``
  (also ``"parameters"``), ``{"function": {...}}``, ``{"tool_calls": [...]}``, or a list of those.

Calls come back in OpenAI shape: ``{"id", "type": "function", "function": {"name", "arguments": <JSON
string>}}``.  When ``tools`` are given only calls to those names count (a model echoing arbitrary JSON is
not calling a tool).
"""
from __future__ import annotations

import itertools
import json
import re
from typing import List, Optional, Sequence, Tuple

_TAG_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_FENCE_RE = re.compile(r"^\s*```(?:json|JSON)?\s*\n?(.*?)\n?\s*```\s*$", re.S)
_ids = itertools.count()


def tool_names(tools: Optional[Sequence[dict]]) -> Optional[set]:
    if not tools:
        return None
    out = set()
    for t in tools:
        f = t.get("function", t) if isinstance(t, dict) else {}
        if isinstance(f, dict) and f.get("name"):
            out.add(f["name"])
    return out


def _loads(s: str, strict: bool = False):
    s = s.strip()
    try:
        return json.loads(s)
    except ValueError:
        if strict:
            return None
    # tolerate trailing junk after a complete object (e.g. a stray "}" or text)
    dec = json.JSONDecoder()
    try:
        obj, _ = dec.raw_decode(s)
        return obj
    except ValueError:
        return None


def _as_call(obj, names: Optional[set]) -> Optional[dict]:
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    if names is not None and name not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        parsed = _loads(args)
        args_s = json.dumps(parsed, ensure_ascii=False) if isinstance(parsed, dict) else (args.strip() or "{}")
    elif args is None:
        args_s = "{}"
    else:
        args_s = json.dumps(args, ensure_ascii=False)
    return {"id": f"call_{next(_ids)}", "type": "function", "function": {"name": name, "arguments": args_s}}


def _calls_from(obj, names) -> List[dict]:
    if isinstance(obj, dict) and isinstance(obj.get("tool_calls"), list):
        obj = obj["tool_calls"]
    items = obj if isinstance(obj, list) else [obj]
    calls = [_as_call(o, names) for o in items]
    if not calls or any(c is None for c in calls):
        return []
    return calls


def parse_tool_calls(text: str, tools: Optional[Sequence[dict]] = None) -> Tuple[Optional[str], List[dict]]:
    """``(content, tool_calls)``: ``content`` is the text outside the calls (``None`` when empty)."""
    if not text:
        return text, []
    names = tool_names(tools)
    if "<tool_call>" in text:
        calls, spans = [], []
        for m in _TAG_RE.finditer(text):
            obj = _loads(m.group(1))
            got = _calls_from(obj, names) if obj is not None else []
            if got:
                calls.extend(got)
                spans.append((m.start(), m.end()))
        if calls:
            rest, pos = [], 0
            for a, b in spans:
                rest.append(text[pos:a])
                pos = b
            rest.append(text[pos:])
            content = "".join(rest).strip()
            return (content or None), calls
        return text, []
    body = text.strip()
    fm = _FENCE_RE.match(body)
    if fm:
        body = fm.group(1).strip()
    if body[:1] in "{[":
        obj = _loads(body, strict=True)
        if obj is not None:
            calls = _calls_from(obj, names)
            if calls:
                return None, calls
    return text, []


__all__ = ["parse_tool_calls", "tool_names"]
