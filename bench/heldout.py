"""Held-out agent histories: what survives compaction on tasks the project was not tuned on (issue 33).

Written apart from ``bench/eval`` (none of its generators, wording or scoring): each episode is an agent's
tool-call history replayed into a :class:`pykvcompact.Session` with ``Session.add`` (assistant tool calls with
ids, tool results, the assistant's own short text messages), then questions asked one ``Session.chat`` each and
scored by exact value match (the value appears in the reply, not inside a longer number or word).

Task kinds (``--kinds``), each with seeded names, keys and values:

``sre``
    an SRE auditing service configs (TOML, YAML, JSON and INI files of 25-40 lines that all share the same
    keys with different values), log tails, ``kubectl`` and ``df`` output.
``analyst``
    a data analyst running SQL (psql-style result tables of 18-34 rows, ``EXPLAIN ANALYZE`` plans, schemas,
    CSV heads); the assistant computes medians and totals and states them in prose.
``review``
    a code-review agent reading Python modules of 50-110 lines (shared constant names across files),
    ``git diff``/``git log`` output and pytest runs with ``[100%]`` and warnings.

Fact categories, about two questions each per episode:

``stated``
    a value the assistant itself stated in a plain text message right after a read (or computed: the
    analyst's median), read in the first quarter of the history;
``middle``
    a value that lives only in the middle of a long tool output, never restated, read in the first quarter;
``instruction``
    a standing rule from the first user message (a ticket id, a forbidden path, a schema, a branch prefix),
    asked at the end and answered by a value or name.

Other files of the same kind carry the same keys with other values, so the answer needs the right file, not
just the key.  Histories are filled with ordinary work (other reads, logs, queries, diffs) up to
``--history-tokens`` (default 9000) so that a window of 2048 compacts several times.

Modes (``--modes``): ``full`` is mode ``none`` with a window that holds the whole episode (the ceiling); any
other name is a ``pykvcompact.Policy`` mode at ``--window`` (default 2048).  Reported per mode: accuracy per
category and overall; tokens the engine evaluated (``engine.stats()`` rows: foreground, probe, background);
wall seconds; compactions (``rebased`` events, of which ``fallback``); worst stall (``session.worst_stall_ms``);
how many asked values the summary messages contain, per category (the summaries' fact recall); how many are in
the live context just before the questions; ``recalled`` events (automatic recall of offloaded lines) and
``history_searched`` events (the model's or recall's searches).

    PYTHONPATH=. python -m bench.heldout --model smollm2-135m --episodes 1 --kinds sre --modes full,hard \
        --history-tokens 5000 --out bench/results/heldout-smollm2-smoke

writes ``OUT.json`` and ``OUT.md``.  Progress goes to stderr.  SmolLM2 has an 8k training context: keep
``--history-tokens`` at about 5000 with it when ``full`` is among the modes.  Questions are asked one after
the other in the same session (the Session API has no cheap fork of a session's state), so the quiz itself
can trigger compactions; a question the model answers with a call of the agent's tools gets the result
"tool access has ended" and one more reply.  Each tool output is kept under ~730 tokens: a step larger than
the window less the system prompt (455 tokens with the tool header on SmolLM2) raises ContextWindowError.

First measurements (2026-12-06, 2 shared CPU cores, ``--threads 1``, kind ``sre``, seed 1, window 2048;
``bench/results/heldout-*``):

- SmolLM2-135M, ~4.8k-token history: ``full`` 0/6 (150 s), ``hard`` 3/6 (207 s, 13 compactions, 9 of them
  fallback summaries, 2 ``recalled``).
- Qwen2.5-Coder-1.5B, ~6.5k-token history: ``full`` 5/6 (232 s), ``hard`` 6/6 (511 s, 15 compactions, 11
  fallback, 2 ``recalled``: both middle-of-output values came back through recall, not the summary; worst
  stall 48.9 s).  One episode: no conclusion about accuracy yet.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional

from .heldout_episodes import CATEGORIES, KINDS, MAKERS, Episode, log, make_episode


def contains(text: str, value: str) -> bool:
    """``value`` appears in ``text`` as a whole token (not inside a longer number, word or path)."""
    if not text:
        return False
    v = re.escape(value.strip().lower())
    return re.search(rf"(?<![\w.\-/]){v}(?![\w/]|\.\d)", text.lower()) is not None


def message_text(m: dict) -> str:
    parts = [m.get("content") or ""]
    for c in m.get("tool_calls") or []:
        parts.append(json.dumps(c.get("function", {}).get("arguments", "")))
    return "\n".join(parts)


# ====================================================================== running
def make_policy(mode: str, window: int, full_window: int):
    import pykvcompact as pk
    if mode == "full":
        return pk.Policy(mode="none", window=full_window)
    return pk.Policy(mode=mode, window=window)


def rows(stats: dict) -> dict:
    return dict(stats["rows"])


def ask(session, prompt: str, max_tokens: int) -> dict:
    """One question; a call of the agent's own tools (re-reading the file) is answered with 'tools are
    unavailable' and the model replies once more."""
    r = session.chat(prompt, max_tokens=max_tokens)
    msg = r["choices"][0]["message"]
    out = {"reply": msg.get("content") or "", "tool_calls": [], "completion_tokens": r["usage"]["completion_tokens"]}
    if msg.get("tool_calls"):
        out["tool_calls"] = [c["function"]["name"] + " " + c["function"].get("arguments", "") for c in msg["tool_calls"]]
        session.add([{"role": "tool", "tool_call_id": c["id"],
                      "content": "Tool access has ended for this review; answer from the conversation so far."}
                     for c in msg["tool_calls"]])
        r = session.chat([], max_tokens=max_tokens)
        out["reply"] = (out["reply"] + "\n" + (r["choices"][0]["message"].get("content") or "")).strip()
        out["completion_tokens"] += r["usage"]["completion_tokens"]
    return out


