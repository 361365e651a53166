"""What the benchmark scripts share: writing a run's result."""
from __future__ import annotations

import json
import pathlib
from typing import Optional


def write_result(result: dict, out: Optional[str]) -> str:
    """``result`` as indented JSON, written to ``out`` (its folder created) when one is given; the text is
    returned for the caller to print."""
    text = json.dumps(result, indent=2)
    if out:
        path = pathlib.Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return text
