"""The ``search_history`` tool, run by the session when the model (or the caller) calls it: a search of
the messages compaction took out of the live context (``history_search.py``)."""
from __future__ import annotations

from typing import Callable

from ... import events as ev
from . import history_search


class SearchTool:
    def __init__(self, ctx, transcript, limits, emit: Callable[[ev.Event], None]):
        self.ctx, self.transcript, self.limits, self.emit = ctx, transcript, limits, emit
        # a result may take an eighth of the window: enough for a dozen lines, never the room to work
        self.budget = max(64, limits.window // 8)

    def run(self, call: dict) -> dict:
        """The tool result message for ``call`` (not yet added to the context)."""
        query, why = history_search.query_of(call)
        if query is None:
            content, shown = f"{history_search.NAME} was not run: {why}, e.g. {{\"query\": \"ACC-1042 total\"}}.", 0
        else:
            content, shown = history_search.search_result(self._offloaded(), query, budget=self.budget,
                                                          count=self._count)
        self.emit(ev.HistorySearched(query or "", shown, self._count(content), len(self.ctx) / self.limits.window))
        return {"role": "tool", "tool_call_id": call.get("id", ""), "name": history_search.NAME,
                "content": content}

    def _count(self, text: str) -> int:
        return len(self.ctx.tok(text))

    def _offloaded(self):
        """``(transcript index, message)`` of every offloaded message, oldest first."""
        where = {id(m): i for i, m in enumerate(self.transcript.messages)}
        return [(where.get(id(m), -1), m) for m in self.transcript.offloaded]


__all__ = ["SearchTool"]