def run_episode(engine, ep: Episode, mode: str, args, full_window: int, history_dir: str) -> dict:
    import pykvcompact as pk
    policy = make_policy(mode, args.window, full_window)
    before = rows(engine.stats())
    t0 = time.perf_counter()
    s = pk.Session(engine, system=ep.system, policy=policy, tools=ep.tools, history_dir=history_dir,
                   session_id=f"heldout-{ep.kind}-{ep.seed}-{mode}-{int(time.time())}")
    answers = []
    try:
        s.add({"role": "user", "content": ep.task})
        n_steps = len(ep.steps)
        for i, step in enumerate(ep.steps):
            if args.tool_latency > 0:
                t1 = time.perf_counter()
                s.idle(args.tool_latency)
                time.sleep(max(0.0, args.tool_latency - (time.perf_counter() - t1)))
            s.add(step)
            if i % 5 == 4 or i == n_steps - 1:
                n_reb = sum(e.name == "rebased" for e in s.events)
                log(f"  [{ep.kind}/{ep.seed}/{mode}] step {i + 1}/{n_steps} fill={s.fill:.2f} tokens={s.n_tokens} "
                    f"compactions={n_reb} t={time.perf_counter() - t0:.0f}s")
        live = "\n".join(message_text(m) for m in s.messages)
        history_wall = time.perf_counter() - t0
        for q in ep.questions:
            a = ask(s, q.prompt, args.answer_tokens)
            a.update(category=q.category, prompt=q.prompt, answer=q.answer, where=q.where,
                     correct=contains(a["reply"], q.answer), in_live_context=contains(live, q.answer))
            answers.append(a)
            log(f"  [{ep.kind}/{ep.seed}/{mode}] {q.category:11s} {'OK ' if a['correct'] else 'no '} "
                f"want={q.answer!r} got={a['reply'][:80]!r}")
        worst = s.worst_stall_ms
        events = list(s.events)
        transcript = s.transcript
    finally:
        s.close()
    wall = time.perf_counter() - t0
    after = rows(engine.stats())
    summaries = [m.get("content") or "" for m in transcript if m.get("summary")]
    noted = [" ".join(e.lines) for e in events if e.name == "noted"]
    for a in answers:
        a["in_summaries"] = sum(contains(t, a["answer"]) for t in summaries)
        a["in_notes"] = sum(contains(t, a["answer"]) for t in noted)   # the model's notes (compaction/summary/notes.py)
    reb = [e for e in events if e.name == "rebased"]
    names = {}
    for e in events:
        names[e.name] = names.get(e.name, 0) + 1
    return dict(
        kind=ep.kind, seed=ep.seed, mode=mode, window=full_window if mode == "full" else args.window,
        history_tokens_est=ep.history_tokens, steps=len(ep.steps), wall_s=round(wall, 2),
        history_wall_s=round(history_wall, 2),
        tokens={k: after[k] - before[k] for k in after}, compactions=len(reb),
        fallback_compactions=sum(bool(getattr(e, "fallback", False)) for e in reb),
        worst_stall_ms=round(worst, 2), recalled=names.get("recalled", 0),
        history_searched=names.get("history_searched", 0), summary_failed=names.get("summary_failed", 0),
        dropped=names.get("dropped", 0), events=names, n_summaries=len(summaries),
        noted=names.get("noted", 0), note_skipped=names.get("note_skipped", 0),
        summaries=summaries[-2:], answers=answers)


