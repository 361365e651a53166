"""The summarizer: prompt, one attempt on a fork, failure handling, deterministic fallback.

The summarizer prompt is appended to a fork of the live sequence cut at the snapshot mark, so only the
prompt is prefilled (the history's KV cells are shared).  An attempt fails on an exception, an empty
output, an over-length output (the ``summary_max_tokens`` budget ran out before the model ended the
summary) or a timeout; the session retries once and then falls back to :func:`fallback_summary`, built
from the messages themselves (roles, tool names, the last user request), which always succeeds.

Fault injection (tests): ``Summarizer.faults`` is a list consumed one item per attempt; an item is one of
``"exception"``, ``"empty"``, ``"over_length"``, ``"timeout"`` or ``None`` (no fault).
"""
from __future__ import annotations

import re
import time
from typing import Callable, List, Optional, Sequence

from ...engine.port import grant_rows

FAILURES = ("exception", "empty", "over_length", "timeout", "tool_call")
SKIPS = ("no_time", "uninformative")   # why the model is not asked at all (compaction/summary/summaries.py)

# The answer is prefilled with its first heading, so the model starts writing the summary (not a tool
# call: the tool schema sits in the system prompt of the context the summary is written in).
FIRST_HEADING = "Standing instructions:"
CALL_TAGS = r"<tool_call>|\[TOOL_CALLS\]|<\|python_tag\|>"   # what opens a call (Qwen/Hermes, Mistral, Llama)
_TOOL_CALL_RE = re.compile(CALL_TAGS + r"|</tool_call>|\{\s*\"name\"\s*:|\"arguments\"\s*:|compact_conversation\s*\(")


