"""Which streamed text may reach the client as ``content`` before the reply is complete.

The session streams raw text; the final message is known only at the end (stop strings cut, tool
calls parsed out). The gate lets text through until a marker (a stop string, ``<tool_call>``) starts,
holding back any tail that could be the beginning of one, and with tools holds everything when the
reply opens like a JSON call. At the end, whatever the final content adds to what was sent follows."""
from __future__ import annotations

from typing import Optional, Sequence

TOOL_MARKERS = ("<tool_call>",)
JSON_OPENERS = ("{", "[", "```")


class ContentGate:
    def __init__(self, stops: Sequence[str] = (), tools: bool = False, json_calls: Optional[bool] = None):
        """``tools``: hold back tool-call markup; ``json_calls`` (default: as ``tools``): also hold a reply
        that opens like a bare JSON call (only the client's tools: the session's own are called with
        markup, and holding every reply that opens with a code fence would stop streaming code)."""
        self.markers = tuple(s for s in stops if s) + (TOOL_MARKERS if tools else ())
        self.tools = tools if json_calls is None else json_calls
        self.raw = ""
        self.sent = ""
        self.closed = False  # a marker was seen: nothing more until the end

    def feed(self, text: str) -> str:
        """The part of the reply so far that is safe to send now (may be empty)."""
        self.raw += text
        if self.closed:
            return ""
        head = self.raw.lstrip()
        if self.tools and (any(head.startswith(o) for o in JSON_OPENERS) or
                           (not self.sent and any(o.startswith(head) for o in JSON_OPENERS + TOOL_MARKERS))):
            return ""  # looks like (or may become) a call: hold
        safe = len(self.raw)
        for m in self.markers:
            i = self.raw.find(m)
            if i >= 0:
                safe = min(safe, i)
                self.closed = True
        if not self.closed:
            for m in self.markers:  # a tail that may grow into a marker waits
                for k in range(min(len(m) - 1, len(self.raw)), 0, -1):
                    if self.raw.endswith(m[:k]):
                        safe = min(safe, len(self.raw) - k)
                        break
        return self._send_upto(safe)

    def finish(self, final_content: Optional[str]) -> str:
        """What is left to send once the final content is known."""
        final = final_content or ""
        if final.startswith(self.sent):
            rest = final[len(self.sent):]
            self.sent = final
            return rest
        return ""

    def _send_upto(self, n: int) -> str:
        if n <= len(self.sent):
            return ""
        out = self.raw[len(self.sent):n]
        self.sent = self.raw[:n]
        return out
