"""The ``compact_conversation`` tool the model can call (Deep Agents' autonomous compaction).

The tool takes no arguments.  Below ``tool_min_fill`` x ``hard`` of the window it refuses with "Nothing to
compact yet" and compacts nothing (the automatic compaction at ``hard`` stays as the safety net).  Above
it the session compacts now: the older messages become one summary, the most recent ``keep_recent`` of
the window (the tool call itself and its result included) stay raw, and the originals are saved to the
history file the summary points to.
"""
from __future__ import annotations

NAME = "compact_conversation"
NOTHING_TO_COMPACT = "Nothing to compact yet"

DESCRIPTION = (
    "Compact the conversation: replace the older messages with a summary to free context space. Nothing is "
    "lost: the full messages are saved to a file and the summary says where. The most recent messages, "
    "this call included, are kept as they are. Good moments to call it: the user starts a new, unrelated "
    "task; a sub-goal is finished and its result is stated; a search or tool result you needed has been "
    "obtained and its facts written down; the earlier context will no longer be useful. Bad moments: in "
    "the middle of a multi-step edit, refactor, derivation or search, when you still need the exact recent "
    "details. Below half of the automatic compaction limit it does nothing and answers 'Nothing to compact "
    "yet'."
)

TOOL = {
    "type": "function",
    "function": {
        "name": NAME,
        "description": DESCRIPTION,
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
}


def compacted_result(path: str, tokens_before: int, tokens_after: int) -> str:
    return (f"Conversation compacted: {tokens_before} -> {tokens_after} tokens. The earlier messages are "
            f"summarized above and saved verbatim in {path}.")


def is_compact_call(call: dict) -> bool:
    f = call.get("function", call) if isinstance(call, dict) else {}
    return isinstance(f, dict) and f.get("name") == NAME


__all__ = ["NAME", "NOTHING_TO_COMPACT", "DESCRIPTION", "TOOL", "compacted_result", "is_compact_call"]
