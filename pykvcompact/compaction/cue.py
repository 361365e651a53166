"""The probe's structural cue: facts about the conversation's *shape* that hold for every agent, never the
wording of what a tool printed.

Two moments are cues (pure functions over OpenAI-style messages, oldest first):

``answered``
    the newest message is the assistant's and it answered in text without calling a tool: the model
    considers the step done and hands back.
``user``
    a user message arrived since the last probe: the user moved the task on (a new request, a correction).

A cue adds ``Policy.cue_weight`` to p(COMPRESS) in the verdict (``policy.verdict``).  The session passes the
live messages without summary messages (a summary is the session's own writing, not a user's turn).
"""
from __future__ import annotations

from typing import Sequence

CUES = ("answered", "user")


def _text(content) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def answered(message: dict) -> bool:
    """An assistant message with text and no tool call."""
    return (message.get("role") == "assistant" and not message.get("tool_calls")
            and bool(_text(message.get("content")).strip()))


def structural_cue(messages: Sequence[dict], new: int, *, replying: bool = False) -> str:
    """The cue at this moment: ``"answered"``, ``"user"`` or ``""`` (none).

    ``new``: how many of the newest ``messages`` arrived since the last probe (all of them before the first).
    ``replying``: the assistant is writing a reply right now (a probe between two chunks): it has not
    answered yet, whatever the newest complete message is."""
    if messages and not replying and answered(messages[-1]):
        return "answered"
    new = max(0, min(int(new), len(messages)))
    if new and any(m.get("role") == "user" for m in messages[len(messages) - new:]):
        return "user"
    return ""


__all__ = ["CUES", "answered", "structural_cue"]
