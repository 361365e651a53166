"""The tools a session shows the model: the caller's, plus ``compact_conversation`` when the policy offers
it and ``search_history`` when the session offers it (each unless the caller defines a tool of that name)."""
from __future__ import annotations

from typing import List, Optional, Sequence

from ..chat.messages import check_tools
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


__all__ = ["SESSION_TOOLS", "tools_in_effect"]
