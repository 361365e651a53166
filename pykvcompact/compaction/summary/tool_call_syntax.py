"""Tool-call syntax in text a model wrote: the tags that open a call (Qwen/Hermes, Mistral, Llama) and a
check for any call syntax in a summary or a message.

A module of its own because three modules read it, one of which (``attempt.py``) the summarizer imports:
an attempt's summary that reads like a call failed (``attempt.py``), a message that is a call is left out
of the fallback summary (``fallback.py``), a reply that opens as a call is not listed as a statement
(``results.py``).
"""
from __future__ import annotations

import re

CALL_TAGS = r"<tool_call>|\[TOOL_CALLS\]|<\|python_tag\|>"   # what opens a call (Qwen/Hermes, Mistral, Llama)
_TOOL_CALL_RE = re.compile(CALL_TAGS + r"|</tool_call>|\{\s*\"name\"\s*:|\"arguments\"\s*:|compact_conversation\s*\(")


def looks_like_tool_call(text: str) -> bool:
    """Tool-call syntax (Qwen/Hermes tags, OpenAI-style JSON, Llama's python tag) in a summary."""
    return bool(_TOOL_CALL_RE.search(text or ""))


__all__ = ["CALL_TAGS", "looks_like_tool_call"]
