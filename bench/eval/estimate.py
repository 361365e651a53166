"""Estimate a run's duration from a measured one:

    python -m bench.eval.estimate bench/results/eval-smollm2-135m-small.json --scale 4 \
        --prefill-tps 115 --decode-tps 12 --episodes 10

Per policy, the measured tokens per episode (prefill; decode; probe; background) are scaled by ``--scale``
(history tokens of the target run / of the measured one: window x ratio; the number of compactions and
the size of each grow with both) and priced at the target model's speeds on the target machine: prefill
and probe rows at ``--prefill-tps``, reply tokens at ``--decode-tps``; background rows (summary tokens and
the prepared context, batched with the foreground) at the decode speed for their summary share and the
prefill speed for the rest (``--bg-decode-share``, default 0.3). Synchronous summaries are counted in the
measured prefill rows; their generated share (``--sync-decode-share`` of prefill, default 0.05) is priced
at the decode speed."""
from __future__ import annotations

import argparse
import json
import sys


def estimate(metrics: dict, families: int, episodes: int, scale: float, prefill_tps: float, decode_tps: float,
             bg_decode_share: float = 0.3, sync_decode_share: float = 0.05) -> dict:
    out = {}
    for pol, fams in metrics.items():
        m = fams["all"]
        t = {k: v / m["episodes"] * scale for k, v in m["tokens"].items()}
        sync = t["prefill"] * sync_decode_share
        s = ((t["prefill"] - sync + t["probe"]) / prefill_tps + (t["decode"] + sync) / decode_tps
             + t["background"] * (bg_decode_share / decode_tps + (1 - bg_decode_share) / prefill_tps))
        out[pol] = {"s_per_episode": s, "s_total": s * families * episodes}
    out["all_policies_h"] = sum(v["s_total"] for v in out.values()) / 3600
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--scale", type=float, default=4.0)
    ap.add_argument("--prefill-tps", type=float, default=115.0)
    ap.add_argument("--decode-tps", type=float, default=12.0)
    ap.add_argument("--families", type=int, default=5)
    ap.add_argument("--episodes", type=int, default=10)
    a = ap.parse_args(argv)
    data = json.load(open(a.results))
    print(json.dumps(estimate(data["metrics"], a.families, a.episodes, a.scale, a.prefill_tps, a.decode_tps),
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
