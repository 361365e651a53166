"""Runs the peer's episodes in its own process (two ggml thread pools in one process steal each other's
cores):  python -m bench.eval.peer_worker JOB.json OUT.json"""
from __future__ import annotations

import json
import sys
import time

from .environment import Environment
from .episode import Episode
from .peer_harness import PeerHarness
from .recorder import Recorder
from .scoring import ANSWER_GRAMMAR, carries, is_correct


def run_peer_episode(llm, template, ep: Episode, job: dict) -> dict:
    window, reply_tokens, answer_tokens = job["window"], job["reply_tokens"], job["answer_tokens"]
    h = PeerHarness(llm, template, window=window, system=ep.system, tools=ep.tools,
                    summary_tokens=job["summary_tokens"])
    rec = Recorder(ep, window)   # for the phase labels and the timeline only
    env = Environment(ep)
    t0 = time.perf_counter()
    llm.reset()
    compactions, summaries, answers = [], [], []

    def note(step, state_step, did):
        if did:
            c = h.compactions[-1]
            compactions.append({"step": step, "at": state_step, "phase": rec.phase(state_step), "fill": c["fill"], "trigger": "hard",
                                "kind": "rebased", "stall_ms": c["stall_ms"], "fallback": False})
            gone = {m.get("content") for m in h.dropped}
            required = [f.text for f in ep.facts if ep.source_text(f) in gone]
            carried = [f for f in required if carries(h.summaries[-1], f)]
            summaries.append({"required": required, "carried": carried,
                              "recall": len(carried) / len(required) if required else None,
                              "chars": len(h.summaries[-1])})
        rec.timeline.append({"t": time.time() - rec.t0, "fill": h.fill, "step": step})

    note(-1, -1, h.add([{"role": "user", "content": ep.task}], reply_tokens))
    for i, step in enumerate(ep.steps):
        time.sleep(job.get("tool_latency", 0.0))   # the scripted tool runs (the peer has nothing to do meanwhile)
        note(i, i - 1, h.add(env.step_messages(i, step), reply_tokens))
        if not step.say:   # a scripted statement is the step's reply
            h.reply(reply_tokens)
        note(i, i, False)
    for q in ep.questions:
        note(len(ep.steps), len(ep.steps), h.add([{"role": "user", "content": q.prompt}], answer_tokens))
        reply = h.reply(answer_tokens, grammar=ANSWER_GRAMMAR)
        answers.append({"prompt": q.prompt, "answer": q.answer, "reply": reply, "early": q.early,
                        "place": q.place, "correct": is_correct(reply, q.answer)})
    tokens = dict(h.tokens, probe=0, background=0)
    tokens["total"] = sum(tokens.values())
    return dict(family=ep.family, seed=ep.seed, policy="peer", window=window, wall_s=time.perf_counter() - t0,
                answers=answers, tokens=tokens, peer_truncated_messages=h.truncated, model_tool_calls=0,
                model_tool_calls_matched=0,
                compactions=compactions, probes=[], summaries=summaries,
                stalls_ms=[c["stall_ms"] for c in compactions], timeline=rec.timeline, boundaries=ep.boundaries(),
                events=[{"t": None, "name": "rebased", "step": c["step"]} for c in compactions])


def main(job_path: str, out_path: str) -> None:
    from pykvcompact.chat.template import ChatTemplate
    from pykvcompact.remote.llama_cpp_peer import load_llama, setting_line

    job = json.load(open(job_path))
    # ggml's extra buffer types off, as in our Engine (they crash quantized models on some AMX CPUs)
    print(setting_line(bool(job.get("use_extra_bufts", False))), file=sys.stderr)
    llm = load_llama(job["model_path"], use_extra_bufts=bool(job.get("use_extra_bufts", False)),
                     n_ctx=job["window"] + job["summary_tokens"] + 512, n_threads=job["n_threads"],
                     n_threads_batch=job["n_threads"], n_batch=512, flash_attn=False, verbose=False)
    meta = llm.metadata
    piece = lambda t: llm.detokenize([t]).decode("utf-8", errors="ignore") if t >= 0 else ""  # noqa: E731
    template = ChatTemplate(meta.get("tokenizer.chat_template"), bos_token=piece(llm.token_bos()),
                            eos_token=piece(llm.token_eos()))
    results = []
    for d in job["episodes"]:
        results.append(run_peer_episode(llm, template, Episode.from_dict(d), job))
        json.dump(results, open(out_path, "w"), default=str)   # partial results survive a timeout
    llm.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
