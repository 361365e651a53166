"""Size an episode to a multiple of the window with the model's own tokenizer (token counts differ a lot
between families: SmolLM2 spells every digit as its own token)."""
from __future__ import annotations

from typing import Callable, List, Optional, Tuple

from .episode import Episode, Size

STEP_OVERHEAD = 40   # the template's headers, the scripted tool call and a short reply


def episode_tokens(ep: Episode, tokenize: Callable[[str], List[int]]) -> int:
    return sum(len(tokenize(s.output)) + len(tokenize(s.user or "")) + len(tokenize(s.say or "")) + STEP_OVERHEAD
               for s in ep.steps)


def fit(make: Callable[[int, Size], Episode], seed: int, window: int, tokenize, *, quick: bool = False,
        ratio: float = 4.0, shape: Optional[Tuple[int, int]] = None) -> Episode:
    """The episode of ``make`` for ``seed`` whose history is about ``ratio`` x ``window`` tokens;
    ``shape`` = (sub-goals, steps per sub-goal), else Size.for_window's."""
    base = Size.for_window(window, quick)
    if shape:
        base = Size(shape[0], shape[1], base.rows)
    lo, hi = Size(base.sub_goals, base.steps, 3), Size(base.sub_goals, base.steps, 12)
    t_lo, t_hi = (episode_tokens(make(seed, s), tokenize) for s in (lo, hi))
    per_row = max(1e-6, (t_hi - t_lo) / (hi.rows - lo.rows))
    rows = max(2, round(lo.rows + (ratio * window - t_lo) / per_row))
    return make(seed, Size(base.sub_goals, base.steps, rows))
