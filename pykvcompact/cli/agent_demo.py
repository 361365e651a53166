"""A scripted long multi-turn agent session on a small window (``pykvcompact agent``).

The agent works through a few small "tasks" in a fake repository: each step the user asks something, the
agent reads a file or runs the tests (the tool calls and their results are scripted, so the run is
reproducible with any model), and the model answers.  The context crosses the window several times; the
compaction events are printed as they happen, and a final summary reports probes, rebases and the stall
at each swap.

    from pykvcompact.cli.agent_demo import run_agent_demo
    run_agent_demo("smollm2-135m", turns=24, window=1024, mode="background")
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Callable, Optional

TASKS = [
    ("parser", "src/parser.py", "Fix the off-by-one in parse_range so that the end is inclusive."),
    ("cache", "src/cache.py", "Add a max_items limit to LRUCache and evict the oldest entry."),
    ("cli", "src/cli.py", "Make --verbose print the elapsed time of each command."),
    ("docs", "README.md", "Document the new --limit flag in the usage section."),
]


def _file_body(task: str, path: str, step: int) -> str:
    lines = [f"# {path} (step {step})", f"def {task}_main(args):", f"    limit = {10 + step}"]
    for k in range(10):
        lines.append(f"    value_{k} = compute_{task}({k}, limit)  # line {k + 4}")
    lines.append(f"    return {task}_result(limit)")
    return "\n".join(lines)


def _tests_output(task: str, step: int, passed: bool) -> str:
    n = 12 + step % 5
    if passed:
        return f"============ {n} passed in 0.{step % 9 + 1}s ============"
    return (f"FAILED tests/test_{task}.py::test_{task}_{step} - AssertionError: expected {step + 3}, got {step + 2}\n"
            f"============ 1 failed, {n - 1} passed in 0.{step % 9 + 1}s ============")


def _script(turns: int):
    """(user message, tool name, arguments, tool output) per turn."""
    out = []
    per_task = max(3, turns // len(TASKS) + 1)
    for i in range(turns):
        task, path, goal = TASKS[(i // per_task) % len(TASKS)]
        k = i % per_task
        if k == 0:
            user = f"New task: {goal} Start by reading {path}."
            tool, args, res = "read_file", {"path": path}, _file_body(task, path, i)
        elif k < per_task - 1:
            user = f"Apply the next change for the {task} task and run the tests."
            tool, args, res = "run_tests", {"path": f"tests/test_{task}.py"}, _tests_output(task, i, passed=False)
        else:
            user = f"Run the tests again and tell me whether the {task} task is done."
            tool, args, res = "run_tests", {"path": f"tests/test_{task}.py"}, _tests_output(task, i, passed=True)
        out.append((user, tool, args, res))
    return out


TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file of the repository.",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                     "required": ["path"]}}},
    {"type": "function", "function": {"name": "run_tests", "description": "Run a test file with pytest.",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                     "required": ["path"]}}},
]


def run_agent_demo(model=None, turns: int = 24, window: int = 2048, mode: str = "background", *,
                   engine=None, n_ctx: Optional[int] = None, max_tokens: int = 32,
                   summary_max_tokens: Optional[int] = None,
                   probe_every: int = 64, rubric: str = "coding", history_dir: str = "conversation_history",
                   session_id: Optional[str] = None, show_text: bool = False, n_threads: Optional[int] = None,
                   out: Callable[[str], None] = print) -> dict:
    """Run the scripted agent session and return its summary (also printed through ``out``).

    ``model``: a GGUF path or registry name (``"smollm2-135m"`` is the fast one; ``None`` the default model).
    ``engine``: reuse an existing engine instead (``model``/``n_ctx`` are then ignored).
    """
    import pykvcompact as pk

    if turns < 1:
        raise ValueError("turns must be >= 1")
    policy = pk.Policy(mode=mode, window=window, summary_max_tokens=summary_max_tokens, probe_every=probe_every,
                       rubric=rubric)
    own = engine is None
    if own:
        need = n_ctx or (2 * window + 1536)
        engine = pk.Engine(model, n_ctx=need, n_seq_max=8, n_threads=n_threads)
    t_start = time.perf_counter()
    session = pk.Session(engine, system="You are a careful coding agent working in a small repository. "
                                        "Answer in one or two short sentences.",
                         policy=policy, tools=TOOLS, history_dir=history_dir, session_id=session_id)
    out(f"agent demo: model={getattr(engine, 'model_name', model)} mode={mode} window={session.window} "
        f"n_ctx={engine.n_ctx} turns={turns} history={session.history_path}")
    peak = 0
    peak_cells = 0
    gen_tokens = 0
    turn_ms = []
    try:
        for i, (user, tool, args, result) in enumerate(_script(turns)):
            t0 = time.perf_counter()
            call = {"id": f"call_{i}", "type": "function", "function": {"name": tool, "arguments": json.dumps(args)}}
            msgs = [{"role": "user", "content": user},
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": call["id"], "name": tool, "content": result}]
            text = []
            for x in session.stream(msgs, max_tokens=max_tokens):
                if isinstance(x, str):
                    text.append(x)
                else:
                    out(f"  [turn {i:3d}] {_fmt_event(x)}")
            r = session.last_response
            gen_tokens += r["usage"]["completion_tokens"]
            turn_ms.append((time.perf_counter() - t0) * 1000.0)
            peak = max(peak, len(session.tokens))
            peak_cells = max(peak_cells, engine.used_cells())
            reply = "".join(text).strip().replace("\n", " ")
            out(f"turn {i:3d} fill={session.fill:4.2f} tokens={len(session.tokens):5d} "
                f"{turn_ms[-1] / 1000:5.1f}s  " + (reply[:100] if show_text else f"reply: {len(reply)} chars"))
        summary = summarize_events(session.events)
        summary.update({
            "mode": mode, "window": session.window, "n_ctx": engine.n_ctx, "turns": turns,
            "peak_tokens": peak, "peak_used_cells": peak_cells, "never_exceeded_window": peak <= session.window,
            "generated_tokens": gen_tokens, "elapsed_s": round(time.perf_counter() - t_start, 2),
            "turn_ms_median": round(statistics.median(turn_ms), 1), "turn_ms_max": round(max(turn_ms), 1),
            "history_file": session.history_path, "offloaded_messages": len(session.offloaded),
            "transcript_messages": len(session.transcript),
        })
        out("summary: " + json.dumps(summary))
        return summary
    finally:
        session.close()
        if own:
            engine.close()


def _fmt_event(e) -> str:
    d = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in e.to_dict().items() if k not in ("t", "event")}
    return e.name + " " + " ".join(f"{k}={v}" for k, v in d.items())


def summarize_events(evs) -> dict:
    probes = [e for e in evs if e.name == "probe"]
    reb = [e for e in evs if e.name == "rebased"]
    ready = [e for e in evs if e.name == "summary_ready"]
    stalls = [e.stall_ms for e in reb]
    by_trigger = {}
    for e in reb:
        by_trigger[e.trigger] = by_trigger.get(e.trigger, 0) + 1
    return {
        "probes": len(probes),
        "probe_compress": sum(1 for e in probes if e.verdict == "COMPRESS"),
        "probe_ms_median": round(statistics.median([e.ms for e in probes]), 1) if probes else None,
        "rebases": len(reb),
        "rebases_by_trigger": by_trigger,
        # a partition: the model's summary prepared; the deterministic one (at the edge, or chosen when the
        # model had no time: then prepared too); neither (waited for the model's summary)
        "rebases_prepared": sum(1 for e in reb if e.prepared and not getattr(e, "fallback", False)),
        "rebases_fallback": sum(1 for e in reb if getattr(e, "fallback", False)),
        "rebases_waited": sum(1 for e in reb if not e.prepared and not getattr(e, "fallback", False)),
        "wait_ms_max": round(max((getattr(e, "wait_ms", 0.0) for e in reb), default=0.0), 1),
        "worst_stall_ms": round(max((getattr(e, "worst_stall_ms", 0.0) for e in reb), default=0.0), 1),
        "stall_ms": [round(x, 1) for x in stalls],
        "stall_ms_median": round(statistics.median(stalls), 1) if stalls else None,
        "stall_ms_max": round(max(stalls), 1) if stalls else None,
        "summaries": len(ready),
        "summary_fallbacks": sum(1 for e in ready if e.fallback),
        "summary_ms_median": round(statistics.median([e.ms for e in ready]), 1) if ready else None,
        "summary_failures": sum(1 for e in evs if e.name == "summary_failed"),
        "preparation_restarts": sum(1 for e in evs if e.name == "preparation_restarted"),
        "dropped": sum(1 for e in evs if e.name == "dropped"),
        "probes_skipped": sum(1 for e in evs if e.name == "probe_skipped"),
        "tool_refused": sum(1 for e in evs if e.name == "tool_refused"),
    }


def main(argv=None) -> int:  # python -m pykvcompact.cli.agent_demo [model] [mode] [turns] [window]
    argv = list(sys.argv[1:] if argv is None else argv)
    model = argv[0] if argv else "smollm2-135m"
    mode = argv[1] if len(argv) > 1 else "background"
    turns = int(argv[2]) if len(argv) > 2 else 24
    window = int(argv[3]) if len(argv) > 3 else 2048
    run_agent_demo(model, turns=turns, window=window, mode=mode)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
