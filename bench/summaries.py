"""What the model's summary carries, measured: at a swap of ``bench/eval``'s agent families, does the text the
model writes on a fork hold the facts the replaced span established?

Each sample is the start of an episode (system prompt, task, the first steps: tool calls, their outputs,
the user's turns and the assistant's own statements; the episode's tool schema in the system prompt) cut
where a window-2048 swap would cut it (``--span`` tokens of history); the span's facts are the asked facts
its steps state (any place: the user's turns, the assistant's statements, the middle of an output, a JSON
field).  Only recall is scored: a wrong value the model writes beside the right ones is not counted
against it (read the texts in the result file).  One prefill per sample; each request
variant is written on a fork of it (only the request is prefilled, as in a session), greedily, with the
shipped budget, and scored by which span facts its text carries verbatim.

Coding and research are tuned-on families (bench/eval/families.TUNED_ON: the variants were written looking
at their outputs only); support and data are held out and report.

    python bench/summaries.py --families coding,research            # tune
    python bench/summaries.py --out bench/results/summaries-qwen2.5-coder-1.5b.json
    python bench/summaries.py --model smollm2-135m --families support,data

Reported per variant and family: summaries that carried at least one span fact (informative), the span
facts carried of all (fact recall), tokens written, seconds (a foreground measurement).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pykvcompact as pk  # noqa: E402
from pykvcompact.chat.template import ChatTemplate  # noqa: E402
from pykvcompact.compaction.summary import summarizer as sm  # noqa: E402

HISTORY = "history/session.jsonl"


def _shipped(budget: int):
    """The request the session sends, and what it prefills the answer with."""
    return sm.summarizer_request(HISTORY, budget), sm.answer_head()


def _previous(budget: int):
    """The request shipped before (2026-12-07): the standing instructions first and prefilled, seven headings,
    "none" under an empty one.  Kept to compare."""
    words = max(20, int(budget * 0.6))
    return "\n".join([
        "Pause the task and write a summary of the conversation above, so that the work can continue "
        f"from the summary alone. The full messages will be saved in {HISTORY}. Do not call any tool: "
        "write plain text.",
        "Use exactly these headings:",
        f"{sm.FIRST_HEADING} every instruction or constraint the user gave (ports, files not to touch, names, "
        "dates, numbers), copied word for word, not paraphrased.",
        "Goal: what the user wants.",
        "Verified facts: facts established above, with their exact values (numbers, names, paths, results).",
        "Decisions: what was decided and why.",
        "Files and artifacts: files, functions or other artifacts read, created or changed.",
        "Open items: what is unfinished or unknown.",
        "Next step: the next concrete action.",
        "Write only what is stated above; do not invent anything; write \"none\" under an empty heading. "
        f"At most {words} words."]), sm.FIRST_HEADING


VARIANTS = {"shipped": _shipped, "previous": _previous}


def samples(families, seeds, tokenize, render, span: int):
    """(family, seed, messages, tools, span facts, steps) for each episode: as many whole steps as fit
    ``span`` tokens (rendered with the episode's tool schema, as the session renders them); the span facts
    are the asked facts its steps state (not the task's: the session keeps it verbatim)."""
    from bench.eval.agent_families import AGENT_FAMILIES
    from bench.eval.environment import Environment
    from bench.eval.sizing import fit
    for family in families:
        for seed in seeds:
            ep = fit(AGENT_FAMILIES[family], seed, 2048, tokenize, ratio=3.0, shape=(4, 4))
            env = Environment(ep)
            msgs = [{"role": "system", "content": ep.system}, {"role": "user", "content": ep.task}]
            steps = 0
            for i, st in enumerate(ep.steps):
                more = msgs + env.step_messages(i, st)
                if len(tokenize(render(more, ep.tools))) > span:
                    break
                msgs, steps = more, i + 1
            facts = sorted({f.text for f in ep.facts if 0 <= f.step < steps})
            yield family, seed, msgs, ep.tools, facts, steps


def run(eng, tpl: ChatTemplate, families, seeds, span: int, budget: int, variants) -> list:
    rows = []
    for family, seed, msgs, tools, facts, steps in samples(families, seeds, eng.tokenize, tpl.render, span):
        base = tpl.render(msgs, tools)
        with eng.sequence(eng.tokenize(base)) as seq:
            row = {"family": family, "seed": seed, "steps": steps, "facts": facts, "variants": {}}
            for name in variants:
                request, head = VARIANTS[name](budget)
                full = tpl.render(msgs + [{"role": "user", "content": request}], tools, True) + head
                with seq.fork() as fork:
                    t0 = time.perf_counter()
                    fork.append(eng.tokenize(full[len(base):]))
                    toks = fork.generate(budget, temperature=0.0)
                    seconds = time.perf_counter() - t0
                text = head + eng.detokenize(toks)
                carried = [f for f in facts if f in text]
                row["variants"][name] = {"text": text, "carried": carried, "tokens": len(toks),
                                         "seconds": round(seconds, 3)}
                print(f"{family} {seed} {name}: {len(carried)}/{len(facts)} {seconds:.1f}s {len(toks)} tok",
                      file=sys.stderr)
        rows.append(row)
    return rows


def summarize(rows: list, variants) -> dict:
    out = {}
    for name in variants:
        for fam in sorted({r["family"] for r in rows}) + ["all"]:
            sel = [(r, r["variants"][name]) for r in rows if fam in ("all", r["family"]) and r["facts"]]
            if not sel:
                continue
            secs = sorted(v["seconds"] for _, v in sel)
            out.setdefault(name, {})[fam] = {
                "summaries": len(sel), "informative": sum(bool(v["carried"]) for _, v in sel),
                "facts": sum(len(r["facts"]) for r, _ in sel), "carried": sum(len(v["carried"]) for _, v in sel),
                "seconds_median": statistics.median(secs), "seconds_min": secs[0], "seconds_max": secs[-1],
                "tokens_median": statistics.median(v["tokens"] for _, v in sel)}
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--families", default="support,data")
    ap.add_argument("--seeds", default="1000,1001")
    ap.add_argument("--span", type=int, default=1500, help="tokens of history the summary replaces")
    ap.add_argument("--budget", type=int, default=128, help="tokens the model may write (the session's text share)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    eng = pk.Engine(model=args.model, n_ctx=8192, n_seq_max=4, n_threads=args.threads)
    tpl = ChatTemplate.from_engine(eng)
    rows = run(eng, tpl, args.families.split(","), [int(x) for x in args.seeds.split(",")], args.span,
               args.budget, variants)
    eng.close()
    result = {"model": args.model, "span": args.span, "budget": args.budget,
              "tuned_on": "coding and research (bench/eval/families.TUNED_ON); support and data held out",
              "summary": summarize(rows, variants), "rows": rows}
    for name, per in result["summary"].items():
        for fam, v in per.items():
            print(f"{name} {fam}: informative {v['informative']}/{v['summaries']}, facts {v['carried']}/{v['facts']}, "
                  f"{v['seconds_median']:.1f} s [{v['seconds_min']:.1f}-{v['seconds_max']:.1f}], "
                  f"{v['tokens_median']} tokens")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
