"""Four task families shaped like real agent work: a coding agent fixing a repo, a research agent reading
the web, a support agent working a ticket queue, a data agent analysing a warehouse.

Each episode is ``Size.sub_goals`` sub-goals of ``Size.steps`` tool steps whose outputs look like the real
thing (source files, pytest runs, git, JSON, psql tables, pandas reprs, ticket threads, policies, search
results, web pages).  The asked values live in different places (``episode.PLACES``): only in the
assistant's own statement, in the middle of a long output, inside a JSON output, in a user message sent
mid-session, and one control question on the last sub-goal.  Every asked value occurs in exactly one
message of the episode; ``agent_draft.generate`` draws again until that holds.
"""
from __future__ import annotations

from typing import Callable, Dict

from .agent_coding import build_coding
from .agent_data import build_data
from .agent_draft import generate
from .agent_research import build_research
from .agent_support import build_support
from .episode import Episode, Size


def coding(seed: int, size: Size) -> Episode:
    return generate("coding", seed, size, build_coding)


def research(seed: int, size: Size) -> Episode:
    return generate("research", seed, size, build_research)


def support(seed: int, size: Size) -> Episode:
    return generate("support", seed, size, build_support)


def data(seed: int, size: Size) -> Episode:
    return generate("data", seed, size, build_data)


AGENT_FAMILIES: Dict[str, Callable[[int, Size], Episode]] = {"coding": coding, "research": research,
                                                              "support": support, "data": data}
