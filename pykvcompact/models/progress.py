"""Progress bars (tqdm, on stderr) for work that may take more than a couple of seconds: joining split
model packages, hashing a large model, long runs. A bar appears only after ``delay`` seconds, so quick
work prints nothing; ``set_enabled(False)`` (the CLI's ``--quiet`` / ``--json``) or
``PYKVCOMPACT_PROGRESS=0`` turns them off."""
from __future__ import annotations

import os
import sys

_enabled = os.environ.get("PYKVCOMPACT_PROGRESS", "1") != "0"


def set_enabled(flag: bool) -> None:
    global _enabled
    _enabled = bool(flag)


class _Silent:
    def update(self, n=1):
        pass

    def set_postfix_str(self, s=""):
        pass

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def bar(total=None, desc: str = "", unit: str = "it", unit_scale: bool = False, delay: float = 2.0):
    """A tqdm bar used as a context manager (``update(n)``), or a silent stand-in when disabled."""
    if not _enabled:
        return _Silent()
    try:
        from tqdm.auto import tqdm
    except ImportError:  # progress is a convenience, never a requirement
        return _Silent()
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, unit_divisor=1024 if unit == "B" else 1000,
                delay=delay, file=sys.stderr, leave=False, dynamic_ncols=True)
