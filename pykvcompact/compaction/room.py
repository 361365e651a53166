"""Room in the window before a step: compact until the next text fits, or refuse it with a clear error.
The one way the session makes room (the compactor decides how)."""
from __future__ import annotations

from typing import Callable, List

from ..chat.messages import ContextWindowError, view_of


class Room:
    """Makes room in ``ctx`` (a window of ``window`` tokens) through ``compactor``."""

    def __init__(self, ctx, compactor, window: int):
        self.ctx, self.compactor, self.window = ctx, compactor, window

    def make(self, after_fn: Callable[[], int]) -> None:
        """Compact until ``after_fn()`` tokens fit; a text that cannot fit even then is refused first."""
        ctx, compactor = self.ctx, self.compactor
        after = after_fn()
        if compactor.room_ok(after):
            return
        if ctx.prefix_tok() + max(0, after - len(ctx)) > self.window:  # no compaction could make it fit
            raise ContextWindowError(
                f"the new text needs {after - len(ctx)} more tokens: with the {ctx.prefix_tok()}-token system "
                f"prompt it cannot fit the window of {self.window} even after compaction; shorten it or use a "
                "larger window")
        for _ in range(3):
            if compactor.make_room(after_fn) and compactor.room_ok(after_fn()):
                return
            if after_fn() <= self.window:
                return
        raise ContextWindowError(
            f"the new text does not fit in the window of {self.window} tokens even after compaction: "
            f"{after_fn()} needed, {len(ctx)} live in {len(ctx.entries)} messages (system prompt {ctx.prefix_tok()}); "
            "shorten the message, or use a larger window")

    def fits(self, after: int) -> bool:
        """Can the live context grow to ``after`` tokens without a compaction first?"""
        return self.compactor.room_ok(after)

    def make_best_effort(self, after_fn: Callable[[], int]) -> None:
        """Compact (or, as a last resort, drop turns) toward ``after_fn()`` tokens; never refuses: a reply
        that still does not fit writes fewer tokens (the caller checks)."""
        self.compactor.make_room(after_fn)

    def for_batch(self, msgs: List[dict]) -> None:
        """Make room for a call's messages together, before the first is appended: a swap needed by this
        batch then commits a context prepared while the previous reply was generated, instead of one that
        has to catch up with half the batch first (the stall at the window edge).  Best effort: the
        per-message appends still make room (and refuse) one by one."""
        if len(msgs) < 2:
            return
        ctx = self.ctx
        new_views = [view_of(m) for m in msgs]
        after = lambda: ctx.measure(ctx.render(ctx.views() + new_views))  # noqa: E731
        if ctx.prefix_tok() + after() - len(ctx) <= self.window:
            self.compactor.make_room(after, drop=False)


__all__ = ["Room"]
