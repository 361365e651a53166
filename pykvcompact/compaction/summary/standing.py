"""The standing instructions a model's summary files: what it may keep there, and the user's words it must.

A small model files the summary request's own sentences as the user's instructions, copies the user's
kept messages there a second time, or answers "none" where the request listed user messages to copy.  By
structure (which words are the request's and which the user's, which lines the summary message carries
verbatim anyway), not by what an instruction looks like.
"""
from __future__ import annotations

from typing import List

from .keeper import budget_items, merge_standing, not_the_request, standing_key, trim_standing, words_of
from .summarizer import summarizer_request


class StandingCheck:
    """``checked(lines, summary, plan, level, count)``: a model summary's standing-instruction lines, as the
    summary message carries them."""

    def __init__(self, transcript, shares):
        self.transcript, self.shares = transcript, shares
        self._request_vocab = None       # the request's words (built once)
        self._user_vocab: set = set()    # the user's words so far (grown as messages come)
        self._user_vocab_upto = 0

    def checked(self, lines: List[str], summary, plan, level: int, count) -> List[str]:
        lines = not_the_request(lines, self._request_words(), self._user_words())
        if level < 2:   # (a plan of level 2 or more is for a pool without room, and may leave kept messages out)
            # the listed user messages the model did not copy, within the room its text left (a summary
            # message grown past its plan leaves the raw tail no room: the schedule restarts its preparation
            # on every call)
            room = max(0, self.shares.text() - summary.tokens)
            lines = merge_standing(lines, trim_standing(self._uncopied(plan, summary.text, count), room, count))
            # a line the summary message carries verbatim anyway (a kept user message) is said once: the
            # default model copied the user's requests ("Next ticket: TCK-53844 ...") under them
            kept = [standing_key(c.content) for c in plan.kept if c.role == "user"]
            lines = [x for x in lines if not any(standing_key(x) in k for k in kept)]
        return lines

    def _request_words(self) -> set:
        """The words of the summary request's own sentences (no user message or instruction in it)."""
        if self._request_vocab is None:
            self._request_vocab = words_of(summarizer_request(self.transcript.path, 100, has_earlier=True))
        return self._request_vocab

    def _user_words(self) -> set:
        """The words of the user's messages so far (not summaries or recalled lines)."""
        msgs = self.transcript.messages
        for m in msgs[self._user_vocab_upto:]:
            if (m.get("role") == "user" and not m.get("summary") and not m.get("recall")
                    and isinstance(m.get("content"), str)):
                self._user_vocab |= words_of(m["content"])
        self._user_vocab_upto = len(msgs)
        return self._user_vocab

    def _uncopied(self, plan, text: str, count) -> List[str]:
        """The over-budget user messages the request listed that the model's text does not carry word for
        word (punctuation and case aside), as they were listed: the user's words are never left to the
        model (a model that answered "none" under the standing instructions lost them)."""
        listed, _ = budget_items([c.content for c in plan.overflow], self.shares.listed(), count)
        said = standing_key(text or "")
        return [u for u in listed if standing_key(u) not in said]


__all__ = ["StandingCheck"]
