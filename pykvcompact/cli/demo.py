"""A short tour of the engine on a real model: generate, fork, probe, rebase, with figures."""

from __future__ import annotations

import sys
import time

from ..engine import Engine


def _chat(user: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def run_demo(model: str | None = "smollm2-135m", n_ctx: int = 4096, out=sys.stdout) -> dict:
    def say(*a):
        print(*a, file=out, flush=True)

    t0 = time.perf_counter()
    eng = Engine(model, n_ctx=n_ctx, n_seq_max=8)
    say(f"loaded {eng.model_name} in {time.perf_counter() - t0:.2f}s; capabilities: "
        f"{ {k: eng.capabilities[k] for k in ('n_ctx', 'n_seq_max', 'can_shift', 'recurrent', 'rebase_modes')} }")
    system = "<|im_start|>system\nYou are a concise assistant.<|im_end|>\n"
    seq = eng.sequence(eng.tokenize(system + _chat("Name three planets of the solar system.")))

    say("\n1. generate (streamed):")
    t0 = time.perf_counter()
    out_tokens = []
    for tok in seq.stream(48):
        out_tokens.append(tok)
        print(eng.token_to_piece(tok), end="", file=out, flush=True)
    dt = time.perf_counter() - t0
    say(f"\n   {len(out_tokens)} tokens in {dt:.2f}s")
    seq.append(eng.tokenize("<|im_end|>\n"))

    say("\n2. fork: two follow-ups share the history's KV cells")
    used = eng.used_cells()
    t0 = time.perf_counter()
    branch = seq.fork()
    fork_ms = (time.perf_counter() - t0) * 1000
    say(f"   fork took {fork_ms:.2f} ms; cells before {used}, after {eng.used_cells()} (nothing copied)")
    seq.append(eng.tokenize(_chat("Which one is the largest?")))
    branch.append(eng.tokenize(_chat("Which one is closest to the Sun?")))
    a = eng.detokenize(seq.generate(32))
    b = eng.detokenize(branch.generate(32))
    say(f"   main  : {a.strip()!r}\n   branch: {b.strip()!r}")
    branch.close()
    seq.append(eng.tokenize("<|im_end|>\n"))

    say("\n3. probe: ask COMPRESS or CONTINUE on a fork; only the probe is prefilled")
    rubric = eng.tokenize("<|im_start|>system\nIs the current sub-task finished, so that the history can be "
                          "summarized? Answer with one word: COMPRESS or CONTINUE.<|im_end|>\n<|im_start|>assistant\n")
    before = seq.logits().copy()
    p = seq.probe(rubric)
    same = bool((seq.logits() == before).all())
    say(f"   {p}  ({seq.last_probe['tokens']} probe tokens, {seq.last_probe['ms']:.1f} ms; live logits unchanged: {same})")

    say("\n4. rebase: replace the first exchange by a summary, prepared in the background")
    sys_len = len(eng.tokenize(system))
    tokens = seq.tokens
    first_end = tokens.index(eng.tokenize("<|im_end|>")[0], sys_len + 5)
    first_end = tokens.index(eng.tokenize("<|im_end|>")[0], first_end + 1) + 2  # end of first answer
    summary = eng.tokenize("<|im_start|>system\nSummary of earlier turns: the user asked for three planets; "
                           "the assistant named some.<|im_end|>\n")
    rebase = seq.prepare_rebase(keep_prefix=sys_len, replacement=summary, keep_from=first_end)
    seq.append(eng.tokenize(_chat("And which one has rings?")))
    gen = seq.generate(24)  # main keeps decoding while the shadow catches up
    rebase.wait()
    info = seq.commit_rebase(rebase)
    say(f"   {info['tokens_before']} -> {info['tokens_after']} tokens, stall {info['stall_ms']:.3f} ms, "
        f"caught up at commit: {info['catch_up_tokens']} tokens")
    say(f"   answer generated meanwhile: {eng.detokenize(gen).strip()!r}")
    seq.append(eng.tokenize("<|im_end|>\n" + _chat("Thanks! One more planet?")))
    say(f"   after the swap the model goes on: {eng.detokenize(seq.generate(24)).strip()!r}")

    st = eng.stats()
    say(f"\nengine: {st['decode_calls']} decode calls, rows {st['rows']}, mixed fg+bg batches {st['mixed_batches']}, "
        f"{st['decode_ms'] / 1000:.1f}s decoding")
    seq.close()
    eng.close()
    return {"probe": p, "rebase": info, "stats": st}
