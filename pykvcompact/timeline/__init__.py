"""A session's record over time (record.py) and its PNG plots (plots.py, which loads matplotlib: import it
from there).  ``pykvcompact.timeline.Timeline`` is the name the module of that name had."""

from .record import Timeline

__all__ = ["Timeline"]
