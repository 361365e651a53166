"""The model's notes (pykvcompact/compaction/summary/notes.py), measured: right after a tool result, on a fork, does the
model copy the lines of that output the task needs?  The shipped request and grammar, on three kinds of tool
output written for this benchmark (none of them shaped like bench/eval's families, on which nothing here was
tuned): service configs (TOML), application logs, and query results (CSV).  Each episode is a task stated in
the first user message, then tool results one by one; after each one the note is written exactly as the
session writes it (fork, the request, greedy generation under the grammar of the output's own lines), and
scored against the lines the task names (``targets``).

``--families`` takes the tool outputs of ``bench/eval``'s agent families instead (standard run size): each
output that holds an asked fact (``middle`` or ``json``), after the task and the two steps before it; the
task there says what the agent does, not which values will be asked.  Each variant of the grammar is
written on a fork of one prefill: ``heads`` (shipped) and ``lines`` (whole lines, as before).  Coding and
research are tuned-on families (bench/eval/families.py), support and data held out.

    python bench/notes.py --model qwen2.5-coder-1.5b --out bench/results/notes-qwen2.5-coder-1.5b.json
    python bench/notes.py --model smollm2-135m --kinds config --reads 3      # quick
    python bench/notes.py --families coding,research,support,data --out bench/results/notes-families-qwen2.5-coder-1.5b.json

Reported per kind: notes with at least one target line (informative), target lines found of all, median and
spread of the seconds per note (prefill of the request + generation; a foreground measurement: in a session
it runs in background rows).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import random
import statistics
import sys
import time

import pykvcompact as pk
from pykvcompact.chat.template import ChatTemplate
from pykvcompact.compaction.summary.notes import MAX_NOTE_TOKENS, choices, grammar, heads, note_request, noted_lines

WORDS = ["amber", "cobalt", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper", "krypton"]


def config_kind(rng: random.Random, i: int):
    svc = rng.choice(WORDS) + f"-{i}"
    pool, idle = rng.randint(8, 240), rng.randint(30, 900)
    keys = ["listen_port", "worker_threads", "log_level", "cache_ttl_s", "retry_backoff_ms", "region",
            "read_timeout_s", "write_timeout_s", "queue_depth", "gc_interval_s", "metrics_port", "shard_count"]
    lines = [f"[{svc}]"] + [f"{k} = {rng.randint(2, 9000)}" for k in keys]
    lines.insert(rng.randint(3, 9), f"max_pool_size = {pool}")
    lines.insert(rng.randint(10, 13), f"idle_timeout_s = {idle}")
    lines += [f"[{svc}.limits]"] + [f"{n} = {rng.randint(1, 500)}" for n in ("burst", "rate_per_s", "max_conns")]
    return ("read_file", {"path": f"services/{svc}/config.toml"}, "\n".join(lines),
            [f"max_pool_size = {pool}", f"idle_timeout_s = {idle}"])


def log_kind(rng: random.Random, i: int):
    host = f"{rng.choice(WORDS)}-{rng.randint(10, 99)}"
    lines, targets = [], []
    bad = rng.randint(6, 20)
    for k in range(26):
        ts = f"2026-11-{i + 1:02d}T0{k // 10}:{k % 60:02d}:{rng.randint(10, 59)}Z"
        if k == bad:
            line = f"{ts} {host} ERROR payment refused: code=E{rng.randint(1000, 9999)} order={rng.randint(10**5, 10**6)}"
            targets.append(line)
        else:
            line = f"{ts} {host} INFO handled GET /api/v1/items/{rng.randint(1, 999)} in {rng.randint(2, 90)} ms"
        lines.append(line)
    return "read_log", {"host": host, "since": f"2026-11-{i + 1:02d}"}, "\n".join(lines), targets


def csv_kind(rng: random.Random, i: int):
    region = rng.choice(WORDS)
    rows = ["customer_id,region,orders,revenue_eur"]
    pick = rng.randint(1, 18)
    target = ""
    for k in range(20):
        row = f"C{rng.randint(10000, 99999)},{region},{rng.randint(1, 90)},{rng.randint(100, 99999)}.{rng.randint(10, 99)}"
        if k == pick:
            row = f"C{90000 + i},{region},{rng.randint(1, 90)},{rng.randint(100, 99999)}.{rng.randint(10, 99)}"
            target = row
        rows.append(row)
    return "run_query", {"sql": f"SELECT * FROM sales WHERE region = '{region}' LIMIT 20"}, "\n".join(rows), [target]


KINDS = {
    "config": (config_kind, "You are auditing connection pools before a traffic spike. Read each service's config "
                            "and keep track of its max_pool_size and idle_timeout_s; you will report them all."),
    "log": (log_kind, "Find why payments failed last month. Read each host's log; note every ERROR line with its "
                      "error code and order number for the incident report."),
    "csv": (csv_kind, "For the account review, find the revenue of our key accounts, the customers whose id starts "
                      "with C9; query each region's sales."),
}


def episode(eng, tpl: ChatTemplate, kind: str, reads: int, seed: int) -> list:
    make, task = KINDS[kind]
    rng = random.Random(seed)
    msgs = [{"role": "system", "content": "You are a careful agent."}, {"role": "user", "content": task}]
    rows = []
    for i in range(reads):
        name, args, output, targets = make(rng, i)
        msgs += [{"role": "assistant", "content": None,
                  "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": args}}]},
                 {"role": "tool", "tool_call_id": f"c{i}", "content": output}]
        base = tpl.render(msgs)
        offered = heads(choices(output))
        full = tpl.render(msgs + [{"role": "user", "content": note_request(task)}], add_generation_prompt=True)
        with eng.sequence(eng.tokenize(base)) as seq:
            with seq.fork() as fork:
                t0 = time.perf_counter()
                fork.append(eng.tokenize(full[len(base):]))
                out = eng.detokenize(fork.generate(MAX_NOTE_TOKENS, temperature=0.0, stop=["\n\n"],
                                                   grammar=grammar(list(offered))))
                seconds = time.perf_counter() - t0
        kept = noted_lines(out, offered)
        found = sum(t in kept for t in targets)
        rows.append({"read": i, "targets": targets, "note": kept, "found": found, "seconds": round(seconds, 3)})
        print(f"{kind} {i}: {found}/{len(targets)} {seconds:.1f}s {kept}", file=sys.stderr)
    return rows


def _full_lines(output, task):
    """The grammar before heads(): whole lines (kept to compare)."""
    lines = choices(output)
    return note_request(task), grammar(lines), lambda text: noted_lines(text, lines)


def _heads(output, task):
    """What the session offers: each line's head (notes.heads)."""
    offered = heads(choices(output))
    return note_request(task), grammar(list(offered)), lambda text: noted_lines(text, offered)


