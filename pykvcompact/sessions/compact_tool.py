"""The ``compact_conversation`` tool, run by the session when the model (or the caller) calls it."""
from __future__ import annotations

from typing import Callable

from .. import compaction_tool, events as ev
from ..policy import tool_allowed


class CompactTool:
    def __init__(self, ctx, policy, limits, compactor, emit: Callable[[ev.Event], None], path: str):
        self.ctx, self.policy, self.lim, self.compactor, self.emit, self.path = ctx, policy, limits, compactor, emit, path

    def run(self, call: dict) -> dict:
        """Compact now if allowed; returns the tool result message (not yet added to the context)."""
        n = len(self.ctx)
        if self.policy.mode == "none":
            self.emit(ev.ToolRefused(n / self.lim.window, reason="mode_none"))
            result = compaction_tool.NOTHING_TO_COMPACT
        elif not tool_allowed(self.policy, self.lim, n):
            self.emit(ev.ToolRefused(n / self.lim.window, reason="below_min_fill"))
            result = compaction_tool.NOTHING_TO_COMPACT
        elif self.compactor.defer("tool"):
            # background mode: the summary is written on a fork and swapped in once its context is
            # prefilled (no stall); the model learns it is under way
            result = compaction_tool.scheduled_result(self.path)
        else:
            e = self.compactor.compact("tool")   # no cut point / no gain: a compaction_skipped event says why
            result = compaction_tool.NOTHING_TO_COMPACT if e is None else \
                compaction_tool.compacted_result(self.path, n, len(self.ctx))
        return {"role": "tool", "tool_call_id": call.get("id", ""), "name": compaction_tool.NAME, "content": result}


__all__ = ["CompactTool"]
