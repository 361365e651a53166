"""The policies compared, as ``pk.Policy`` settings on one engine per model.

``full`` gives the session a window big enough for the whole episode (the ceiling: nothing is ever
compacted); ``none`` truncates (the floor); ``fixed``, ``hard``, ``rubric``, ``background`` and ``tool``
are the session's modes; ``peer`` is llama-cpp-python's ``Llama`` driven by a harness (``peer_worker``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

POLICIES = ("full", "none", "fixed", "hard", "rubric", "background", "tool", "peer")
SEARCH = "+search"   # a suffix: the same policy with the search_history tool (the others run without it)
NO_PROBE = "+noprobe"   # a suffix of background: the schedule alone, the probe never asked (its cost, measured)


def is_known(name: str) -> bool:
    """A policy name: one of POLICIES, ``background+noprobe``, and either with ``+search`` (not full, peer)."""
    if name.endswith(SEARCH):
        base = name[:-len(SEARCH)]
        return base not in ("full", "peer") and not base.endswith(SEARCH) and is_known(base)
    if name.endswith(NO_PROBE):
        return name[:-len(NO_PROBE)] == "background"
    return name in POLICIES
RUBRIC_OF_FAMILY = {"ledger": "default", "search": "search", "code": "coding", "math": "math",
                    "instructions": "default"}


@dataclass
class Settings:
    window: int = 2048
    reply_tokens: int = 24         # the model's reply after each tool result
    # the reply to each final question: the longest answer of the agent families is 33 tokens (a data
    # family's s3 path); at 24 every policy's answer to it was cut and scored wrong
    answer_tokens: int = 48
    summary_max_tokens: Optional[int] = None   # None: the policy's default (window // 8)
    probe_every: int = 256
    ratio: float = 4.0             # episode history / window
    compact_tool: bool = True      # offer compact_conversation in every summarizing mode (always in ``tool``)
    rubric: str = "boundary"       # the probe's rubric ("family": each family's own, RUBRIC_OF_FAMILY)
    tool_latency: float = 0.0      # seconds each scripted tool call takes (the engine is idle meanwhile)
    rebase: str = "exact"          # the summarizing modes' Policy.rebase ("splice": the tail's cells shifted)
    keep_recent: Optional[float] = None   # the summarizing modes' Policy.keep_recent (None: its default)
    sub_goals: Optional[int] = None   # an episode's sub-goals and steps per sub-goal (None: Size.for_window's)
    steps: Optional[int] = None

    @classmethod
    def quick(cls) -> "Settings":
        # the tool schema costs ~300 tokens on SmolLM2: offered only in ``tool`` mode in a quick run
        return cls(window=1024, reply_tokens=8, answer_tokens=12, probe_every=128, ratio=3.0, compact_tool=False)


STANDARD_POLICIES = ("full", "hard", "background", "peer")


def standard() -> Settings:
    """The standard run's settings (``python -m bench.eval --standard``): the default window, shorter
    episodes (4 sub-goals of 4 steps, history 3x the window) so that every family at 2 seeds under
    full, hard, background and the peer fits in about 2 hours on a 2-core CPU."""
    return Settings(window=2048, ratio=3.0, reply_tokens=16, answer_tokens=48, sub_goals=4, steps=4)


def full_window(settings: Settings) -> int:
    """A window that holds the whole episode, its replies and the questions."""
    return int(settings.window * (settings.ratio + 1.5)) + 512


def make_policy(name: str, family: str, settings: Settings):
    """``name`` is one of POLICIES but the peer, optionally with the ``+search`` suffix."""
    import pykvcompact as pk

    search = name.endswith(SEARCH)
    name = name[:-len(SEARCH)] if search else name
    no_probe = name.endswith(NO_PROBE)
    name = name[:-len(NO_PROBE)] if no_probe else name
    common = dict(summary_max_tokens=settings.summary_max_tokens, probe_every=settings.probe_every,
                  rubric=RUBRIC_OF_FAMILY.get(family, "default") if settings.rubric == "family" else settings.rubric,
                  history_tool=search)
    if name == "full":
        return pk.Policy(mode="none", window=full_window(settings), compact_tool=False, **common)
    if name == "none":
        return pk.Policy(mode=name, window=settings.window, compact_tool=settings.compact_tool, **common)
    if no_probe:
        common.update(probe_on_tool_result=False, probe_every=2 ** 31)
    if settings.keep_recent is not None:
        common.update(keep_recent=settings.keep_recent)
    if name in ("fixed", "hard", "rubric", "background"):
        return pk.Policy(mode=name, window=settings.window, compact_tool=settings.compact_tool,
                         rebase=settings.rebase, **common)
    if name == "tool":
        return pk.Policy(mode="tool", window=settings.window, compact_tool=True, rebase=settings.rebase, **common)
    raise ValueError(f"unknown policy {name!r} (the peer runs in its own process)")
