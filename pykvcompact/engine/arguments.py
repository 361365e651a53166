"""Checks of the engine's arguments, shared by Engine and Sequence: a bad value raises a clear TypeError or
ValueError before llama.cpp sees it."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

import numpy as np


def physical_cores() -> int:
    """Physical cores (not hyperthreads) available to this process; llama.cpp scales with those."""
    try:
        allowed = os.sched_getaffinity(0)
        cores = set()
        cpu = None
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            phys = None
            for line in f:
                key, _, val = line.partition(":")
                key, val = key.strip(), val.strip()
                if key == "processor":
                    cpu = int(val)
                elif key == "physical id":
                    phys = val
                elif key == "core id" and cpu in allowed:
                    cores.add((phys, val))
        if cores:
            return max(1, min(len(cores), len(allowed)))
        return max(1, len(allowed))
    except (OSError, ValueError, AttributeError):
        return max(1, os.cpu_count() or 1)


def token_list(tokens: Any, what: str = "tokens") -> list[int]:
    if isinstance(tokens, (str, bytes)):
        raise TypeError(f"{what} must be a list of token ids, not text; use engine.tokenize(text) first")
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
            raise TypeError(f"{what} must be a 1-D array of integers, got {tokens.dtype} with shape {tokens.shape}")
        return [int(t) for t in tokens]
    if not isinstance(tokens, Iterable):
        raise TypeError(f"{what} must be a list of token ids, got {type(tokens).__name__}")
    out = []
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"{what} must contain integer token ids, found {t!r}")
        if not -(2**31) <= int(t) < 2**31:
            raise ValueError(f"token id {int(t)} is out of range")
        out.append(int(t))
    return out


def check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_share(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"background_share must be a number between 0 and 1 (or None: by backend), got {value!r}")
    try:
        share = float(value)
    except OverflowError:   # an int too large for a float
        share = math.inf
    if not 0.0 <= share <= 1.0:   # NaN fails this too
        raise ValueError(f"background_share must be between 0 and 1 (or None: by backend), got {value}")
    return share + 0.0   # -0.0 is 0
