"""Run every (family, seed) episode under every policy: ours on one engine in this process, then, family
by family, the peer in its own subprocess (never both at once: two ggml thread pools steal each other's
cores).  ``checkpoint(results)`` is called after each family, so a long run leaves partial results."""
from __future__ import annotations

import os
from typing import Callable, List

from .families import FAMILIES
from .policies import Settings, full_window
from .runner import run_episode
from .sizing import fit


def run_all(args, settings: Settings, history_dir: str, log: Callable[[str], None],
            checkpoint: Callable[[List[dict]], None] = lambda results: None) -> List[dict]:
    import pykvcompact as pk
    from pykvcompact.models import resolve_model

    threads = args.threads or os.cpu_count() or 1
    model_path = str(resolve_model(args.model))
    ours = [p for p in args.policies if p != "peer"]
    n_ctx = max(full_window(settings), 2 * settings.window + 1024) + 256
    results: List[dict] = []
    engine = pk.Engine(model_path, n_ctx=n_ctx, n_seq_max=8, n_threads=threads)
    try:
        for family in args.families:
            episodes = [fit(FAMILIES[family], args.seed + i, settings.window, engine.tokenize, quick=args.quick,
                            ratio=settings.ratio) for i in range(args.episodes)]
            for ep in episodes:
                for pol in ours:
                    results.append(run_episode(engine, ep, pol, settings, history_dir))
                    log(_line(results[-1]))
            if "peer" in args.policies:
                from .peer import run_peer

                for r in run_peer(model_path, episodes, settings, threads, args.peer_timeout):
                    results.append(r)
                    log(_line(r))
            checkpoint(results)
    finally:
        engine.close()
    return results


def _line(r: dict) -> str:
    ok = sum(a["correct"] for a in r["answers"])
    return (f"{r['family']:12} seed {r['seed']:5} {r['policy']:10} {ok}/{len(r['answers'])} correct  "
            f"{r['tokens']['total']:6d} tokens  {r['wall_s']:6.1f} s  {len(r['compactions'])} compactions")
