"""The ``compact_conversation`` tool the model can call (Deep Agents' autonomous compaction).

The tool takes no arguments.  Below ``tool_min_fill`` x ``hard`` of the window it refuses with "Nothing to
compact yet" and compacts nothing (the automatic compaction at ``hard`` stays as the safety net).  Above
it the session compacts now: the older messages become one summary, the most recent ``keep_recent`` of
the window (the tool call itself and its result included) stay raw, and the originals are saved to the
history file the summary points to.  ``CompactTool`` runs it for the session.
"""
from __future__ import annotations

from typing import Callable

from ... import events as ev
from ..policy import tool_allowed

NAME = "compact_conversation"
NOTHING_TO_COMPACT = "Nothing to compact yet"

# Short on purpose: the tool definition sits in the system prompt of every window (a long description
# took 193 tokens, 19% of a 1024 window, and crowded out the work it was meant to make room for).
DESCRIPTION = (
    "Summarize the older messages to free context (they are saved to a file). Call it when a sub-goal is "
    "done or a new task starts; not in the middle of a multi-step edit or search."
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


def scheduled_result(path: str) -> str:
    return (f"Compaction started: the earlier messages will be replaced by a summary in a moment; they are "
            f"saved verbatim in {path}. Continue with the task.")


def is_compact_call(call: dict) -> bool:
    f = call.get("function", call) if isinstance(call, dict) else {}
    return isinstance(f, dict) and f.get("name") == NAME


class CompactTool:
    def __init__(self, ctx, policy, limits, compactor, emit: Callable[[ev.Event], None], path: str):
        self.ctx, self.policy, self.limits, self.compactor, self.emit, self.path = ctx, policy, limits, compactor, emit, path

    def run(self, call: dict) -> dict:
        """Compact now if allowed; returns the tool result message (not yet added to the context)."""
        n = len(self.ctx)
        if self.policy.mode == "none":
            self.emit(ev.ToolRefused(n / self.limits.window, reason="mode_none"))
            result = NOTHING_TO_COMPACT
        elif not tool_allowed(self.policy, self.limits, n):
            self.emit(ev.ToolRefused(n / self.limits.window, reason="below_min_fill"))
            result = NOTHING_TO_COMPACT
        elif self.compactor.defer("tool"):
            # background mode: the summary is written on a fork and swapped in once its context is
            # prefilled (no stall); the model learns it is under way
            result = scheduled_result(self.path)
        else:
            e = self.compactor.compact("tool")   # no cut point / no gain: a compaction_skipped event says why
            result = NOTHING_TO_COMPACT if e is None else \
                compacted_result(self.path, n, len(self.ctx))
        return {"role": "tool", "tool_call_id": call.get("id", ""), "name": NAME, "content": result}


__all__ = ["NAME", "NOTHING_TO_COMPACT", "DESCRIPTION", "TOOL", "compacted_result", "scheduled_result", "is_compact_call",
           "CompactTool"]
