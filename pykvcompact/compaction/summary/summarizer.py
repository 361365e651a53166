"""The summarizer: its prompt, the summary message, the deterministic fallback, and what starts attempts.

The summarizer prompt is appended to a fork of the live sequence up to the cut, so only the
prompt is prefilled (the history's KV cells are shared).  An attempt (``attempt.py``) fails on an
exception, an empty output, an over-length output (the ``summary_max_tokens`` budget ran out before the
model ended the summary) or a timeout; the session retries once and then falls back to
:func:`fallback_summary`, built from the messages themselves (roles, tool names, the last user request),
which always succeeds.

Fault injection (tests): ``Summarizer.faults`` is a list consumed one item per attempt; an item is one of
``"exception"``, ``"empty"``, ``"over_length"``, ``"timeout"`` or ``None`` (no fault).
"""
from __future__ import annotations

import re
from typing import List, Optional, Sequence

from .attempt import FAILURES, Attempt

SKIPS = ("no_time", "uninformative")   # why the model is not asked at all (compaction/summary/summaries.py)

# The answer is prefilled with its first heading, so the model starts writing the summary (not a tool
# call: the tool schema sits in the system prompt of the context the summary is written in).
FIRST_HEADING = "Standing instructions:"
# ... the facts first, unless the request lists user messages to copy (then their heading leads).  Prefilled
# with "Standing instructions:", seven headings and "write none under an empty heading", Qwen2.5-Coder-1.5B
# wrote "none" under every heading in 5 of 8 summaries of the evaluation families (bench/summaries.py);
# facts first, in none of 8, and 4 of 8 carried an asked fact (2 of 8 before).  SmolLM2-135M writes
# nothing useful with either (0 of 8): the session stops asking it (summaries.py, novelty.py).
FACTS_HEAD = "Verified facts:\n-"


def answer_head(overflow_users: Sequence[str] = ()) -> str:
    """What the summary's answer is prefilled with (the request's first heading)."""
    return FIRST_HEADING if overflow_users else FACTS_HEAD


SUMMARY_HEADER = "[Summary of the conversation before this point. The full messages are saved in {path}.]"


def summarizer_request(history_path: str, max_tokens: int, instructions: Optional[str] = None,
                       shorter: bool = False, overflow_users: Sequence[str] = (), has_earlier: bool = False,
                       omitted: int = 0) -> str:
    """The user message appended to the fork to ask for the summary.  ``overflow_users``: user messages
    that will not be kept verbatim (over the ``keep_user_tokens`` budget): their constraints must be copied;
    all are listed, oldest first, as given (the session budgets them: ``omitted`` more did not fit).
    ``has_earlier``: an earlier summary above is carried forward verbatim, so only what is new is asked."""
    words = max(20, int(max_tokens * (0.35 if shorter else 0.6)))
    parts = [
        "Pause the task and write a summary of the conversation above, so that the work can continue "
        f"from the summary alone. The full messages will be saved in {history_path}. Do not call any tool: "
        "write plain text.",
    ]
    if has_earlier:
        parts.append("The earlier summary above is kept word for word; summarize only what happened after it.")
    facts = ("Verified facts: facts established above, one per line, each with its exact value copied from the "
             "messages (ids, numbers, codes, amounts, names, paths, times, results).")
    standing = (f"{FIRST_HEADING} every instruction or constraint the user gave before this request (ports, files "
                "not to touch, names, dates, numbers), copied word for word, not paraphrased.")
    parts += ["Use these headings:"] + ([standing, facts] if overflow_users else [facts, standing]) + [
        "Decisions: what was decided and why.",
        "Next step: the next concrete action.",
        f"Write only what is stated above; leave out a heading with nothing under it. At most {words} words.",
    ]
    if overflow_users:
        parts.append("These user messages will not be kept; copy every constraint, number and name in them "
                     f"under {FIRST_HEADING}")
        parts += [f"- {' '.join((u or '').split())}" for u in overflow_users]  # budgeted by the caller
        if omitted:
            parts.append(f"({omitted} more user messages are in the history file.)")
    if instructions:
        parts.append(f"Focus on: {instructions.strip()}")
    return "\n".join(parts)


def summary_message(summary_text: str, history_path: str) -> dict:
    """The message that replaces the summarized history in the live context."""
    return {"role": "user",
            "content": SUMMARY_HEADER.format(path=history_path) + "\n\n" + summary_text.strip(),
            "summary": True}


