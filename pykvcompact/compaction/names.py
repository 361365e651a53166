"""What a message names, by syntax: the things the recall (``recall.py``) looks for in the offloaded history.

A path or dotted name (``services/auth/config.toml``), an identifier with an underscore, a digit or inner
capitals (``max_pool_size``, ``ACC-1042``, ``build_77``, ``getUserById``), a number of three or more
digits, a quoted string, a proper noun of several capitalised words (``Eastholm County Council``).  No
list of words that matter: a plain word ("total", "config", "failed") is not a name, whatever it means.
The texts scanned are a user message's and an assistant's tool-call arguments (the function's own name is
not a name the user gave).
"""
from __future__ import annotations

import json
import re
from typing import Callable, List, Set

from .tools import history_search

FLAG = "recall"           # marks the recall's own messages (never a source of names)
SCAN_HEAD = 8000          # characters of a message scanned: its head and its tail (a question after a paste)
SCAN_TAIL = 4000

# Syntax only.  A quoted string (not a JSON key: no ':' after it), or a word of letters, digits and the
# joiners . - / : _ @ (an absolute path keeps its leading slash).
_QUOTED = re.compile(r'"([^"\n]{3,80})"(?!\s*:)|\u201c([^\u201d\n]{3,80})\u201d|`([^`\n]{2,80})`'
                     r"|(?<!\w)'([^'\n]{3,80})'(?!\w)")
_WORD = re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w,])|(?<![\w.])/?\w(?:[\w.\-/:@]*\w)?")
# A proper noun of several words ("Eastholm County Council", "Dr Alice Trevelyan's"): capitalised words in a
# row (a possessive 's is not part of the name).
_WORDS = re.compile(r"[^\W\d_][\w'\u2019\-]*")
_CAMEL = re.compile(r"[a-z][A-Z]")
_DIGITS = re.compile(r"\d")
_SEPARATORS = str.maketrans("", "", ".,:-")


def is_name(word: str) -> bool:
    """Does ``word`` look like an identifier by its syntax?  A number of at least three digits (a date or a
    time too); a word with an underscore, with a digit and a letter, or with inner capitals; a dotted
    name whose parts are not single letters (``config.toml``, ``db.pool.size``, not "e.g"); a path: an
    absolute one, or one with two slashes, or a slash and a dot, digit or underscore ("and/or" is words)."""
    if len(word) < 3 or not any(c.isalnum() for c in word):
        return False
    digits = len(_DIGITS.findall(word))
    if digits and digits == len(word.translate(_SEPARATORS)):
        return digits >= 3                       # a number: of several digits
    if "_" in word or (digits and any(c.isalpha() for c in word)) or _CAMEL.search(word):
        return True
    if "/" in word:
        return word.startswith("/") or word.count("/") >= 2 or "." in word
    if "." in word:
        return len(word) >= 4 and any(len(p) > 1 for p in word.split(".")) and all(word.split("."))
    return False


def proper_nouns(text: str) -> List[str]:
    """Runs of two or more capitalised words separated by single spaces or tabs ("Eastholm County Council",
    "Société Générale", "O'Brien Consulting"), without a leading function word ("The", "What"); a possessive
    's is not part of the name."""
    out: List[str] = []
    run: List[str] = []
    end = -1

    def flush():
        while run and run[0].lower() in history_search.STOP_WORDS:
            run.pop(0)
        if len(run) >= 2:
            out.append(" ".join(run))
        run.clear()

    for m in _WORDS.finditer(text):
        word = re.sub(r"['\u2019]s$", "", m.group(0))
        capital = word[:1].isupper() and any(c.islower() for c in word[1:])
        if not capital or (run and text[end:m.start()] not in (" ", "\t")):
            flush()
        if capital:
            run.append(word)
            end = m.end()
            if word != m.group(0):   # "Trust's": the name ends here
                flush()
    flush()
    return out


def names_in(text: str) -> List[str]:
    """The names ``text`` gives, in order, without repeats (case-insensitive): quoted strings, then the
    identifier-like words (outside the quotes as well as inside them)."""
    if not isinstance(text, str) or not text:
        return []
    text = clip_scan(text)
    out: List[str] = []
    for m in _QUOTED.finditer(text):
        q = " ".join(next((g for g in m.groups() if g), "").split())
        if len(q) >= 3 and history_search.terms(q):
            out.append(q)
    out += proper_nouns(text)
    for m in _WORD.finditer(text):
        w = m.group(0).rstrip(".:-/@")
        if is_name(w):
            out.append(w)
    seen: Set[str] = set()
    uniq = []
    for n in out:
        if n.lower() not in seen:
            seen.add(n.lower())
            uniq.append(n)
    return uniq


def _strings(value, out: List[str], depth: int = 0) -> None:
    """The strings (and numbers) in parsed tool-call arguments: values, not keys."""
    if depth > 8:
        return
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out.append(str(value))
    elif isinstance(value, dict):
        for v in value.values():
            _strings(v, out, depth + 1)
    elif isinstance(value, list):
        for v in value[:64]:
            _strings(v, out, depth + 1)


def call_text(call) -> str:
    """The argument values of one tool call as text (the function's own name is not a name the user gave)."""
    f = call.get("function", call) if isinstance(call, dict) else None
    args = f.get("arguments") if isinstance(f, dict) else None
    if isinstance(args, str):
        try:
            args = json.loads(args) if len(args) <= 4 * (SCAN_HEAD + SCAN_TAIL) else args
        except ValueError:
            pass   # not JSON: its text is scanned as it is
    out: List[str] = []
    _strings(args, out)
    return "\n".join(out)


def text_of(msg: dict, skip_calls: Callable[[dict], bool] = lambda c: False) -> str:
    """What a message says that may name things: a user message's text, an assistant message's tool-call
    arguments (except calls ``skip_calls`` says the session answers itself); "" for anything else."""
    if not isinstance(msg, dict) or msg.get("summary") or msg.get(FLAG):
        return ""
    if msg.get("role") == "user":
        c = msg.get("content")
        if isinstance(c, list):   # content parts (normalized away by the session, but cheap to accept)
            c = "\n".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in c)
        return c if isinstance(c, str) else ""
    if msg.get("role") == "assistant" and isinstance(msg.get("tool_calls"), list):
        return "\n".join(call_text(c) for c in msg["tool_calls"] if not skip_calls(c))
    return ""


def names_of_message(msg: dict, skip_calls: Callable[[dict], bool] = lambda c: False) -> List[str]:
    """The names a message gives (:func:`text_of`, :func:`names_in`)."""
    return names_in(text_of(msg, skip_calls))


def clip_scan(text: str) -> str:
    return text if len(text) <= SCAN_HEAD + SCAN_TAIL else text[:SCAN_HEAD] + "\n" + text[-SCAN_TAIL:]


__all__ = ["clip_scan", "is_name", "proper_nouns", "names_in", "call_text", "text_of", "names_of_message", "FLAG"]
