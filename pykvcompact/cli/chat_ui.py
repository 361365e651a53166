"""How ``pykvcompact chat`` shows a reply: plain text for pipes and tests, or a rich live view on a
terminal (the reply as it streams, and under it one status line that updates while the model works)."""
from __future__ import annotations

import sys
import time
from typing import Callable, Optional


def describe_event(e) -> str:
    d = e.to_dict() if hasattr(e, "to_dict") else dict(e)
    name = d.get("event", "event")
    if name == "probe":
        return f"probe {d.get('verdict')} p={d.get('p', 0):.2f}"
    if name == "rebased":
        return f"swap {d.get('tokens_before')}->{d.get('tokens_after')} tokens, stall {d.get('stall_ms', 0):.0f} ms"
    if name == "summary_ready":
        return f"summary ready ({d.get('tokens')} tokens, {d.get('ms', 0) / 1000:.1f} s)"
    if name == "offloaded":
        return f"offloaded {d.get('messages')} messages to {d.get('path')}"
    return name.replace("_", " ")


class PlainUI:
    """Streams the reply as it comes; events follow the reply, one line each."""

    def __init__(self, out=None):
        self.out = out or sys.stdout
        self._events = []

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def start_reply(self, status: Callable[[], str]) -> None:
        self._events = []

    def piece(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def event(self, e) -> None:
        self._events.append(describe_event(e))

    def end_reply(self) -> None:
        self.out.write("\n")
        for line in self._events:
            print(f"  [{line}]", file=self.out)
        self.out.flush()


class RichUI(PlainUI):
    """A live view: the reply so far, and a status line refreshed a few times a second."""

    def __init__(self, console=None):
        from rich.console import Console

        self.console = console or Console()
        self._live = None
        self._text = ""
        self._status: Optional[Callable[[], str]] = None
        self._last_event = ""

    def say(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)

    def _render(self):
        from rich.console import Group
        from rich.text import Text

        status = self._status() if self._status else ""
        if self._last_event:
            status += f" | {self._last_event}"
        return Group(Text(self._text), Text(status, style="dim"))

    def start_reply(self, status: Callable[[], str]) -> None:
        from rich.live import Live

        self._text, self._status, self._last_event = "", status, ""
        self._live = Live(self._render(), console=self.console, refresh_per_second=8, transient=False,
                          get_renderable=self._render)
        self._live.start()

    def piece(self, text: str) -> None:
        self._text += text

    def event(self, e) -> None:
        self._last_event = describe_event(e)

    def end_reply(self) -> None:
        if self._live is not None:
            self._live.update(self._render(), refresh=True)
            self._live.stop()
            self._live = None


class StatusClock:
    """Tokens and elapsed time of the reply in progress, for the status line."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.pieces = 0
        self.first_piece_s: Optional[float] = None

    def piece(self) -> None:
        self.pieces += 1
        if self.first_piece_s is None:
            self.first_piece_s = time.perf_counter() - self.t0

    def line(self, session) -> str:
        dt = time.perf_counter() - self.t0
        stage = "prefilling" if self.first_piece_s is None else f"{self.pieces} tok"
        rate = f"{self.pieces / (dt - self.first_piece_s):.1f} tok/s" if self.first_piece_s is not None and \
            dt > self.first_piece_s else ""
        return f"fill {session.fill:.0%} | {stage} {rate} | {dt:.1f} s"