def aggregate(results: List[dict], modes: List[str]) -> Dict[str, dict]:
    agg = {}
    for mode in modes:
        rs = [r for r in results if r["mode"] == mode]
        if not rs:
            continue
        ans = [a for r in rs for a in r["answers"]]
        cat = {}
        for c in CATEGORIES:
            xs = [a for a in ans if a["category"] == c]
            cat[c] = {"correct": sum(a["correct"] for a in xs), "n": len(xs),
                      "in_summary": sum(a["in_summaries"] > 0 for a in xs),
                      "in_notes": sum(a.get("in_notes", 0) > 0 for a in xs),
                      "in_live_context": sum(a["in_live_context"] for a in xs)}
        agg[mode] = dict(
            categories=cat, correct=sum(a["correct"] for a in ans), n=len(ans),
            tokens={k: sum(r["tokens"][k] for r in rs) for k in rs[0]["tokens"]},
            wall_s=round(sum(r["wall_s"] for r in rs), 1), compactions=sum(r["compactions"] for r in rs),
            fallback_compactions=sum(r["fallback_compactions"] for r in rs),
            worst_stall_ms=max(r["worst_stall_ms"] for r in rs), recalled=sum(r["recalled"] for r in rs),
            history_searched=sum(r["history_searched"] for r in rs),
            summary_failed=sum(r["summary_failed"] for r in rs), dropped=sum(r["dropped"] for r in rs),
            summaries=sum(r["n_summaries"] for r in rs), episodes=len(rs),
            noted=sum(r.get("noted", 0) for r in rs), note_skipped=sum(r.get("note_skipped", 0) for r in rs))
    return agg


