"""Run every (family, seed) episode under every policy: ours on one engine in this process, the peer in
its own subprocess afterwards (never both at once: two ggml thread pools steal each other's cores)."""
from __future__ import annotations

import os
from typing import Callable, List

from .families import FAMILIES
from .policies import Settings, full_window
from .runner import run_episode
from .sizing import fit


def physical_cores() -> int:
    return max(1, (os.cpu_count() or 2))


def run_all(args, settings: Settings, history_dir: str, log: Callable[[str], None]) -> List[dict]:
    import pykvcompact as pk
    from pykvcompact.models import resolve_model

    threads = args.threads or physical_cores()
    model_path = resolve_model(args.model)
    ours = [p for p in args.policies if p != "peer"]
    n_ctx = max(full_window(settings), 2 * settings.window + 1024) + 256
    results: List[dict] = []
    engine = pk.Engine(str(model_path), n_ctx=n_ctx, n_seq_max=8, n_threads=threads)
    try:
        episodes = [fit(FAMILIES[f], args.seed + i, settings.window, engine.tokenize, quick=args.quick,
                        ratio=settings.ratio) for f in args.families for i in range(args.episodes)]
        for ep in episodes:
            for pol in ours:
                r = run_episode(engine, ep, pol, settings, history_dir)
                results.append(r)
                log(_line(r))
    finally:
        engine.close()
    if "peer" in args.policies:
        from .peer import run_peer

        for r in run_peer(str(model_path), episodes, settings, threads, args.peer_timeout):
            results.append(r)
            log(_line(r))
    return results


def _line(r: dict) -> str:
    ok = sum(a["correct"] for a in r["answers"])
    return (f"{r['family']:12} seed {r['seed']:5} {r['policy']:10} {ok}/{len(r['answers'])} correct  "
            f"{r['tokens']['total']:6d} tokens  {r['wall_s']:6.1f} s  {len(r['compactions'])} compactions")
