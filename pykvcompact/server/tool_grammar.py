"""GBNF grammars that force a tool call (``tool_choice: "required"`` or a named function).

The call is written the way the chat template shows calls to the model (Hermes / Qwen2.5 form):
``<tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>``.  Arguments follow the function's
JSON schema when it is a flat object of simple types (the properties in order); otherwise any flat
JSON object.  Strings and numbers are bounded so a call always ends within a few dozen tokens."""
from __future__ import annotations

import json
from typing import List, Sequence

_COMMON = r'''
str ::= "\"" [^"\\\n]{0,48} "\""
num ::= "-"? [0-9]{1,12} ("." [0-9]{1,6})?
int ::= "-"? [0-9]{1,12}
bool ::= "true" | "false"
scalar ::= str | num | bool | "null"
flatobj ::= "{" ( str ": " scalar ( ", " str ": " scalar ){0,7} )? "}"
'''

_TYPES = {"string": "str", "number": "num", "integer": "int", "boolean": "bool"}


def _lit(s: str) -> str:
    return json.dumps(s)  # a GBNF string literal: JSON escaping is what GBNF accepts


def _types(schema: dict) -> list:
    t = schema.get("type")
    return [x for x in t if isinstance(x, str)] if isinstance(t, list) else [t]


def _value_rule(schema: dict) -> str:
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return "(" + " | ".join(_lit(json.dumps(v)) for v in schema["enum"]) + ")"
    types = _types(schema)
    if len(types) > 1:  # a union (``["string", "null"]``): any of its simple types, else any JSON scalar
        if all(t in _TYPES or t == "null" for t in types):
            return "(" + " | ".join(_TYPES.get(t, '"null"') for t in types) + ")"
        return "scalar"
    return _TYPES.get(types[0] if types else None, "scalar")


def _args_rule(parameters) -> str:
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        return "flatobj"
    props = parameters.get("properties") or {}
    if not props:
        return _lit("{}")
    if not isinstance(props, dict) or any(not isinstance(p, dict) or {"object", "array"} & set(_types(p))
                                          for p in props.values()):
        return "flatobj"
    required = parameters.get("required")
    if not isinstance(required, list):
        required = None
    names = [n for n in (required or list(props)) if isinstance(n, str) and n in props] or list(props)
    parts = []
    for i, n in enumerate(names):
        key = ("" if i == 0 else ", ") + json.dumps(n) + ": "
        parts.append(_lit(key) + " " + _value_rule(props[n]))
    return _lit("{") + " " + " ".join(parts) + " " + _lit("}")


def forced_call_grammar(tools: Sequence[dict], name: str) -> str:
    """``name`` is a function name, or ``"*"`` for any of ``tools``."""
    funcs: List[dict] = [t.get("function", t) for t in tools]
    if name != "*":
        funcs = [f for f in funcs if f.get("name") == name]
        if not funcs:
            raise ValueError(f"unknown tool {name!r}")
    alts = []
    for i, f in enumerate(funcs):
        head = _lit('<tool_call>\n{"name": "' + f["name"] + '", "arguments": ')
        alts.append(f"call{i} ::= {head} {_args_rule(f.get('parameters'))} {_lit(chr(125) + chr(10) + '</tool_call>')}")
    root = "root ::= " + " | ".join(f"call{i}" for i in range(len(funcs)))
    return "\n".join([root] + alts) + _COMMON