VALUES_REQUEST = ("The task: \"{task}\"\nList the exact values the tool output above gives that this task may "
                  "need later (ids, numbers, names, rules), one per line as `what: value`.")


def _values(output, task):
    """Free text: the model lists values as `what: value` lines (no grammar)."""
    return (VALUES_REQUEST.format(task=" ".join(task.split())[:300].replace('"', "'")), None,
            lambda text: [x.strip() for x in text.split("\n") if x.strip()])


VARIANTS = {"heads": _heads, "lines": _full_lines, "values": _values}


def family_facts(families, seeds, tokenize, before: int):
    """(family, seed, place, task, messages up to and including the output, target lines) for each asked
    fact that lives in a tool output (``middle`` or ``json``) of ``bench/eval``'s agent families at the
    standard run's size; the messages hold the system prompt, the task and the ``before`` steps before."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    from bench.eval.agent_families import AGENT_FAMILIES
    from bench.eval.environment import Environment
    from bench.eval.sizing import fit
    for family in families:
        for seed in seeds:
            ep = fit(AGENT_FAMILIES[family], seed, 2048, tokenize, ratio=3.0, shape=(4, 4))
            env = Environment(ep)
            for q, f in zip(ep.questions, ep.facts):
                if q.place not in ("middle", "json") or f.source != "output":
                    continue
                msgs = [{"role": "system", "content": ep.system}, {"role": "user", "content": ep.task}]
                for i in range(max(0, f.step - before), f.step + 1):
                    msgs += env.step_messages(i, ep.steps[i])
                while msgs[-1]["role"] != "tool":
                    msgs.pop()
                output = ep.steps[f.step].output
                targets = [x.strip() for x in output.split("\n") if f.text in x]
                yield family, seed, q.place, ep.task, msgs, output, targets, f.text


def families_run(eng, tpl: ChatTemplate, families, seeds, before: int, variants) -> list:
    """One note per variant on each asked output of the agent families, all on forks of one prefill."""
    rows = []
    for family, seed, place, task, msgs, output, targets, value in family_facts(families, seeds, eng.tokenize, before):
        base = tpl.render(msgs)
        with eng.sequence(eng.tokenize(base)) as seq:
            row = {"family": family, "seed": seed, "place": place, "targets": targets, "value": value,
                   "base_tokens": seq.n_past if hasattr(seq, "n_past") else None, "variants": {}}
            for name in variants:
                request, gram, read = VARIANTS[name](output, task)
                full = tpl.render(msgs + [{"role": "user", "content": request}], add_generation_prompt=True)
                with seq.fork() as fork:
                    t0 = time.perf_counter()
                    fork.append(eng.tokenize(full[len(base):]))
                    toks = fork.generate(MAX_NOTE_TOKENS, temperature=0.0, stop=["\n\n"], grammar=gram)
                    seconds = time.perf_counter() - t0
                kept = read(eng.detokenize(toks))
                found = int(any(value in k for k in kept))   # the asked value is in the note
                row["variants"][name] = {"note": kept, "found": found, "tokens": len(toks),
                                         "seconds": round(seconds, 3)}
                print(f"{family} {seed} {place} {name}: {found}/{len(targets)} {seconds:.1f}s {len(toks)} tok "
                      f"{[k[:50] for k in kept]}", file=sys.stderr)
        rows.append(row)
    return rows


def families_summary(rows: list, variants) -> dict:
    out = {}
    for name in variants:
        for fam in sorted({r["family"] for r in rows}) + ["all"]:
            sel = [r["variants"][name] for r in rows if fam in ("all", r["family"])]
            secs = sorted(v["seconds"] for v in sel)
            out.setdefault(name, {})[fam] = {
                "notes": len(sel), "informative": sum(v["found"] > 0 for v in sel),
                "seconds_median": statistics.median(secs), "seconds_min": secs[0], "seconds_max": secs[-1],
                "tokens_median": statistics.median(v["tokens"] for v in sel)}
    return out


def summary(rows: list) -> dict:
    secs = sorted(r["seconds"] for r in rows)
    return {"notes": len(rows), "informative": sum(r["found"] > 0 for r in rows),
            "targets_found": sum(r["found"] for r in rows), "targets": sum(len(r["targets"]) for r in rows),
            "seconds_median": statistics.median(secs), "seconds_min": secs[0], "seconds_max": secs[-1]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--kinds", default="config,log,csv")
    ap.add_argument("--reads", type=int, default=6, help="tool results per episode (one note each)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--families", default=None,
                    help="bench/eval agent families (e.g. coding,research): note the outputs holding an asked "
                         "fact, instead of --kinds")
    ap.add_argument("--seeds", default="1000,1001")
    ap.add_argument("--before", type=int, default=2, help="steps before the noted one kept in the context")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args(argv)
    eng = pk.Engine(model=args.model, n_ctx=8192, n_seq_max=4, n_threads=args.threads)
    tpl = ChatTemplate.from_engine(eng)
    result = {"model": args.model, "request": note_request("{task}"), "max_note_tokens": MAX_NOTE_TOKENS, "seed": args.seed,
              "tuned_on": "config: the request (and quoting the task in it) was chosen on config reads; log and csv "
                          "were not tuned on", "kinds": {}}
    if args.families:
        variants = args.variants.split(",")
        result["tuned_on"] = "coding and research (bench/eval/families.TUNED_ON); support and data held out"
        rows = families_run(eng, tpl, args.families.split(","), [int(x) for x in args.seeds.split(",")],
                            args.before, variants)
        result["families"] = {"summary": families_summary(rows, variants), "rows": rows}
        for name, per in result["families"]["summary"].items():
            for fam, v in per.items():
                print(f"{name} {fam}: informative {v['informative']}/{v['notes']}, {v['seconds_median']:.2f} s "
                      f"[{v['seconds_min']:.2f}-{v['seconds_max']:.2f}], {v['tokens_median']} tokens")
        eng.close()
        if args.out:
            pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        return result
    for kind in args.kinds.split(","):
        rows = episode(eng, tpl, kind, args.reads, args.seed)
        result["kinds"][kind] = {"summary": summary(rows), "rows": rows}
        s = result["kinds"][kind]["summary"]
        print(f"{kind}: informative {s['informative']}/{s['notes']}, target lines {s['targets_found']}/"
              f"{s['targets']}, {s['seconds_median']:.2f} s per note [{s['seconds_min']:.2f}-{s['seconds_max']:.2f}]")
    eng.close()
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
