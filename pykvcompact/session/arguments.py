"""Checks of the Session constructor's arguments: a clear TypeError or ValueError before anything is built."""
from __future__ import annotations

from typing import Optional, Sequence

from ..chat.messages import check_json
from ..compaction.policy import Policy
from ..engine.port import check_engine


def check_arguments(engine, policy: Optional[Policy], system: Optional[str], recall_tokens: Optional[int]) -> Policy:
    """The policy to use (``Policy()`` for None); raises on a bad engine, policy, system prompt or recall
    budget."""
    policy = Policy() if policy is None else policy
    if recall_tokens is not None and (not isinstance(recall_tokens, int) or isinstance(recall_tokens, bool)
                                      or recall_tokens < 0):
        raise ValueError(f"recall_tokens must be an int >= 0 or None, got {recall_tokens!r}")
    if not isinstance(policy, Policy):
        raise TypeError("policy must be a pykvcompact.Policy")
    if system is not None and not isinstance(system, str):
        raise TypeError("system must be a str")
    check_json(system, "system")
    check_engine(engine)
    return policy


def check_labels(labels: Sequence[str]) -> tuple:
    """The probe's labels as a tuple; raises unless they are at least two distinct non-empty strings."""
    if isinstance(labels, str) or not isinstance(labels, (list, tuple)) or len(labels) < 2 or \
            not all(isinstance(x, str) and x for x in labels) or len(set(labels)) != len(labels):
        raise ValueError(f"labels must be a list of at least two distinct non-empty strings, got {labels!r}")
    check_json(list(labels), "labels")
    return tuple(labels)


__all__ = ["check_arguments", "check_labels"]
