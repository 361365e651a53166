"""Sizing a session at creation: the window plus the forks' cells must fit in what the engine has free,
and the system prompt (with the tool definitions) must leave room for work."""
from __future__ import annotations

import threading
import weakref
from typing import Tuple

from ..compaction.policy import SEARCH_MIN_WINDOW, reserve_cells, resolve_window, summary_budget
from ..compaction.summary.summarizer import summarizer_request
from ..engine.port import free_cells
from ..compaction.prober import PROBE_PROMPT


def _tok(engine, text: str):
    return engine.tokenize(text, add_special=False, parse_special=True) if text else []


# Cells promised to live sessions, per engine: a session created later sizes itself from what is left, so
# two sessions never count on the same free cells (the pool is shared by every sequence of the engine).
_RESERVED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _held(engine) -> int:
    """Cells promised to the live sessions on ``engine``."""
    if not _weakrefable(engine) or not getattr(engine, "cells_shared", True):
        return 0  # (a remote engine: each request has the whole context)
    with _LOCK:
        return sum(_RESERVED.get(engine, {}).values())


def available_cells(engine) -> int:
    """Free cells not promised to another session."""
    return min(free_cells(engine), engine.n_ctx - _held(engine))


def reserve(engine, key, cells: int) -> None:
    if _weakrefable(engine):
        with _LOCK:
            _RESERVED.setdefault(engine, {})[key] = cells


def release(engine, key) -> None:
    if _weakrefable(engine):
        with _LOCK:
            _RESERVED.get(engine, {}).pop(key, None)


def _weakrefable(engine) -> bool:
    try:
        weakref.ref(engine)
        return True
    except TypeError:
        return False


def session_cells(engine, policy, template, tools, rubric: str, history_path: str):
    """``(window, cells)``: the session's window and the cells it needs with its forks."""
    probe, summ = _fork_tokens(engine, policy, template, tools, rubric, history_path)
    try:
        window = resolve_window(policy, available_cells(engine), probe_tokens=probe, summarizer_tokens=summ)
    except ValueError as e:
        held = _held(engine)
        if held:
            raise ValueError(f"{e} ({held} of the engine's {engine.n_ctx} cells are reserved by other open "
                             "sessions on it: close() them, or give them smaller windows)") from None
        raise
    if policy.mode == "none":
        return window, window
    return window, window + reserve_cells(policy, window, probe_tokens=probe, summarizer_tokens=summ)


def size_session(engine, policy, template, rubric: str, history_path: str, tools) -> Tuple[int, int]:
    """``(window, cells)`` for a new session whose tools are ``tools`` (session/tools.py's SessionTools: its
    ``offers_search`` and ``in_effect`` are settled here).  With ``history_tool=None`` and ``window=None`` the
    search tool is offered only if the window that fits with it is at least SEARCH_MIN_WINDOW (else it
    would take a large share of a small window, or keep the session from opening at all)."""
    auto = policy.history_tool is None and policy.window is None and tools.offers_search
    try:
        window, cells = session_cells(engine, policy, template, tools.for_call(None), rubric, history_path)
        if not auto or window >= SEARCH_MIN_WINDOW:
            tools.in_effect = tools.for_call(None)
            return window, cells
    except ValueError:
        if not auto:
            raise
    tools.offers_search = False
    tools.in_effect = tools.for_call(None)
    return session_cells(engine, policy, template, tools.in_effect, rubric, history_path)


def resolve_session_window(engine, policy, template, tools, rubric: str, history_path: str) -> int:
    return session_cells(engine, policy, template, tools, rubric, history_path)[0]


def _fork_tokens(engine, policy, template, tools, rubric: str, history_path: str):
    def extra(msg: str) -> int:  # cells a fork adds on top of the shared history: the rendered delta
        base = [{"role": "user", "content": "x"}]
        return len(_tok(engine, template.render(base + [{"role": "user", "content": msg}], tools, True))) - \
            len(_tok(engine, template.render(base, tools, False))) + 16
    probe = extra(PROBE_PROMPT.format(rubric=rubric))
    w0 = policy.window or engine.n_ctx
    # the over-budget user messages the prompt quotes: at most SummaryBudget.listed tokens (the session
    # budgets them with the model's tokenizer), one filler token a word here
    listed = summary_budget(policy, w0).listed
    summ = extra(summarizer_request(history_path, policy.summary_tokens(w0), "x " * 16,
                                    overflow_users=["x " * listed], omitted=1))
    return probe, summ


def check_base(engine, policy, limits, template, tools, system) -> None:
    first = [{"role": "system", "content": system}] if system is not None else [{"role": "user", "content": ""}]
    base = len(_tok(engine, template.render(first, tools, False)))
    # after a compaction the context holds at least the prefix and a summary: they must be below the
    # mode's trigger or no compaction can ever bring the context under it (mode none: the prefix alone)
    need = base + (limits.summary if policy.summarizes else 0)
    if need >= limits.trigger:
        frac = limits.trigger / limits.window
        raise ValueError(
            f"window={limits.window} is too small for mode {policy.mode!r}: the system prompt and tool definitions "
            f"take {base} tokens" + (f" and a summary up to {limits.summary}" if policy.summarizes else "") +
            f", not below the mode's trigger ({limits.trigger} tokens); use a window of at least "
            f"{int((need + limits.keep_recent) / max(frac, 1e-9)) + 1}, a shorter system prompt or fewer tools")


__all__ = ["resolve_session_window", "session_cells", "size_session", "check_base", "available_cells", "reserve", "release"]
