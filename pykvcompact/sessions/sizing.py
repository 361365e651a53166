"""Sizing a session at creation: the window plus the forks' cells must fit in what the engine has free,
and the system prompt (with the tool definitions) must leave room for work."""
from __future__ import annotations

from ..policy import resolve_window
from ..summarizer import summarizer_request
from .port import free_cells
from .prober import PROBE_PROMPT


def _tok(engine, text: str):
    return engine.tokenize(text, add_special=False, parse_special=True) if text else []


def resolve_session_window(engine, policy, template, tools, rubric: str, history_path: str) -> int:
    def extra(msg: str) -> int:  # cells a fork adds on top of the shared history: the rendered delta
        base = [{"role": "user", "content": "x"}]
        return len(_tok(engine, template.render(base + [{"role": "user", "content": msg}], tools, True))) - \
            len(_tok(engine, template.render(base, tools, False))) + 16
    probe = extra(PROBE_PROMPT.format(rubric=rubric))
    w0 = policy.window or engine.n_ctx
    summ = extra(summarizer_request(history_path, policy.summary_tokens(w0), "x " * 16, overflow_users=["x " * 32] * 2))
    return resolve_window(policy, free_cells(engine), probe_tokens=probe, summarizer_tokens=summ)


def check_base(engine, policy, limits, template, tools, system) -> None:
    first = [{"role": "system", "content": system}] if system is not None else [{"role": "user", "content": ""}]
    base = len(_tok(engine, template.render(first, tools, False)))
    need = base + limits.keep_recent + (limits.summary if policy.summarizes else 0)
    if base >= limits.trigger or (policy.summarizes and need > limits.hard + limits.keep_recent):
        raise ValueError(
            f"window={limits.window} is too small: the system prompt and tool definitions take {base} tokens; "
            f"with keep_recent and a summary of up to {limits.summary} tokens the session needs a window of "
            f"at least {int(need / max(policy.hard, 1e-9)) + 1}")


__all__ = ["resolve_session_window", "check_base"]
