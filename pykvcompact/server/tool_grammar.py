"""GBNF grammars that force a tool call (``tool_choice: "required"`` or a named function).

The call is written the way the chat template shows calls to the model (Hermes / Qwen2.5 form):
``<tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>``.  Arguments follow the function's
JSON schema when it is a flat object of simple types (the properties in order); otherwise any flat
JSON object.  Strings and numbers are bounded so a call always ends within a known number of tokens.

Why the bound matters: the session generates in chunks (``chunk_tokens``) and a grammar starts again from
its root at each chunk, so a forced call must be written within one chunk. With a token counter and a
budget, string lengths are cut to fit the budget (each generated token covers at least one character of a
string), and a call that cannot fit even with short strings is refused (:class:`CallTooLong`)."""
from __future__ import annotations

import json
from typing import Callable, List, Optional, Sequence

_COMMON = r'''
num ::= "-"? [0-9]{1,12} ("." [0-9]{1,6})?
int ::= "-"? [0-9]{1,12}
bool ::= "true" | "false"
'''
_TYPES = {"string": "str", "number": "num", "integer": "int", "boolean": "bool"}
_BOUND = {"num": 20, "int": 13, "bool": 5, '"null"': 4}  # characters, hence tokens at most
MAX_STRING = 48
MIN_STRING = 8     # below this a forced call is refused rather than squeezed
SAFETY = 6         # tokens kept free: the grammar may pick a longer tokenization of the literals


class CallTooLong(ValueError):
    """The forced call may not fit in one generation chunk."""


def _lit(s: str) -> str:
    return json.dumps(s)  # a GBNF string literal: JSON escaping is what GBNF accepts


def _types(schema: dict) -> list:
    t = schema.get("type")
    return [x for x in t if isinstance(x, str)] if isinstance(t, list) else [t]


class _Alt:
    """One function's call: rules named with its index, the fixed text, and its variable parts."""

    def __init__(self, i: int, f: dict):
        self.i, self.name = i, f["name"]
        self.head = '<tool_call>\n{"name": "' + self.name + '", "arguments": '
        self.fixed = self.head
        self.strings = 0      # string slots
        self.other = 0        # characters of the bounded non-string values
        self.flat = False     # arguments are any flat object (up to ``self.pairs`` pairs)
        self.pairs = 8
        self.body = self._args(f.get("parameters"))
        self.fixed += "}\n</tool_call>"

    def _value(self, schema: dict) -> str:
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            opts = [json.dumps(v) for v in schema["enum"]]
            self.other += max(len(o) for o in opts)
            return "(" + " | ".join(_lit(o) for o in opts) + ")"
        types = _types(schema)
        rules = [_TYPES.get(t, '"null"' if t == "null" else None) for t in types] if types != [None] else [None]
        if None in rules:
            rules = [f"scalar{self.i}"]
        if len(rules) > 1:
            rules = list(dict.fromkeys(rules))
        if any(r in ("str", f"scalar{self.i}") for r in rules):
            self.strings += 1
        self.other += max((_BOUND.get(r, 0) for r in rules), default=0)
        rules = [f"str{self.i}" if r == "str" else r for r in rules]
        return rules[0] if len(rules) == 1 else "(" + " | ".join(rules) + ")"

    def _flat(self) -> str:
        self.flat = True
        return f"flatobj{self.i}"

    def _flat_cost(self, pairs: int) -> None:
        self.strings, self.other = 2 * pairs, pairs * (4 + 20)  # a key and a value each; ", " ": " and a number

    def _args(self, parameters) -> str:
        if parameters is None:  # OpenAI: omitting parameters defines a function with an empty parameter list
            self.fixed += "{}"
            return _lit("{}")
        if not isinstance(parameters, dict) or "object" not in _types({"type": parameters.get("type", "object")}):
            return self._flat()
        props = parameters.get("properties") or {}
        if not props:
            self.fixed += "{}"
            return _lit("{}")
        if not isinstance(props, dict) or any(not isinstance(p, dict) or {"object", "array"} & set(_types(p))
                                              for p in props.values()):
            return self._flat()
        required = parameters.get("required")
        if not isinstance(required, list):
            required = None
        names = [n for n in (required or list(props)) if isinstance(n, str) and n in props] or list(props)
        parts = []
        for k, n in enumerate(names):
            key = ("" if k == 0 else ", ") + json.dumps(n) + ": "
            self.fixed += key
            parts.append(_lit(key) + " " + self._value(props[n]))
        self.fixed += "{}"
        return _lit("{") + " " + " ".join(parts) + " " + _lit("}")

    def rules(self, max_string: int) -> List[str]:
        i = self.i
        return [
            f"call{i} ::= {_lit(self.head)} {self.body} {_lit(chr(125) + chr(10) + '</tool_call>')}",
            # no control characters: they are invalid unescaped in JSON (the call would not parse)
            f'str{i} ::= "\\"" [^"\\\\\\x00-\\x1f]{{0,{max_string}}} "\\""',
            f'scalar{i} ::= str{i} | num | bool | "null"',
            f'flatobj{i} ::= "{{" ( str{i} ": " scalar{i} ( ", " str{i} ": " scalar{i} ){{0,{self.pairs - 1}}} )? "}}"',
        ]

    def string_cap(self, budget: Optional[int], count: Optional[Callable[[str], int]]) -> int:
        if not self.flat:
            return self._cap(budget, count)
        for pairs in range(8, 0, -1):  # as many pairs as fit with strings of MIN_STRING or more
            self.pairs = pairs
            self._flat_cost(pairs)
            try:
                return self._cap(budget, count)
            except CallTooLong:
                if pairs == 1:
                    raise
        raise AssertionError("unreachable")

    def _cap(self, budget: Optional[int], count: Optional[Callable[[str], int]]) -> int:
        if budget is None or count is None:
            return MAX_STRING
        left = budget - SAFETY - count(self.fixed) - self.other
        cap = MAX_STRING if not self.strings else min(MAX_STRING, left // self.strings - 2)
        if left < 0 or cap < MIN_STRING:
            raise CallTooLong(
                f"a forced call to {self.name!r} may take more than the {budget} tokens the server generates "
                f"in one step ({count(self.fixed)} tokens of names and punctuation, {self.strings} strings, "
                f"{self.other} characters of other values); a forced call must fit in one step: use fewer or "
                "shorter properties, tool_choice 'auto', or start the server with a larger chunk_tokens")
        return cap


def forced_call_grammar(tools: Sequence[dict], name: str, budget: Optional[int] = None,
                        count: Optional[Callable[[str], int]] = None) -> str:
    """``name`` is a function name, or ``"*"`` for any of ``tools``. With ``budget`` (tokens) and
    ``count`` (text -> tokens), the call is bounded to fit the budget (see the module docstring)."""
    funcs: List[dict] = [t.get("function", t) for t in tools]
    if name != "*":
        funcs = [f for f in funcs if f.get("name") == name]
        if not funcs:
            raise ValueError(f"unknown tool {name!r}")
    lines = []
    for i, f in enumerate(funcs):
        alt = _Alt(i, f)
        lines += alt.rules(alt.string_cap(budget, count))
    root = "root ::= " + " | ".join(f"call{i}" for i in range(len(funcs)))
    return "\n".join([root] + lines) + _COMMON
