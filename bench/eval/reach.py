"""``python -m bench.eval.reach``: is the answer in what the model reads when it is asked?

An upper bound on accuracy that needs no model run: each episode is replayed through a real
``pk.Session`` on the test suite's ``FakeEngine`` (the model's own tokenizer and chat template, no
decoding), with a model that writes nothing (empty replies, notes and summaries: the structural path
alone — the summary's copied lines and the recall).  At each final question the prompt the reply would be
written on is checked for the answer.  Seconds per episode, so the recall and the summary can be
iterated on; the standard run (``--standard``) then says what the model makes of it.

    python -m bench.eval.reach                                   # held-out families, hard and background
    python -m bench.eval.reach --families coding,research --seeds 1000-1003 --json out.json

Which families were tuned on is printed with the table (``families.TUNED_ON``).
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
import tempfile
from typing import Dict, List, Sequence

from .environment import Environment
from .episode import PLACES, Episode
from .families import FAMILIES, HELD_OUT_FAMILIES, TUNED_ON
from .policies import Settings, make_policy, standard
from .sizing import fit

TESTS = pathlib.Path(__file__).resolve().parents[2] / "tests"


def fake_engine(real, prompts: List[str]):
    """A FakeEngine with ``real``'s tokenizer and template whose model records each prompt and says nothing."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    from fake_engine import FakeEngine

    def silent(prompt: str) -> str:
        prompts.append(prompt)
        return ""
    return FakeEngine(n_ctx=16384, tokenizer=real, chat_template=real.chat_template, responder=silent,
                      probe_fn=lambda prompt: 0.0)


def reply_prompt(prompts: Sequence[str], question: str) -> str:
    """The prompt the reply to ``question`` was written on (it ends with the assistant's turn opening)."""
    for p in prompts:
        if question in p and p.rstrip().endswith("assistant"):
            return p
    raise RuntimeError(f"no reply prompt holds the question {question[:60]!r}")


def replay(real, ep: Episode, policy_name: str, settings: Settings):
    """``(per question: its place and whether the answer is in the context before it (case-insensitive),
    {"recalls", "recalled_tokens", "steps"}: the recall's cost over the whole episode)``."""
    import pykvcompact as pk

    prompts: List[str] = []
    env = Environment(ep)
    with tempfile.TemporaryDirectory() as d:
        s = pk.Session(fake_engine(real, prompts), system=ep.system, policy=make_policy(policy_name, ep.family, settings),
                       tools=ep.tools, history_dir=d, session_id=f"{ep.family}-{ep.seed}")
        try:
            s.add({"role": "user", "content": ep.task})
            for i, step in enumerate(ep.steps):
                s.add(env.step_messages(i, step))
                if not step.say:
                    s.chat([], max_tokens=settings.reply_tokens)
            out = []
            for q in ep.questions:
                prompts.clear()
                s.chat(q.prompt, max_tokens=settings.answer_tokens)
                before = reply_prompt(prompts, q.prompt).rsplit(q.prompt, 1)[0]
                out.append({"place": q.place, "answer": q.answer, "reached": q.answer.lower() in before.lower()})
            # what the recall cost: a reached answer is worth less if every step recalled pages of noise
            recalled = [e for e in s.events if e.name == "recalled"]
            return out, {"recalls": len(recalled), "recalled_tokens": sum(e.tokens for e in recalled),
                         "steps": len(ep.steps)}
        finally:
            s.close()


def table(rows: List[dict]) -> Dict[str, Dict[str, List[int]]]:
    """``{policy: {place: [reached, asked]}}`` with an ``all`` column, and ``_cost``: [recalls, recalled
    tokens, episodes]."""
    out: Dict[str, Dict[str, List[int]]] = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0]))
    for r in rows:
        for q in r["questions"]:
            for col in (q["place"], "all"):
                out[r["policy"]][col][0] += q["reached"]
                out[r["policy"]][col][1] += 1
        cost = out[r["policy"]].setdefault("_cost", [0, 0, 0])   # recalls, their tokens, episodes
        cost[0] += r.get("recalls", 0)
        cost[1] += r.get("recalled_tokens", 0)
        cost[2] += 1
    return {p: dict(v) for p, v in out.items()}


def markdown(tab: Dict[str, Dict[str, List[int]]], families: Sequence[str]) -> str:
    cols = [p for p in PLACES if any(p in v for v in tab.values())] + ["all"]
    cost = "recalls (tokens) per episode"
    lines = [f"families: {', '.join(families)} (tuned on: {', '.join(f for f in families if f in TUNED_ON) or 'none'})",
             "", "| policy | " + " | ".join(cols) + f" | {cost} |", "|---" * (len(cols) + 2) + "|"]
    for pol, v in tab.items():
        rec = v.get("_cost")
        spent = f"{rec[0] / rec[2]:.1f} ({rec[1] / rec[2]:.0f})" if rec and rec[2] else "-"
        lines.append(f"| {pol} | " + " | ".join(f"{v[c][0]}/{v[c][1]}" if c in v else "-" for c in cols)
                     + f" | {spent} |")
    return "\n".join(lines)


def seeds_of(text: str) -> List[int]:
    """``1000,1001`` or ``1000-1003``."""
    out: List[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.eval.reach", description=__doc__.splitlines()[0],
                                 allow_abbrev=False)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="registry name or GGUF path (its tokenizer)")
    ap.add_argument("--families", default=",".join(HELD_OUT_FAMILIES))
    ap.add_argument("--policies", default="hard,background")
    ap.add_argument("--seeds", default="1000-1001", help="e.g. 1000,1001 or 1000-1003")
    ap.add_argument("--json", default=None, help="write the rows and the table here")
    args = ap.parse_args(argv)
    import pykvcompact as pk
    from pykvcompact.models.registry import resolve_model

    families = [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        ap.error(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    settings = standard()
    real = pk.Engine(str(resolve_model(args.model)), n_ctx=256, n_seq_max=1, n_threads=1)
    rows = []
    try:
        for fam in families:
            for seed in seeds_of(args.seeds):
                ep = fit(FAMILIES[fam], seed, settings.window, real.tokenize, ratio=settings.ratio,
                         shape=(settings.sub_goals, settings.steps))
                for pol in args.policies.split(","):
                    qs, cost = replay(real, ep, pol, settings)
                    rows.append({"family": fam, "seed": seed, "policy": pol, "questions": qs, **cost})
                    print(f"{fam:10} {seed} {pol:10} " + " ".join(f"{q['place']}:{int(q['reached'])}" for q in qs)
                          + f"  recalls {cost['recalls']} ({cost['recalled_tokens']} tokens)", flush=True)
    finally:
        real.close()
    tab = table(rows)
    print()
    print(markdown(tab, families))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"rows": rows, "table": tab}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
