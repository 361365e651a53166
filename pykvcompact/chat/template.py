"""Chat templates: render OpenAI-shaped messages with the model's own Jinja template.

The template comes from the GGUF metadata (``tokenizer.chat_template``) and is rendered the way
llama-cpp-python renders it (an immutable sandboxed Jinja environment with ``trim_blocks`` and
``lstrip_blocks``, ``raise_exception``, ``strftime_now``, ``bos_token``/``eos_token``, ``tools``), with
``tojson`` as Hugging Face defines it (``json.dumps``, no HTML escaping) so that tool schemas render as the
model saw them in training.  When there is no template, or it fails on a representative conversation, a
ChatML template is used (with Hermes/Qwen-style ``<tools>`` in the system message).

When the model's template ignores ``tools`` (SmolLM2's does), the tool definitions are written into the
system message in the Hermes format so that the model still sees them.

Incremental rendering (used by the session): ``render(messages[:k])`` is, for ChatML-like templates, a
prefix of ``render(messages[:k+1])``; the session appends only the difference.  ``is_safe_cut`` says
whether a cut of the rendered text at a position also is a cut of its tokens (it is next to a special
token such as ``<|im_start|>``, so tokenizing the two sides apart gives the same tokens as tokenizing
the whole).
"""
from __future__ import annotations

import datetime
import json
import re
from typing import List, Optional, Sequence

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] %}{{- message['content'] }}{%- endif %}"
    "{%- if message.get('tool_calls') %}"
    "{%- for tc in message['tool_calls'] %}"
    "{%- set f = tc['function'] if tc.get('function') else tc %}"
    "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' }}"
    "{%- if f['arguments'] is string %}{{- f['arguments'] }}{%- else %}{{- f['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>"
)
DEFAULT_SYSTEM = "You are a helpful assistant."

# text of control tokens that tokenizers treat as special (a cut next to one is a token boundary)
SPECIAL_RE = re.compile(r"<\|[^<>|\s]{1,48}\|>|</?s>|\[/?INST\]|<(?:start|end)_of_turn>|<\|?(?:eot_id|eom_id)\|?>")

_SAMPLE = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "call_0", "type": "function",
                     "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
    {"role": "tool", "tool_call_id": "call_0", "name": "f", "content": "R"},
    {"role": "assistant", "content": "A"},
    {"role": "user", "content": "U2"},
]


def _with_dict_arguments(tc: dict) -> dict:
    """OpenAI tool calls carry ``arguments`` as a JSON string; templates (Qwen's, Hermes') expect a dict."""
    tc = dict(tc)
    f = dict(tc.get("function") or {})
    args = f.get("arguments")
    if isinstance(args, str):
        try:
            f["arguments"] = json.loads(args) if args.strip() else {}
        except ValueError:
            pass
    if "function" in tc:
        tc["function"] = f
    return tc


