"""Adding one message to a session: durable first, then live.

The message is written to the write-ahead log (fsynced) before it joins the live context; if the context
refuses it, the log entry is taken back, so the log and the context never disagree.  A reply whose tokens
are already in the sequence (``from_partial``) is live whatever fails next, and is recorded as such."""
from __future__ import annotations

from typing import Callable, Optional

from ..chat.messages import view_of


def append_message(ctx, transcript, make_room: Callable[[Callable[[], int]], None], msg: dict,
                   view: Optional[dict] = None, *, check_room: bool = True, from_partial: bool = False):
    """Add ``msg`` (shown to the model as ``view``) to the live context ``ctx`` and the ``transcript``; returns
    its context entry.  ``check_room``: compact first (``make_room``) until it fits the window."""
    view = view if view is not None else view_of(msg)
    if check_room and not from_partial:
        make_room(lambda: ctx.measure(ctx.render(ctx.views() + [view])))
    tidx = len(transcript.messages)
    own_view = None if view == view_of(msg) else view  # the log keeps a view it cannot recompute
    if from_partial:  # the reply's tokens are in the sequence already: it is live, whatever fails next
        try:
            entry = ctx.add(msg, view, tidx, from_partial=True)
        finally:
            transcript.record_live(msg, own_view)  # a write error: the call fails, the reply stays live (logged next)
        return entry
    transcript.log(msg, own_view)  # durable first: if the log cannot be written, nothing has changed
    try:
        entry = ctx.add(msg, view, tidx)
    except BaseException:
        transcript.unlog(tidx)
        raise
    if msg.get("role") == "system" and len(ctx.entries) == 1:
        ctx.n_prefix = 1  # a leading system message is the prefix, kept always (as Session.load counts it)
    transcript.record(msg)
    return entry


__all__ = ["append_message"]
