"""A module of this checkout (``bench.eval...``) run in a child Python.

``bench/`` is not installed, so the child needs the checkout on ``sys.path`` -- but appended, after
site-packages: first (``cwd``, ``PYTHONPATH``), the checkout's ``pykvcompact/`` source tree would shadow
the installed package and its compiled module. Callers run the command from a directory outside it."""
from __future__ import annotations

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
_BOOT = ("import runpy, sys; sys.path.append(sys.argv[1]); mod = sys.argv[2]; sys.argv = [mod] + sys.argv[3:]; "
         "runpy.run_module(mod, run_name='__main__', alter_sys=True)")


def command(module: str, *args: str) -> list:
    return [sys.executable, "-c", _BOOT, str(REPO), module, *map(str, args)]