def format_tool_call(tc: dict) -> str:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes / Qwen2.5 form)."""
    f = _with_dict_arguments(tc).get("function") or tc
    args = f.get("arguments", {})
    return ("<tool_call>\n{\"name\": \"" + str(f.get("name", "")) + "\", \"arguments\": "
            + (args if isinstance(args, str) else _tojson(args)) + "}\n</tool_call>")


def _tojson(x, indent=None, ensure_ascii=False, separators=None, sort_keys=False):
    return json.dumps(x, indent=indent, ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys)


def _raise(msg):
    raise TemplateError(msg)


class TemplateError(ValueError):
    pass


def tools_block(tools: Sequence[dict]) -> str:
    return TOOLS_HEADER + "".join("\n" + _tojson(t) for t in tools) + TOOLS_FOOTER


def _compile(source: str):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(source)


class ChatTemplate:
    """A compiled chat template.

    ``ChatTemplate(source=None)`` is ChatML.  ``ChatTemplate.from_engine(engine)`` uses the model's template
    (``engine.chat_template``) and falls back to ChatML when it is missing or fails on a representative
    conversation (``self.fallback_reason`` says why).
    """

    def __init__(self, source: Optional[str] = None, *, bos_token: str = "", eos_token: str = "",
                 inject_tools: Optional[bool] = None, check: bool = True):
        self.fallback_reason: Optional[str] = None
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""
        self._inject_arg = inject_tools
        if source:
            try:
                self._use(source, chatml=False)
                if check:
                    self.render(_SAMPLE, None, True)
                    self.render(_SAMPLE[:2], [{"type": "function", "function": {"name": "f"}}], True)
            except Exception as e:  # a template we cannot render: ChatML for the whole session
                self.fallback_reason = f"{type(e).__name__}: {e}"
                source = None
        if not source:
            self._use(CHATML_TEMPLATE, chatml=True)

    def _use(self, source: str, chatml: bool):
        self._tpl = _compile(source)
        self.source = source
        self.is_chatml = chatml
        self.handles_tool_calls = chatml or "tool_calls" in source
        self.inject_tools = (chatml or "tools" not in source) if self._inject_arg is None else bool(self._inject_arg)

    @classmethod
    def from_engine(cls, engine, **kw) -> "ChatTemplate":
        src = getattr(engine, "chat_template", None)

        def piece(tok):
            try:
                return engine.token_to_piece(tok) if tok is not None and tok >= 0 else ""
            except Exception:
                return ""
        return cls(src, bos_token=piece(getattr(engine, "token_bos", -1)),
                   eos_token=piece(getattr(engine, "token_eos", -1)), **kw)

    # ------------------------------------------------------------------ rendering
    def _render_raw(self, messages, tools, add_generation_prompt) -> str:
        return self._tpl.render(messages=list(messages), tools=tools or None,
                                add_generation_prompt=add_generation_prompt,
                                bos_token=self.bos_token, eos_token=self.eos_token,
                                functions=None, function_call=None, tool_choice=None)

    def prepare(self, messages: Sequence[dict], tools: Optional[Sequence[dict]] = None) -> List[dict]:
        """Messages as the template will see them: tool definitions injected into the system message when
        the template would ignore them; ``None`` content as ``""`` (templates concatenate strings)."""
        msgs = [dict(m) for m in messages]
        for m in msgs:
            if m.get("content") is None:
                m["content"] = ""
            if m.get("tool_calls"):
                if self.handles_tool_calls:
                    m["tool_calls"] = [_with_dict_arguments(tc) for tc in m["tool_calls"]]
                else:  # the template would drop the calls: write them into the content (Hermes form)
                    calls = "\n".join(format_tool_call(tc) for tc in m["tool_calls"])
                    m["content"] = (m["content"] + "\n" + calls) if m["content"] else calls
                    del m["tool_calls"]
        if tools and self.inject_tools:
            block = tools_block(tools)
            if msgs and msgs[0].get("role") == "system":
                msgs[0]["content"] = (msgs[0]["content"] + "\n\n" + block) if msgs[0]["content"] else block
            else:
                msgs.insert(0, {"role": "system", "content": DEFAULT_SYSTEM + "\n\n" + block})
        return msgs

    def render(self, messages: Sequence[dict], tools: Optional[Sequence[dict]] = None,
               add_generation_prompt: bool = False) -> str:
        """The rendered text of ``messages``; ``""`` for no messages at all."""
        if not messages:
            return ""
        msgs = self.prepare(messages, tools)
        return self._render_raw(msgs, None if self.inject_tools else (list(tools) if tools else None),
                                add_generation_prompt)

    __call__ = render


def common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n
    while lo < hi:  # largest k with a[:k] == b[:k]
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def is_safe_cut(text: str, pos: int, special_re=SPECIAL_RE) -> bool:
    """Is ``pos`` in ``text`` a token boundary whatever the tokenizer (next to a special token)?"""
    if pos <= 0 or pos >= len(text):
        return True
    for m in special_re.finditer(text, max(0, pos - 64), min(len(text), pos + 64)):
        if m.end() == pos or m.start() == pos:
            return True
    return False


__all__ = ["ChatTemplate", "CHATML_TEMPLATE", "TemplateError", "tools_block", "common_prefix_len",
           "is_safe_cut", "SPECIAL_RE"]


def read_gguf_metadata(path, keys=None) -> dict:
    """Key/value metadata from the head of a GGUF file (or the first part of a split one) without mapping
    the tensors: ``read_gguf_metadata(path, {"tokenizer.chat_template"})``. Token arrays are skipped
    unless asked for."""
    import struct

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    with open(path, "rb") as f:
        def rd(fmt):
            n = struct.calcsize(fmt)
            return struct.unpack("<" + fmt, f.read(n))[0]

        def rstr():
            return f.read(rd("Q")).decode("utf-8", "replace")

        def rval(t, keep=True):
            if t in scalar:
                return rd(scalar[t])
            if t == 8:
                return rstr()
            if t == 9:
                et, n = rd("I"), rd("Q")
                if not keep and et in scalar:
                    f.seek(n * struct.calcsize(scalar[et]), 1)
                    return None
                return [rval(et, keep) for _ in range(n)]
            raise ValueError(f"bad GGUF value type {t}")

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        rd("I")
        rd("Q")
        nkv = rd("Q")
        out = {}
        for _ in range(nkv):
            k = rstr()
            t = rd("I")
            want = keys is None or k in keys
            v = rval(t, keep=want and (keys is not None or t != 9))
            if want:
                out[k] = v
        return out
