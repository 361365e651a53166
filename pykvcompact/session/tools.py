"""The tools a session shows the model: the caller's, plus ``compact_conversation`` when the policy offers
it and ``search_history`` when the session offers it (each unless the caller defines a tool of that name);
and which tool calls the session answers itself."""
from __future__ import annotations

from typing import List, Optional, Sequence

from ..chat.messages import check_tools
from ..chat.tool_calls import tool_names
from ..compaction.tools import compact as compaction_tool, history_search

SESSION_TOOLS = (compaction_tool.NAME, history_search.NAME)  # the tools the session runs itself


def tools_in_effect(caller_tools: Sequence[dict], override, offers_compact: bool,
                    offers_search: bool) -> Optional[List[dict]]:
    """The tool list for a call: ``override`` (checked) if given, else the session's ``caller_tools``; with the
    session's own tools added as offered.  None when there are none."""
    base = check_tools(override) if override is not None else list(caller_tools)
    names = {t["function"]["name"] for t in base}
    if offers_compact and compaction_tool.NAME not in names:
        base = base + [compaction_tool.TOOL]
    if offers_search and history_search.NAME not in names:
        base = base + [history_search.TOOL]
    return base or None


class SessionTools:
    """The session's tools: the caller's (``caller``, given at construction), the ones a call renders now
    (``in_effect``), and which calls are the session's to run.  A call to a name the caller's own tools
    define is the caller's, whatever the name."""

    def __init__(self, caller_tools: List[dict], offers_compact: bool, offers_search: bool):
        self.set_caller(caller_tools)
        self.offers_compact = offers_compact
        self.offers_search = offers_search       # turned off by sizing when the window is too small for it
        self.in_effect: Optional[List[dict]] = None

    def set_caller(self, caller_tools: List[dict]) -> None:
        """The caller's tools from the next call on."""
        self.caller = caller_tools
        self.caller_names = set(tool_names(caller_tools) or ())

    def for_call(self, override) -> Optional[List[dict]]:
        """The tools a call with ``tools=override`` renders (None: the session's own)."""
        return tools_in_effect(self.caller, override, self.offers_compact, self.offers_search)

    def begin_call(self, override) -> Optional[List[dict]]:
        """A call starts with ``tools=override``: whose calls are whose is decided by its tools."""
        tools = self.for_call(override)   # (checks ``override`` first)
        self.caller_names = set(tool_names(override if override is not None else self.caller) or ())
        return tools

    def answers_search(self) -> bool:
        """Does the session run ``search_history`` (offered, and not a tool of the caller's)?"""
        return self.offers_search and history_search.NAME not in self.caller_names

    def runs(self, call: dict) -> bool:
        """Does the session answer this call itself?  ``compact_conversation`` always, ``search_history``
        when the session offers it, neither when the caller's own tools define that name."""
        if compaction_tool.is_compact_call(call):
            return compaction_tool.NAME not in self.caller_names
        if history_search.is_search_call(call):
            return self.answers_search()
        return False


__all__ = ["SESSION_TOOLS", "SessionTools", "tools_in_effect"]
