"""The summary built without the model (no time, or a model measured to say nothing): the over-budget
user messages verbatim, then what the replaced messages show; and the text helpers that make room in it
for the assistant's own statements.  Pure functions; ``count`` is text -> tokens."""
from __future__ import annotations

from .keeper import budget_items
from .summarizer import FIRST_REQUEST, LAST_REQUEST, fallback_summary
from .tool_call_syntax import looks_like_tool_call


def fallback_text(msgs, reason: str, budget: int, count, overflow=(), spare: int = 0) -> str:
    """The deterministic summary: the over-budget user messages verbatim (within the budget, less a
    line, plus what the kept messages left of theirs: ``spare``) under "Standing instructions:",
    then what the messages show."""
    budget = max(16, budget)
    standing, _ = budget_items(list(overflow), budget - 16 + spare, count, least=12) if overflow else ([], 0)
    if standing:
        budget = max(budget, count("\n".join(fallback_summary([], reason=reason, standing=standing).split("\n")[:-1]))
                     + 24)
    text = fallback_summary([m for m in msgs if not looks_like_tool_call(m.get("content") or "")],
                            reason=reason, max_chars=budget * 6 + sum(len(x) for x in standing),
                            standing=standing)
    lines = text.split("\n")
    keep = len(standing) + 3 if standing else 0   # the marker, the heading, them, the last request
    while len(lines) > max(2, keep + 1) and count("\n".join(lines)) > budget:
        lines.pop()  # least important last
    text = "\n".join(lines)
    while count(text) > budget and len(text) > 40:
        text = text[: int(len(text) * 0.85)] + "…"
    return text


def users_words(line: str) -> bool:
    """A fallback summary's line that carries the user's words (a request), or says it is automatic."""
    return line.startswith((LAST_REQUEST, FIRST_REQUEST, "(Automatic summary"))


def give_up(text: str, tokens: int, count) -> str:
    """``text`` less at least ``tokens`` tokens of its lines that are not the user's words, the last first."""
    lines = text.split("\n")
    goal = count(text) - tokens
    for i in range(len(lines) - 1, -1, -1):
        if count("\n".join(lines)) <= goal:
            break
        if not users_words(lines[i]):
            lines.pop(i)
    return "\n".join(lines)


def trim_lines_end(text: str, budget: int, count) -> str:
    """``text`` within ``budget`` tokens, dropping its last lines first (the summary's headings come in
    order of importance)."""
    lines = (text or "").split("\n")
    while lines and count("\n".join(lines)) > max(0, budget):
        lines.pop()
    return "\n".join(lines)


__all__ = ["fallback_text", "users_words", "give_up", "trim_lines_end"]