def looks_like_tool_call(text: str) -> bool:
    """Tool-call syntax (Qwen/Hermes tags, OpenAI-style JSON, Llama's python tag) in a summary."""
    return bool(_TOOL_CALL_RE.search(text or ""))

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
    parts += [
        "Use exactly these headings:",
        f"{FIRST_HEADING} every instruction or constraint the user gave (ports, files not to touch, names, "
        "dates, numbers), copied word for word, not paraphrased.",
        "Goal: what the user wants.",
        "Verified facts: facts established above, with their exact values (numbers, names, paths, results).",
        "Decisions: what was decided and why.",
        "Files and artifacts: files, functions or other artifacts read, created or changed.",
        "Open items: what is unfinished or unknown.",
        "Next step: the next concrete action.",
        "Write only what is stated above; do not invent anything; write \"none\" under an empty heading. "
        f"At most {words} words.",
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


def looping(text: str, repeats: int = 3) -> bool:
    """The output ends with the same non-empty line ``repeats`` times (small models loop): the attempt
    is stopped early and counts as over length."""
    lines = [l.strip() for l in text.split("\n") if l.strip()]
    if len(lines) > repeats and not text.endswith("\n"):
        lines = lines[:-1]  # the last line may be incomplete
    return len(lines) >= repeats and len(set(lines[-repeats:])) == 1 and len(lines[-1]) >= 8


def validate(text: Optional[str], n_tokens: int, finish_reason: Optional[str], error, max_tokens: int,
             timed_out: bool = False) -> Optional[str]:
    """``None`` when the attempt produced a usable summary, else the failure reason."""
    if timed_out:
        return "timeout"
    if error is not None or finish_reason in ("error", "cancelled", "context_full"):
        return "exception"
    if not text or not text.strip():
        return "empty"
    if looks_like_tool_call(text):
        return "tool_call"
    if finish_reason == "length" or n_tokens > max_tokens:
        return "over_length"
    return None


class Attempt:
    """One summary generation on a fork: ``fork.tokens == history[:mark]``; appends ``prompt_tokens`` then
    generates at most ``max_tokens``. Background attempts use ``append_background``/``generate_background``
    (rows interleaved with the foreground), synchronous ones ``append``/``generate``."""

    def __init__(self, fork, prompt_tokens: List[int], *, max_tokens: int, background: bool, timeout: float,
                 detokenize: Callable[[List[int]], str], fault: Optional[str] = None, attempt: int = 1):
        self.fork = fork
        self.max_tokens = max_tokens
        self.background = background
        self.timeout = 0.0 if fault == "timeout" else timeout
        self.detokenize = detokenize
        self.fault = fault
        self.attempt = attempt
        self.t0 = time.perf_counter()
        self.t_done: Optional[float] = None
        self.t_first: Optional[float] = None   # when a first summary token was seen (its prompt is in by then)
        self.error = None
        self.tokens: List[int] = []
        self.finish_reason: Optional[str] = None
        self._prefill = None
        self._gen = None
        self._done = False
        self._cancelled = False
        self.looped = False
        self.rows_per_step = 0
        try:
            if fault == "exception":
                raise RuntimeError("injected summarizer fault")
            if background:
                self._prefill = fork.append_background(list(prompt_tokens))
                try:
                    # the engine queues it behind the prefill: no foreground step is needed to start it
                    self._gen = fork.generate_background(max_tokens, temperature=0.0)
                except Exception:
                    self._gen = None  # a backend without a job queue: poll() starts it after the prefill
            else:
                fork.append(list(prompt_tokens))
                stream = getattr(fork, "stream", None)
                if stream is None:
                    self.tokens = list(fork.generate(max_tokens, temperature=0.0))
                else:
                    it = stream(max_tokens, temperature=0.0)
                    try:
                        for t in it:
                            self.tokens.append(t)
                            if len(self.tokens) % 8 == 0 and looping(detokenize(self.tokens)):
                                self.looped = True
                                break
                    finally:
                        close = getattr(it, "close", None)
                        if close is not None:
                            close()
                self.finish_reason = "length" if (self.looped or len(self.tokens) >= max_tokens) else "stop"
                self._finish()
        except Exception as e:  # noqa: BLE001 - any failure is a summarizer failure
            self.error = e
            self._finish()

    def set_rows_per_step(self, n: int) -> None:
        """Give this background attempt more rows per step (its deadline is near)."""
        self.rows_per_step = n  # also for a generation job started later (see poll)
        for j in (self._prefill, self._gen):
            grant_rows(j, n)

    def _finish(self):
        self._done = True
        self.t_done = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return (self.t_done or time.perf_counter()) - self.t0

    def pace(self, written: int) -> Optional[tuple]:
        """``(seconds before the first token, tokens per second since)`` measured on this attempt (its prompt's
        prefill, then its writing), or None before a second token was seen."""
        if self.t_first is None or written < 2:
            return None
        now = self.t_done or time.perf_counter()
        return self.t_first - self.t0, (written - 1) / max(now - self.t_first, 1e-3)

    @property
    def timed_out(self) -> bool:
        return not self._done and self.elapsed > self.timeout

    def poll(self) -> bool:
        """Advance; True when finished (successfully or not)."""
        if self._done:
            return True
        try:
            if self._gen is None:
                if self._prefill is not None and not self._prefill.done():
                    return False
                if self._prefill is not None and getattr(self._prefill, "error", None):
                    raise RuntimeError(f"summary prefill failed: {self._prefill.error}")
                self._gen = self.fork.generate_background(self.max_tokens, temperature=0.0)
                if self.rows_per_step:
                    grant_rows(self._gen, self.rows_per_step)
            if not self._gen.done():
                toks = self._gen.tokens
                if toks and self.t_first is None:
                    self.t_first = time.perf_counter()
                if len(toks) >= 24 and looping(self.detokenize(toks)):  # a weak model repeating itself
                    self.looped = True
                    self._gen.cancel()
                    self.tokens = list(toks)
                    self.finish_reason = "length"
                    self._finish()
                    return True
                return False
            self.tokens = list(self._gen.result())
            self.finish_reason = getattr(self._gen, "finish_reason", None) or (
                "length" if len(self.tokens) >= self.max_tokens else "stop")
            if getattr(self._gen, "error", None):
                self.error = self._gen.error
        except Exception as e:  # noqa: BLE001
            self.error = e
        self._finish()
        return True

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until finished or ``timeout`` (default: what is left of the attempt's own timeout)."""
        if self._done:
            return True
        left = self.timeout - self.elapsed if timeout is None else timeout
        deadline = time.perf_counter() + max(0.0, left)
        while not self.poll():
            rem = deadline - time.perf_counter()
            if rem <= 0:
                return False
            job = self._gen or self._prefill
            try:
                if job is not None and hasattr(job, "result") and job is self._gen:
                    job.result(timeout=min(rem, 0.5))
                else:
                    time.sleep(min(rem, 0.005))
            except Exception:  # timeout or job error: poll() records it
                pass
        return True

    def cancel(self):
        self._cancelled = True
        for j in (self._gen, self._prefill):
            try:
                if j is not None and not j.done():
                    j.cancel()
            except Exception:
                pass

    def outcome(self):
        """``(text, failure_reason_or_None)``."""
        if self.fault in ("timeout",):
            return "", "timeout"
        if not self._done and self.timed_out:
            return "", "timeout"
        text = ""
        if self.error is None and self.tokens:
            try:
                text = self.detokenize(self.tokens)
            except Exception as e:  # noqa: BLE001
                self.error = e
        fr = self.finish_reason
        if self.fault == "empty":
            text = ""
        elif self.fault == "over_length":
            fr = "length"
        elif self.fault == "tool_call":
            text = '{"name": "compact_conversation", "arguments": {}}'
        reason = validate(text, len(self.tokens), fr, self.error, self.max_tokens)
        return text.strip(), reason


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


__all__ = ["FIRST_HEADING", "looks_like_tool_call", "Summarizer", "Attempt", "summarizer_request", "summary_message", "fallback_summary", "validate",
           "FAILURES", "SUMMARY_HEADER"]
