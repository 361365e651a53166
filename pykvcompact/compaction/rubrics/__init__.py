"""Rubric texts for the compaction probe (see pykvcompact.compaction.rubrics.load)."""
from __future__ import annotations

from pathlib import Path

_DIR = Path(__file__).resolve().parent


def names() -> list:
    """Names of the built-in rubrics."""
    return sorted(p.stem for p in _DIR.glob("*.txt"))


def load(rubric: str) -> str:
    """The text of a built-in rubric by name (``default``, ``math``, ``search``, ``coding``), a rubric file
    path, or ``rubric`` itself when it is custom text (anything with whitespace in it)."""
    if not isinstance(rubric, str) or not rubric.strip():
        raise ValueError("rubric must be a rubric name, a file path or the rubric text")
    key = rubric.strip()
    p = _DIR / f"{key}.txt"
    if "/" not in key and "\\" not in key and p.is_file():
        return p.read_text(encoding="utf-8").strip()
    if not any(c.isspace() for c in key):
        fp = Path(key)
        if fp.suffix == ".txt" and fp.is_file():
            return fp.read_text(encoding="utf-8").strip()
        raise ValueError(f"unknown rubric {rubric!r}: built-in rubrics are {names()}; pass custom rubric text "
                         f"(a sentence or more) or a path to a .txt file")
    return key


__all__ = ["load", "names"]