def markdown(meta: dict, agg: Dict[str, dict]) -> str:
    f = lambda d: f"{d['correct']}/{d['n']}"
    L = [f"# Held-out agent histories ({meta['model']}, window {meta['window']})", "",
         f"{meta['date']}; kinds {', '.join(meta['kinds'])}; {meta['episodes']} episode(s) each, seed {meta['seed']}; "
         f"~{meta['history_tokens']} history tokens per episode; tool latency {meta['tool_latency']} s; "
         f"threads {meta['threads']}. `full` is mode `none` with a window of {meta['full_window']} (the ceiling).", "",
         "| mode | stated | middle | instruction | overall | in summaries (s/m/i) | in live context before questions (s/m/i) "
         "| in notes (s/m/i) | notes (skipped) | compactions (fallback) | recalled | searches | summary_failed | dropped "
         "| worst stall ms | tokens evaluated (fg/probe/bg) | wall s |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode, a in agg.items():
        c = a["categories"]
        L.append(f"| {mode} | {f(c['stated'])} | {f(c['middle'])} | {f(c['instruction'])} | {a['correct']}/{a['n']} | "
                 + "/".join(str(c[k]["in_summary"]) for k in CATEGORIES) + " | "
                 + "/".join(str(c[k]["in_live_context"]) for k in CATEGORIES) + " | "
                 + "/".join(str(c[k].get("in_notes", 0)) for k in CATEGORIES) + " | "
                 f"{a.get('noted', 0)} ({a.get('note_skipped', 0)}) | "
                 f"{a['compactions']} ({a['fallback_compactions']}) | {a['recalled']} | {a['history_searched']} | "
                 f"{a['summary_failed']} | {a['dropped']} | {a['worst_stall_ms']:.1f} | "
                 f"{a['tokens'].get('foreground', 0)}/{a['tokens'].get('probe', 0)}/{a['tokens'].get('background', 0)} | "
                 f"{a['wall_s']:.0f} |")
    L += ["", "In summaries: asked values found in at least one summary message of the session (per category, out of "
          "the same n). In live context: the value is in the messages the model sees just before the questions."]
    return "\n".join(L) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--episodes", type=int, default=1)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--modes", default="full,hard,background")
    ap.add_argument("--seed", type=int, default=1, help="first episode seed (episodes use seed, seed+1, ...)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--history-tokens", type=int, default=9000, help="target tokens of each episode's history")
    ap.add_argument("--answer-tokens", type=int, default=40)
    ap.add_argument("--tool-latency", type=float, default=0.0,
                    help="seconds each replayed tool call takes (Session.idle meanwhile, then sleep)")
    ap.add_argument("--out", default=None, help="output prefix (writes OUT.json and OUT.md)")
    ap.add_argument("--dry", action="store_true", help="build the episodes and print them; load no model")
    args = ap.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    modes = [m for m in args.modes.split(",") if m]
    for k in kinds:
        if k not in MAKERS:
            ap.error(f"unknown kind {k!r}; choose from {KINDS}")

    if args.dry:
        count = lambda t: max(1, len(t) // 3)
        for k in kinds:
            for e in range(args.episodes):
                ep = make_episode(k, args.seed + e, count, args.history_tokens)
                print(json.dumps({"task": ep.task, "steps": ep.steps[:6], "n_steps": len(ep.steps),
                                  "questions": [q.__dict__ for q in ep.questions], "fact_steps": ep.fact_steps},
                                 indent=1))
        return

    import pykvcompact as pk
    threads = args.threads
    # the engine's tokenizer counts the histories, so one engine is loaded first with a provisional size
    full_window = args.history_tokens + 3072
    n_ctx = max(full_window if "full" in modes else 0, 2 * args.window + 1536) + 256
    log(f"loading {args.model} n_ctx={n_ctx} threads={threads}")
    engine = pk.Engine(model=args.model, n_ctx=n_ctx, n_seq_max=8, n_threads=threads)
    if "full" in modes and n_ctx > engine.capabilities.get("n_ctx_train", n_ctx):
        log(f"warning: n_ctx {n_ctx} exceeds the model's training context {engine.capabilities['n_ctx_train']}")
    count = lambda t: len(engine.tokenize(t))
    episodes = [make_episode(k, args.seed + e, count, args.history_tokens) for k in kinds for e in range(args.episodes)]
    results = []
    hist = tempfile.mkdtemp(prefix="heldout-history-")
    t_all = time.perf_counter()
    try:
        for ep in episodes:
            log(f"episode {ep.kind}/{ep.seed}: {len(ep.steps)} steps, ~{ep.history_tokens} tokens "
                f"(largest step {ep.max_step_tokens}), "
                f"facts read at steps {ep.fact_steps}")
            for mode in modes:
                log(f" mode {mode}")
                r = run_episode(engine, ep, mode, args, full_window, hist)
                results.append(r)
                ok = sum(a["correct"] for a in r["answers"])
                log(f" mode {mode}: {ok}/{len(r['answers'])} correct, {r['compactions']} compactions, "
                    f"{r['recalled']} recalled, wall {r['wall_s']:.0f}s")
    finally:
        engine.close()
    agg = aggregate(results, modes)
    meta = dict(model=args.model, window=args.window, full_window=full_window, kinds=kinds, modes=modes,
                episodes=args.episodes, seed=args.seed, history_tokens=args.history_tokens, threads=threads,
                tool_latency=args.tool_latency, answer_tokens=args.answer_tokens,
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                total_wall_s=round(time.perf_counter() - t_all, 1), loadavg=os.getloadavg(),
                command=" ".join(sys.argv))
    md = markdown(meta, agg)
    print(md)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out + ".json", "w") as fh:
            json.dump({"meta": meta, "modes": agg, "episodes": results}, fh, indent=1, default=str)
        with open(args.out + ".md", "w") as fh:
            fh.write(md)
        log(f"wrote {args.out}.json and {args.out}.md")


if __name__ == "__main__":
    main()
