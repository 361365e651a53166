"""What a summary message carries verbatim: the user's own messages, pinned messages, earlier facts.

A summary that paraphrases "never modify billing.py" loses it.  So the rebased context keeps the user's
messages verbatim (newest first, within ``keep_user_tokens``; the first user message — the task — and
pinned messages always), and the summary of an earlier summary copies that summary's text forward instead
of summarizing it again (facts decay through summaries of summaries otherwise).  Pure functions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import json
import re
from typing import Callable, List, Optional, Sequence, Tuple

USERS_HEADING = "User messages, verbatim (oldest first):"
CARRIED_HEADING = "Earlier summary, carried verbatim:"
STANDING_HEADING = "Standing instructions:"
# the headings the summarizer asks for (summarizer.summarizer_request; the older ones too), in markdown or
# numbered, "Next steps" in the plural, and a heading alone on its line without a colon: an unrecognised
# heading is read as part of the section above it (a "Next steps:" under the standing instructions became
# an instruction, and pushed the user's own out when they were trimmed oldest first).  No shorter forms
# ("Files:", "Decision:"): a user's rule may begin with those
_HEADINGS = (r"standing instructions?", r"goal", r"verified facts", r"decisions", r"files and artifacts",
             r"open items", r"next steps?")
_HEADING_RE = re.compile(r"^\s*(?:[#*>\-]+\s*|\d+[.)]\s*)*\**\s*(" + "|".join(_HEADINGS) +
                         r")\s*\**\s*(?::|(?=\s*$))\s*\**\s*(.*)$", re.IGNORECASE)
# the labels of the deterministic fallback summary (summarizer.fallback_summary) end a section too
_FALLBACK_RE = re.compile(r"^\s*(\(automatic summary|(last user request|summarized messages|tools called|first user "
                          r"request|files mentioned|earlier summary|last assistant reply)\s*[:\u2026])", re.IGNORECASE)
# (a label cut short by the fallback's last-resort truncation ends in "…" rather than ":")
# a line that says there is nothing: "none", "(none)", "N/A", "-" ("None failed." says something)
_NONE_RE = re.compile(r"^[\s\-*•.(]*(none|n/?a|nothing)?[\s.)]*$", re.IGNORECASE)


def message_text(msg: dict) -> str:
    """What a kept message shows verbatim: its text, and the calls of an assistant tool-call message."""
    c = msg.get("content")
    text = c if isinstance(c, str) else ""
    calls = []
    for tc in msg.get("tool_calls") or []:
        f = tc.get("function", tc) if isinstance(tc, dict) else {}
        args = f.get("arguments", "")
        if not isinstance(args, str):
            args = json.dumps(args)
        calls.append(f"(called {f.get('name', '?')} with arguments {args})")
    return "\n".join(x for x in [text] + calls if x)


def split_standing(text: str) -> Tuple[List[str], str]:
    """``(standing instruction lines, the rest of text)``: the lines under a "Standing instructions:"
    heading of a summary (up to the next known heading), without empty or "none" lines."""
    standing, rest, inside = [], [], False
    for line in (text or "").split("\n"):
        m = _HEADING_RE.match(line)
        if m:
            inside = m.group(1).lower().startswith("standing instruction")
            if inside:
                if not _NONE_RE.match(m.group(2)):
                    standing.append(m.group(2).strip())
                continue
        elif _FALLBACK_RE.match(line):
            inside = False
        if inside:
            if not _NONE_RE.match(line):
                standing.append(line.strip())
        else:
            rest.append(line)
    return standing, "\n".join(rest).strip()


_WORD = re.compile(r"[^\W_][\w./:@-]*[^\W_]|[^\W_]", re.UNICODE)


def words_of(text: str) -> set:
    """The words of ``text``, lower case (a CJK run counts as one)."""
    return {w.lower() for w in _WORD.findall(text or "")}


def not_the_request(lines: Sequence[str], request_words: set, user_words: set) -> List[str]:
    """The lines of a model's "Standing instructions" that are not the summary request's own sentences: a
    line goes when most of its words are the request's and at least as many of them are only the request's
    as only the user's (a tie goes: the user's own message is kept verbatim elsewhere).  Qwen2.5-Coder-1.5B
    filed "Do not call any tool." and "Save the full messages in ..." there (evaluation families); carried
    forward as standing instructions they would steer every later turn.  A rule the user gave in other
    words or another language stays (it shares little with the request)."""
    out = []
    for line in lines:
        words = [w.lower() for w in _WORD.findall(line)]
        asked = sum(w in request_words for w in words)
        theirs = sum(w in request_words and w not in user_words for w in words)
        users = sum(w in user_words and w not in request_words for w in words)
        if words and not (asked * 5 >= 3 * len(words) and theirs and theirs >= users):
            out.append(line)
    return out


def standing_key(line: str) -> str:
    """What two copies of one instruction share: its words, lower case (bullets, quotes, punctuation and
    spacing aside)."""
    return " ".join(w.lower() for w in _WORD.findall(line.replace("\u2019", "'")))


def merge_standing(*groups: Sequence[str]) -> List[str]:
    """The lines of ``groups`` in order, without duplicates (whitespace and a leading bullet ignored)."""
    out, seen = [], set()
    for g in groups:
        for line in g:
            key = standing_key(line)
            if key and key not in seen:
                seen.add(key)
                out.append(line.strip())
    return out


def trim_standing(lines: Sequence[str], budget: int, count: Callable[[str], int]) -> List[str]:
    """``lines`` within ``budget`` tokens (with their heading), dropping the oldest first."""
    lines = list(lines)
    while lines and count(STANDING_HEADING + "\n" + "\n".join(lines)) > budget:
        lines.pop(0)
    return lines


CUT_MARK = " [… middle left out …] "   # the summary's header names the history file holding it whole
MIN_CLIPPED = 40   # tokens: a must-keep message is clipped to no less (less would keep little but the mark)


WORD_REACH = 40   # characters a cut moves to reach a space or a line break (past that: a long run, cut inside it)


def _whole_words(text: str, keep: int) -> Tuple[str, str]:
    """The first and last ``keep`` characters of ``text``, each cut back to the nearest whitespace (a line
    break too) within WORD_REACH characters, so that no word is split or silently dropped at the mark:
    a tail that started inside "…dump\nNever delete" must not start at "delete"."""
    head, tail = text[:keep], text[len(text) - keep:]
    if keep < len(text) and not text[keep].isspace():
        cut = max(head.rfind(c) for c in " \n\t")
        if cut >= 0 and keep - cut <= WORD_REACH:
            head = head[:cut]
    start = len(text) - keep
    if start > 0 and not text[start - 1].isspace():
        cut = min((i for i in (tail.find(c) for c in " \n\t") if i >= 0), default=-1)
        if 0 <= cut <= WORD_REACH:
            tail = tail[cut:]
    return head, tail


def clip_middle(text: str, budget: int, count: Callable[[str], int], mark: str = " … ",
                squash: bool = True) -> str:
    """``text`` within ``budget`` tokens, cutting its middle (a constraint at the end of a long message
    survives as well as one at its start); ``squash``: whitespace runs become one space first."""
    text = " ".join((text or "").split()) if squash else (text or "").strip()
    if count(text) <= budget:
        return text
    lo, hi = 0, len(text) // 2
    best = ""
    while lo <= hi:  # the largest head/tail length that fits
        mid = (lo + hi) // 2
        head, tail = text[:mid], text[len(text) - mid:]
        if not squash:
            head, tail = _whole_words(text, mid)
        cand = head.rstrip() + mark + tail.lstrip()
        if count(cand) <= budget:
            best, lo = cand, mid + 1
        else:
            hi = mid - 1
    return best


def budget_items(items: Sequence[str], budget: int, count: Callable[[str], int], least: int = 16
                 ) -> Tuple[List[str], int]:
    """``(listed, omitted)``: ``items`` within ``budget`` tokens in all, oldest first.  Each takes its fair
    share of what is left (short ones whole, so the share they leave goes to the later ones; a long one
    its middle cut; one under ``2 * least`` tokens is never cut); when the next does not fit, it and the
    newer ones are omitted (their number is returned)."""
    items = [" ".join((x or "").split()) for x in items]
    items = [x for x in items if x]
    out, left = [], budget
    for k, x in enumerate(items):
        size = count(x) + 2
        share = max(least, left // (len(items) - k))
        if size <= left and (size <= share or size <= 2 * least):
            out.append(x)
            left -= size
        elif size > 2 * least and min(share, left) >= least:
            cut = clip_middle(x, min(share, left) - 2, count)
            out.append(cut)
            left -= count(cut) + 2
        else:
            break
    return out, len(items) - len(out)


@dataclass(frozen=True)
class Candidate:
    tidx: int          # transcript index
    role: str
    content: str
    tokens: int
    pinned: bool = False
    first: bool = False   # the first user message of the session (the task)


@dataclass
class SummaryMeta:
    """What a summary message holds besides the header: the kept messages and its summary text."""
    kept: List[Candidate] = field(default_factory=list)
    body: str = ""      # carried text + the new summary text (what the next summary carries forward)
    standing: List[str] = field(default_factory=list)   # its standing instructions (carried with priority)
    results: List[str] = field(default_factory=list)    # its key results, verbatim (results.py)
    left_out: int = 0                                   # results left out for space (its section says so)


def clipped(c: Candidate, budget: int, count: Callable[[str], int]) -> Optional[Candidate]:
    """``c`` with its middle cut so that it fits ``budget`` tokens (its head and its end verbatim, line
    breaks kept, a mark where the cut is); None when less than ``MIN_CLIPPED`` tokens are left for it."""
    if budget < MIN_CLIPPED:
        return None
    text = clip_middle(c.content, budget - 4, count, mark=CUT_MARK, squash=False)
    if not text or CUT_MARK.strip() not in text:
        return None
    return Candidate(c.tidx, c.role, text, count(text) + 4, c.pinned, c.first)


def plan_kept(cands: Sequence[Candidate], budget: int, must_limit: Optional[int] = None,
              count: Optional[Callable[[str], int]] = None) -> Tuple[List[Candidate], List[Candidate]]:
    """``(kept, overflow)``: pinned messages and the first user message first (the first user message,
    then pinned ones oldest first, while they fit in ``must_limit`` tokens; None: no limit); then other
    user messages newest first while all fit in ``budget`` tokens. Both lists in transcript order; no
    duplicates: a user message whose text repeats one already kept ("Run the tests." every turn) is kept
    once, at its newest. A message in neither list is not a user message (or a pinned one), or a repeat.
    With ``count`` (text -> tokens), a first or pinned message over what is left of ``must_limit`` is kept
    clipped in its middle (:func:`clipped`) and is in ``overflow`` too (the summarizer sees it whole): the
    user's own words are never all dropped while there is room for their head and end."""
    seen, uniq = set(), []
    for c in cands:
        if c.tidx not in seen:
            seen.add(c.tidx)
            uniq.append(c)
    kept, overflow, used = [], [], 0
    texts = set()
    over = []
    for c in sorted((c for c in uniq if c.pinned or c.first), key=lambda c: (not c.first, c.tidx)):
        if must_limit is None or used + c.tokens <= must_limit:
            kept.append(c)
            used += c.tokens
            texts.add(same_text(c.content))
        else:
            over.append(c)
    for c in over:   # clipped with what the whole ones left (a pinned message that fits stays whole)
        overflow.append(c)
        # (half of what is left, MIN_CLIPPED at least: a clipped message as large as the budget made each
        # summary so large that the raw tail outgrew a small window after every message, and
        # preparations restarted)
        left = must_limit - used
        short = clipped(c, min(left, max(MIN_CLIPPED, left // 2)), count) if count is not None else None
        if short is not None:
            kept.append(short)
            used += short.tokens
            texts.add(same_text(c.content))
    for c in reversed([c for c in uniq if not (c.pinned or c.first)]):
        if c.role == "user" and same_text(c.content) in texts:
            continue
        if c.role == "user":
            texts.add(same_text(c.content))
        if c.role == "user" and used + c.tokens <= budget:
            kept.append(c)
            used += c.tokens
        elif c.role == "user":
            overflow.append(c)
    order = lambda c: c.tidx  # noqa: E731
    return sorted(kept, key=order), sorted(overflow, key=order)


def same_text(text: str) -> str:
    """``text`` as compared for repeats: whitespace collapsed, lower case."""
    return " ".join((text or "").split()).lower()


def users_section(kept: Sequence[Candidate]) -> str:
    """The kept messages under their heading (a pinned message that is not the user's says so)."""
    return USERS_HEADING + "\n" + "\n".join(
        (f"[{c.role}, pinned] " if c.pinned and c.role != "user" else "") + c.content for c in kept)


def trim_lines(text: str, budget: int, count: Callable[[str], int]) -> str:
    """``text`` within ``budget`` tokens, dropping its oldest lines first (headings stay when possible)."""
    if budget <= 0 or not text:
        return ""
    lines = text.split("\n")
    while lines and count("\n".join(lines)) > budget:
        lines.pop(0)
    return "\n".join(lines)


def compose(header: str, kept: Sequence[Candidate], carried: str, text: str,
            standing: Sequence[str] = (), results: str = "") -> str:
    """The summary message's content: the kept messages, the standing instructions (an earlier summary's
    and this one's, merged), the carried text, the new summary text (without its standing instructions),
    and last the key results (``results``: their section, results.py).  The results come last because
    the model's own summary can contradict them (measured: a summary listed distractors as "verified
    facts" above the copied registry lines, and the model answered from the nearer, wrong list)."""
    parts = [header]
    if kept:
        parts.append(users_section(kept))
    parts.append(STANDING_HEADING + ("\n" + "\n".join(standing) if standing else " none"))
    if carried.strip():
        parts.append(CARRIED_HEADING + "\n" + carried.strip())
    if text.strip():
        parts.append(text.strip())
    if results:
        parts.append(results)
    return "\n\n".join(parts)


__all__ = ["Candidate", "SummaryMeta", "plan_kept", "trim_lines", "compose", "USERS_HEADING", "CARRIED_HEADING",
           "STANDING_HEADING", "message_text", "split_standing", "merge_standing", "trim_standing", "clip_middle", "clipped",
           "budget_items", "same_text", "users_section"]