def _clip(s: str, n: int) -> str:
    s = " ".join((s or "").split())
    return s if len(s) <= n else s[: n - 1] + "…"


_PATH_RE = re.compile(r"(?:(?<=\s)|^)((?:[\w.-]+/)+[\w.-]+\.\w{1,8}|[\w-]+\.(?:py|md|txt|json|toml|yaml|yml|"
                      r"cpp|h|hpp|c|js|ts|rs|go|java|sh|cfg|ini|csv))\b")


LAST_REQUEST, FIRST_REQUEST = "Last user request: ", "First user request: "
_REQUEST_CHARS = {LAST_REQUEST: 400, FIRST_REQUEST: 300}
NEXT_STEP_LINE = "Next step: continue from the most recent messages below."


def _request_line(label: str, content: str) -> str:
    return label + _clip(content, _REQUEST_CHARS[label])


def without_repeated_requests(text: str, whole: Sequence[str]) -> str:
    """A fallback summary's text without its "Last/First user request" lines for the user messages in
    ``whole`` (those the summary message finally carries verbatim: kept messages, standing instructions):
    said once, not twice (measured: 25 of a fallback's ~350 tokens on the ledger episodes).  Decided when
    the message is composed, as a smaller rebased context may drop kept messages and a "none" line is not
    kept as an instruction: then the request line is the message's only copy."""
    repeats = {_request_line(label, t) for t in whole for label in _REQUEST_CHARS}
    return "\n".join(line for line in text.split("\n") if line not in repeats)


def fallback_summary(messages: Sequence[dict], *, reason: str = "", max_chars: int = 2000,
                     standing: Sequence[str] = ()) -> str:
    """A deterministic summary built from the messages (no model): ``standing`` (the user messages that
    are not kept verbatim, copied word for word) under the first heading, then the last and first user
    requests, the files mentioned, the gist of an earlier summary.  The raw tail follows it.  No counts of
    messages or tools and no copy of the last assistant reply: they carry no fact and took ~45 of the
    window's tokens in every swap (the key results list what the replies stated)."""
    users = [m for m in messages if m.get("role") == "user" and not m.get("summary")]
    earlier = [m for m in messages if m.get("summary")]
    paths = []
    for m in messages:
        for p in _PATH_RE.findall(m.get("content") or ""):
            if p not in paths:
                paths.append(p)
    lines = []
    why = (f"; not asked: {reason}" if reason in SKIPS else f"; the summarizer failed: {reason}") if reason else ""
    auto = "(Automatic summary, built without the model" + why + ".)"
    if standing:  # first (the lines are trimmed from the end): the marker, the user's instructions
        lines += [auto, FIRST_HEADING] + [" ".join((u or "").split()) for u in standing]
    if users:
        lines.append(_request_line(LAST_REQUEST, users[-1].get("content", "")))
    if not standing:
        lines.append(auto)
    if len(users) > 1:
        lines.append(_request_line(FIRST_REQUEST, users[0].get("content", "")))
    if paths:
        lines.append("Files mentioned: " + ", ".join(paths[:12]) + ".")
    if earlier:
        body = earlier[-1].get("content", "")
        body = body.split("\n\n", 1)[1] if "\n\n" in body else body
        lines.append("Earlier summary: " + _clip(body, 600))
    lines.append(NEXT_STEP_LINE)
    out = "\n".join(lines)
    return out if len(out) <= max_chars else out[: max_chars - 1] + "…"


class Summarizer:
    """Starts attempts; holds the test fault-injection queue."""

    def __init__(self, faults: Optional[Sequence[Optional[str]]] = None):
        self.faults: List[Optional[str]] = list(faults or [])

    def next_fault(self) -> Optional[str]:
        f = self.faults.pop(0) if self.faults else None
        if f is not None and f not in FAILURES:
            raise ValueError(f"unknown fault {f!r}; one of {FAILURES}")
        return f

    def start(self, fork, prompt_tokens, *, max_tokens: int, background: bool, timeout: float,
              detokenize, attempt: int = 1) -> Attempt:
        return Attempt(fork, prompt_tokens, max_tokens=max_tokens, background=background, timeout=timeout,
                       detokenize=detokenize, fault=self.next_fault(), attempt=attempt)


__all__ = ["FIRST_HEADING", "FACTS_HEAD", "answer_head", "SKIPS", "Summarizer", "summarizer_request", "summary_message",
           "fallback_summary",
           "without_repeated_requests", "FAILURES", "SUMMARY_HEADER"]
