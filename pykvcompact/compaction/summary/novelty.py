"""What a model's summary says that the summary message does not already carry.

The summary message carries the user's messages, the standing instructions, the earlier summaries' text
and the key results on its own (keeper.py, results.py); the model's text is worth its cost only for
what it adds, and a model that keeps adding nothing is not asked (compaction/summary/summaries.py).  Measured on Qwen2.5-Coder-1.5B (evaluation episodes, window 2048): 21 of 21 summaries
read "none" under every heading, and the rest restated the user's request as "Goal:" and "Next step:",
while each one slowed the conversation's steps about threefold for three to five steps.  Pure functions.
"""
from __future__ import annotations

import re
from typing import List, Sequence

from .summarizer import NEXT_STEP_LINE
from .keeper import _FALLBACK_RE, _HEADING_RE, _NONE_RE

_ECHOED = NEXT_STEP_LINE.lower().rstrip(".")
MIN_NOVEL_WORDS = 3   # fewer new plain words (and no new number, id or path): it repeats what the message carries

_FACTLIKE_RE = re.compile(r"\d|[_./]|[a-z][A-Z]")
_WORD_RE = re.compile(r"[A-Za-z_][\w./-]*\w|\d[\d.,:/-]*\d|\d")
_PLAIN = frozenset("""standing instructions goal verified facts decisions files artifacts open items next step none
that this with from then them their have been were will what when which into each also only more some than after
before above below about there here they does done the and for are was its it's not but all any can must should
would could user wants wanted asked asks work task tasks continue continued conversation summary""".split())


def informative(text: str) -> str:
    """``text`` without what says nothing: a heading whose value is "none" (or empty) with nothing under it,
    a bare "none" line, a heading line it already had.  "" when nothing is left."""
    lines = (text or "").split("\n")
    out, seen = [], set()
    for i, line in enumerate(lines):
        s = line.strip()
        if _plain(s) == _ECHOED and not _has_body(lines, i + 1):
            continue   # the extractive summary's last line, copied by the model: the raw tail follows anyway
        m = _HEADING_RE.match(line)
        if m and _NONE_RE.match(m.group(2)) and not _has_body(lines, i + 1):
            continue
        if (not m and s and _NONE_RE.match(s)) or (m and s in seen):
            continue   # (only a heading line twice is a repeat: code and listed values may repeat)
        if m:
            seen.add(s)
        if s or (out and out[-1].strip()):
            out.append(line)
    return "\n".join(out).strip()


def _plain(line: str) -> str:
    """A line without its bullet, emphasis and final period, lower case, single-spaced."""
    return " ".join(line.replace("*", " ").replace("_", " ").lstrip("-•> ").split()).lower().rstrip(".")


def _has_body(lines: Sequence[str], j: int) -> bool:
    """Is there a line that says something between ``lines[j]`` and the next heading?"""
    for line in lines[j:]:
        if _HEADING_RE.match(line) or _FALLBACK_RE.match(line):
            return False
        if not _NONE_RE.match(line):
            return True
    return False


def novel_words(text: str, known: str) -> List[str]:
    """The words of ``text`` that ``known`` does not contain (case-insensitive): numbers, identifiers,
    paths and words of four letters or more, less headings and function words, each once."""
    have = {w.lower() for w in _WORD_RE.findall(known or "")}
    out = []
    for w in _WORD_RE.findall(text or ""):
        lw = w.lower()
        if lw in have or lw in _PLAIN or (len(lw) < 4 and not any(c.isdigit() for c in lw)):
            continue
        have.add(lw)
        out.append(w)
    return out


def says_something_new(text: str, known: str) -> bool:
    """Does ``text`` add to ``known``: a number, an identifier or a path it lacks (one is a fact), or
    MIN_NOVEL_WORDS plain words?"""
    new = novel_words(text, known)
    return len(new) >= MIN_NOVEL_WORDS or any(_FACTLIKE_RE.search(w) for w in new)


__all__ = ["informative", "novel_words", "says_something_new", "MIN_NOVEL_WORDS"]
