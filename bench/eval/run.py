"""Run every (family, seed) episode under every policy: ours on one engine in this process, then, family
by family, the peer in its own subprocess (never both at once: two ggml thread pools steal each other's
cores).  ``checkpoint(results)`` is called after each episode, so a long run leaves partial results, and
a run given them back (``previous``) runs only the episodes they lack."""
from __future__ import annotations

import os
from typing import Callable, List

from .families import FAMILIES
from .policies import Settings, full_window
from .runner import run_episode
from .sizing import fit


def run_all(args, settings: Settings, history_dir: str, log: Callable[[str], None],
            checkpoint: Callable[[List[dict]], None] = lambda results: None, previous: List[dict] = ()) -> List[dict]:
    import pykvcompact as pk
    from pykvcompact.models.registry import resolve_model

    threads = args.threads or os.cpu_count() or 1
    model_path = str(resolve_model(args.model))
    ours = [p for p in args.policies if p != "peer"]
    n_ctx = max(full_window(settings), 2 * settings.window + 1024) + 256
    results: List[dict] = list(previous)   # a resumed run's episodes, never run again
    done = {(r["family"], r["seed"], r["policy"]) for r in results}
    skipped = args.skipped = {}  # policy -> why it cannot run at this window (in the JSON's meta)
    engine = pk.Engine(model_path, n_ctx=n_ctx, n_seq_max=8, n_threads=threads)
    try:
        for family in args.families:
            shape = (settings.sub_goals, settings.steps) if settings.sub_goals and settings.steps else None
            episodes = [fit(FAMILIES[family], args.seed + i, settings.window, engine.tokenize, quick=args.quick,
                            ratio=settings.ratio, shape=shape) for i in range(args.episodes)]
            for ep in episodes:
                for pol in ours:
                    if (family, ep.seed, pol) in done:
                        continue
                    why = infeasible(engine, ep, pol, settings, history_dir)
                    if why:  # e.g. fixed (30%) at a small window: the tools alone fill its trigger
                        skipped.setdefault(pol, why)
                        log(f"{family:12} seed {ep.seed:5} {pol:10} skipped: {why}")
                        continue
                    results.append(run_episode(engine, ep, pol, settings, history_dir))
                    log(_line(results[-1]))
                    checkpoint(results)  # an episode is minutes to hours: never lose one to a later failure
            peer_episodes = [ep for ep in episodes if (family, ep.seed, "peer") not in done]
            if "peer" in args.policies and peer_episodes:
                from .peer import run_peer

                for r in run_peer(model_path, peer_episodes, settings, threads, args.peer_timeout):
                    results.append(r)
                    log(_line(r))
            checkpoint(results)
    finally:
        engine.close()
    return results


def infeasible(engine, ep, policy_name: str, settings: Settings, history_dir: str) -> str:
    """Why the session of ``policy_name`` cannot be created for ``ep`` ("" when it can)."""
    import pykvcompact as pk

    from .policies import make_policy
    try:
        pk.Session(engine, system=ep.system, policy=make_policy(policy_name, ep.family, settings), tools=ep.tools,
                   history_dir=history_dir, session_id=f"preflight-{ep.family}-{ep.seed}").close()
    except ValueError as e:
        return str(e)
    return ""


def _line(r: dict) -> str:
    ok = sum(a["correct"] for a in r["answers"])
    return (f"{r['family']:12} seed {r['seed']:5} {r['policy']:10} {ok}/{len(r['answers'])} correct  "
            f"{r['tokens']['total']:6d} tokens  {r['wall_s']:6.1f} s  {len(r['compactions'])} compactions")
