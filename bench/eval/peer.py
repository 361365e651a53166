"""Launch the peer's episodes in a subprocess (``peer_worker``) and read their results back."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from typing import List

from .episode import Episode
from .launch import command
from .policies import Settings



def run_peer(model_path: str, episodes: List[Episode], settings: Settings, n_threads: int,
             timeout_s: float) -> List[dict]:
    with tempfile.TemporaryDirectory(prefix="pkv-eval-peer-") as tmp:
        job, out = os.path.join(tmp, "job.json"), os.path.join(tmp, "out.json")
        json.dump({"model_path": str(model_path), "window": settings.window, "n_threads": n_threads,
                   "reply_tokens": settings.reply_tokens, "answer_tokens": settings.answer_tokens,
                   "tool_latency": settings.tool_latency,
                   "summary_tokens": settings.summary_max_tokens or min(512, settings.window // 8),
                   "episodes": [e.to_dict() for e in episodes]}, open(job, "w"))
        proc = subprocess.run(command("bench.eval.peer_worker", job, out), cwd=tmp,
                              capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"the peer worker failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return json.load(open(out))
