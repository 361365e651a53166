"""What the agent families (agent_families.py) share: an episode drafted step by step (``Draft``), the plan of
which sub-goal states which asked value (``plan``), the steps written from a family's step makers
(``write_steps``), and the redraw that keeps every asked value in exactly one message at its place
(``generate``)."""
from __future__ import annotations

import json
import random
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from .episode import Episode, Fact, Question, Size, Step

ATTEMPTS = 200
Slot = Tuple[str, Optional[str]]          # (step kind, place of the asked value it states, or None)


def shared() -> Tuple[str, str]:
    """families.ASK and families.SYSTEM, imported on use: families.py imports this module at its end."""
    from .families import ASK, SYSTEM
    return ASK, SYSTEM


class Draft:
    """An episode being written: steps in order, and each asked value with the message that states it."""

    def __init__(self, rng: random.Random, size: Size):
        self.rng, self.size, self.rows = rng, size, size.rows
        self.steps: List[Step] = []
        self.questions: List[Question] = []
        self.facts: List[Fact] = []

    def ask(self, place: str, prompt: str, answer: str, source: str = "output") -> None:
        """A question on a value stated by the step being built (the next one appended)."""
        self.questions.append(Question(prompt + shared()[0], answer, place != "recent", place))
        self.facts.append(Fact(len(self.steps), answer, source))

    # Line budgets: a long output (a file, a page, a thread), a medium one and a short one.
    def long(self) -> int:          # at least 17: a "middle" value needs a text of 15+ lines around it
        return max(17, 3 * self.rows + 2)

    def medium(self) -> int:
        return 2 * self.rows + 1


def plan(size: Size, early: Sequence[Slot], recent: str, head: Sequence[str],
          fillers: Union[Sequence[str], Callable[[int], Sequence[str]]], tail: Sequence[str],
          order: Sequence[str]) -> List[Tuple[List[Slot], bool]]:
    """Per sub-goal: its step slots in order, and whether the mid-session user fact is sent in it.

    The early facts go round-robin into the first ~60% of the sub-goals (so they are compacted away by the
    end), the recent one into the last.  Fillers (a list, or one per sub-goal) pad a sub-goal to
    ``size.steps``; the optional tail goes first when a sub-goal has more facts than room."""
    n = size.sub_goals
    n_early = max(1, min(n - 1, round(0.6 * n)))
    carry: List[List[Slot]] = [[] for _ in range(n)]
    for i, fact in enumerate(early):
        carry[i % n_early].append(fact)
    carry[-1].append((recent, "recent"))
    plans = []
    for g in range(n):
        facts = [f for f in carry[g] if f[0] != "user"]
        places = dict(facts)
        first = [(k, places.get(k)) for k in head]
        last = [(k, places.get(k)) for k in tail]
        mid = [f for f in facts if f[0] not in head and f[0] not in tail]
        free = [k for k in (fillers(g) if callable(fillers) else fillers) if k not in places]
        while len(first) + len(mid) + len(last) < size.steps and free:
            mid.append((free.pop(0), None))
        while len(first) + len(mid) + len(last) > size.steps and last and last[0][1] is None:
            last.pop(0)
        mid.sort(key=lambda s: order.index(s[0]))
        plans.append((first + mid + last, len(facts) < len(carry[g])))
    return plans


def write_steps(d: Draft, plans, makers: Dict[str, Callable[[int, Optional[str], bool], Step]],
           opener: Callable[[int], str], user_fact: Callable[[int], str]) -> None:
    """Make the steps: the sub-goal's request opens it, the user fact goes on its third step, and about one
    step in three carries the assistant's own statement (always the one stating an "assistant" value)."""
    for g, (slots, has_user) in enumerate(plans):
        for j, (kind, place) in enumerate(slots):
            notes = [opener(g)] if j == 0 else []
            if has_user and j == min(2, len(slots) - 1):
                notes.append(user_fact(g))   # registers its question on this step, before the step is added
            step = makers[kind](g, place, place == "assistant" or j % 3 == 1)
            notes += [step.user] if step.user else []
            step.user = "\n\n".join(notes) or None
            step.subgoal, step.opens, step.closes = g, j == 0, j == len(slots) - 1
            d.steps.append(step)


def _messages(ep: Episode) -> List[Tuple[int, str, str]]:
    """Every text the model sees, as (step, source, text): the task is step -1; tool-call arguments count."""
    out = [(-1, "output", ep.task)]
    for i, s in enumerate(ep.steps):
        out += [(i, src, t) for src, t in (("user", s.user), ("args", json.dumps(s.args)), ("output", s.output),
                                           ("say", s.say)) if t]
    return out


def _problems(ep: Episode) -> List[str]:
    """Why this draw cannot be used: an asked value that shows up in another message or in a question, or
    that does not sit where its place says."""
    msgs, prompts = _messages(ep), " ".join(q.prompt for q in ep.questions).lower()
    bad = []
    for q, f in zip(ep.questions, ep.facts):
        a = q.answer.lower()
        hits = [(i, src) for i, src, t in msgs if a in t.lower()]
        if a in prompts or hits != [(f.step, f.source)]:
            bad.append(f"{q.answer}: in {hits}, or in a prompt")
            continue
        text = ep.source_text(f)
        if q.place == "middle":
            lines = text.split("\n")
            at = next(k for k, line in enumerate(lines) if a in line.lower())
            if len(lines) < 15 or not 0.3 <= at / len(lines) <= 0.7:
                bad.append(f"{q.answer}: line {at} of {len(lines)}")
        if q.place == "json":
            try:
                json.loads(text)
            except ValueError:
                bad.append(f"{q.answer}: not JSON")
    return bad


def generate(name: str, seed: int, size: Size, build: Callable[[random.Random, int, Size], Episode]) -> Episode:
    rng = random.Random(f"{name}-{seed}")
    problems: List[str] = []
    for _ in range(ATTEMPTS):
        ep = build(rng, seed, size)
        problems = _problems(ep)
        if not problems:
            return ep
    raise RuntimeError(f"{name} seed {seed} {size}: no clean draw in {ATTEMPTS} tries ({problems})")


def pick(rng: random.Random, pool: Sequence[str], k: int) -> List[str]:
    """k distinct items (pool items are reused with a numeric suffix when k exceeds the pool)."""
    base = rng.sample(list(pool), min(k, len(pool)))
    return base + [f"{rng.choice(pool)}_{i + 2}" for i in range(k - len(base))]
