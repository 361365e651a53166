"""Answers are scored by normalised match: the expected value must appear in the reply as a whole token
(case-insensitive, thousands separators and surrounding quotes or markup ignored)."""
from __future__ import annotations

import re

# Answers to the final questions are one line of plain text: small models otherwise start a tool call
# (the tool schemas are in the system prompt) and run out of tokens inside it. The same for every policy.
ANSWER_GRAMMAR = 'root ::= [^<{\\[\\n] [^\\n]*'


def normalise(text: str) -> str:
    t = (text or "").lower()
    t = re.sub(r"(?<=\d),(?=\d{3}\b)", "", t)        # 5,032.39 -> 5032.39
    t = re.sub(r"[`*\"']", "", t)
    return " ".join(t.split())


def is_correct(reply: str, answer: str) -> bool:
    want = normalise(answer)
    if not want:
        return False
    return re.search(r"(?<![a-z0-9])" + re.escape(want) + r"(?![a-z0-9])", normalise(reply)) is not None


def carries(summary: str, fact: str) -> bool:
    """A summary carries a fact when the fact's text appears verbatim (case-insensitive)."""
    return fact.lower() in (summary or "").lower()
