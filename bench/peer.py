"""Ours (pykvcompact) against the peer (llama-cpp-python's ``Llama``) on the same GGUF file, the same
token transcript and the same threads, flash attention on both sides (``--flash-attn off``: off on both). Each side runs in its own
subprocess (two ggml thread pools in one process steal each other's cores), alternated ours, peer,
ours, peer, ...; each worker process runs every figure once (bench/peer_ours.py, bench/peer_llama.py).

Figures (medians with min/max/IQR; ratios ours/peer from medians of the same run, and per round):
  1. greedy decode ms/token at 1k and 3k tokens of context (prefill excluded);
  2. probe: ours ``seq.probe`` (fork, prefill ~100 tokens, read label logits, drop) against the peer
     evaluating the same tokens on its cached prefix, reading the logits and rolling back;
  3. blocking compaction of a 2.9k-token history into a ~150-token greedy summary, waited on: ours =
     the conversation's own sequence, the only one alive (as the peer's one cache): summary on a fork, then
     truncate to the system prompt and append summary and tail, as a session rebuilds a swap nobody
     prepared (details: ``compaction_prepared_ms``, prepare_rebase + commit_rebase instead); peer = summary
     on its prefix cache + re-prefill of [system][summary][last 10%] (only the system prompt is reused, as
     Llama's prefix cache does). Both stop the summary at end-of-generation: when the two greedy summaries
     differ in length (numerics differ), the figure is not like for like and the run says so;
  4. prepared swap: ours = commit of a rebase prepared in the background after a few new tokens;
     peer = the re-prefill of [system][summary][tail] it pays at the swap;
  5. main decode speed while a 200-token summary generates in the background, / solo speed: ours =
     ``fork.generate_background``; peer = a second ``Llama`` generating in another thread.

    python bench/peer.py --model smollm2-135m --repeats 5 --out bench/results/peer-smollm2-135m.json
    python bench/peer.py --quick                       # smoke run (small contexts, 1 round)
    python bench/peer.py --before ...                  # ours = the frozen build in /tmp/pkv_before
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
BEFORE_RUNNER = "/tmp/pkv_before/run_before.py"
# The transcript is built from the repository's files at this commit, so it never changes.
TRANSCRIPT_COMMIT = "038355c82fc115ded01ffc5478e18f2608414beb"
# (paths as they were at that commit: the package has been reorganised since)
TRANSCRIPT_FILES = ["README.md", "pykvcompact/summarizer.py", "pykvcompact/policy.py", "pykvcompact/session.py"]
SYSTEM = ("<|im_start|>system\nYou are a careful coding agent working in the pykvcompact repository. Read "
          "files, explain them and keep track of what you learned.<|im_end|>\n")
SUMMARIZER = ("<|im_end|>\n<|im_start|>user\nPause the task and write a summary of the conversation above, so "
              "that the work can continue from the summary alone: the goal, the files read, what each does, the "
              "decisions taken and the next step.<|im_end|>\n<|im_start|>assistant\n")
PROBE = ("<|im_end|>\n<|im_start|>user\nCheckpoint. Decide whether the context should be compacted now. Answer "
         "COMPRESS when a sub-goal is resolved (a file fully explained, a question answered with verified facts) "
         "or the trajectory converges; answer CONTINUE in the middle of a derivation, in the middle of a search, "
         "or when the last step is still open. Rubric: 1. Is the current sub-goal resolved? 2. Are the facts "
         "needed later written down? 3. Would a summary lose a detail needed for the next step? Reply with one "
         "word, COMPRESS or CONTINUE.<|im_end|>\n<|im_start|>assistant\n")
FIGURES = ["decode_ms_per_token_{L1}", "decode_ms_per_token_{L3}", "probe_ms_{L1}", "probe_ms_{L3}",
           "compaction_ms", "swap_ms", "bg_speed_ratio"]


def stats(samples: list[float]) -> dict:
    s = sorted(samples)
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0]] * 3
    return {"median": statistics.median(s), "min": s[0], "max": s[-1], "iqr": q[2] - q[0], "n": len(s)}


def transcript_text() -> tuple[str, str]:
    parts = []
    for path in TRANSCRIPT_FILES:
        try:
            body = subprocess.run(["git", "-C", str(REPO), "show", f"{TRANSCRIPT_COMMIT}:{path}"], check=True,
                                  capture_output=True, text=True).stdout
            source = TRANSCRIPT_COMMIT
        except (subprocess.CalledProcessError, OSError):
            body, source = (REPO / path).read_text(encoding="utf-8"), "working tree"
        parts.append(f"<|im_start|>user\nShow me {path} and explain it.<|im_end|>\n"
                     f"<|im_start|>assistant\nHere is {path}:\n{body}<|im_end|>\n")
    return "".join(parts), source


def build_job(args) -> dict:
    """Tokenize once here (vocabulary only: no context, no thread pool) so both sides get the same ids."""
    import pykvcompact as pk

    model_path = str(pk.resolve_model(args.model))
    from pykvcompact.remote.llama_cpp_peer import load_llama

    voc = load_llama(model_path, vocab_only=True, verbose=False)
    tok = lambda s: voc.tokenize(s.encode(), add_bos=False, special=True)  # noqa: E731
    text, source = transcript_text()
    system, body = tok(SYSTEM), tok(text)
    L1, L3, H = (256, 768, 720) if args.quick else (1024, 3072, 2900)
    transcript = system + body
    assert len(transcript) >= L3 + 64, f"transcript too short: {len(transcript)} tokens"
    labels = ["COMPRESS", "CONTINUE"]
    summary_tokens = args.summary_tokens or (32 if args.quick else 150)
    job = {
        "model": args.model, "model_path": model_path, "n_threads": args.n_threads or pk.physical_cores(),
        "contexts": [L1, L3], "history_len": H, "tail_len": H // 10, "system_len": len(system),
        "n_gen": 16 if args.quick else 64, "bg_tokens": 200, "summary_tokens": summary_tokens,
        "swap_new_tokens": 8, "transcript": transcript[:L3 + 64], "transcript_source": source,
        "summarizer_prompt": tok(SUMMARIZER), "probe": tok(PROBE), "labels": labels,
        "label_tokens": [tok(x) for x in labels],
        "fixed_summary": tok(text[-4000:])[:summary_tokens],  # a deterministic stand-in of summary length
        "n_ctx_ours": 8192, "n_ctx_peer": 4096, "n_ctx_peer_bg": 2048,
        "use_extra_bufts": bool(args.extra_bufts),   # both sides alike (like for like)
        "flash_attn": args.flash_attn == "on",       # both sides alike; on: Engine's default where supported
    }
    voc.close()
    return job


def run_worker(side: str, job_path: str, impl: str, timeout: float) -> dict:
    script = str(HERE / ("peer_ours.py" if side == "ours" else "peer_llama.py"))
    cmd = [sys.executable]
    if side == "ours" and impl == "before":
        cmd.append(BEFORE_RUNNER)
    out_path = job_path + f".{side}.out.json"
    proc = subprocess.run(cmd + [script, job_path, out_path], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{side} worker failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(pathlib.Path(out_path).read_text())


def machine_info() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    import llama_cpp

    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "machine": platform.machine(), "python": sys.version.split()[0],
            "platform": platform.platform(), "llama_cpp_python": llama_cpp.__version__}


def aggregate(rounds: list[dict], figures: list[str]) -> dict:
    out = {}
    for key in figures:
        ours = [r["ours"]["samples"][key] for r in rounds]
        peer = [r["peer"]["samples"][key] for r in rounds]
        paired = [o / p for o, p in zip(ours, peer) if p]
        out[key] = {"ours": stats(ours), "peer": stats(peer),
                    "ratio_ours_over_peer": stats(ours)["median"] / stats(peer)["median"],
                    "ratio_per_round": stats(paired)}
    return out


def details(rounds: list[dict]) -> dict:
    """Every numeric sample a worker reported (parts of the figures, load time), per side."""
    out = {}
    for side in ("ours", "peer"):
        keys = [k for k, v in rounds[0][side]["samples"].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        out[side] = {k: stats([float(r[side]["samples"][k]) for r in rounds]) for k in keys}
    return out


def finish(result: dict, job: dict, rounds: list[dict], out: str | None, complete: bool) -> None:
    L1, L3 = job["contexts"]
    result["figures"] = aggregate(rounds, [f.format(L1=L1, L3=L3) for f in FIGURES])
    result["details"] = details(rounds)
    result["rounds_done"], result["complete"] = len(rounds), complete
    result["rounds"] = rounds
    lens = {side: result["details"][side].get("compaction_summary_len", {}).get("median") for side in ("ours", "peer")}
    result["summary_lengths_match"] = lens["ours"] == lens["peer"]
    if not result["summary_lengths_match"]:
        print(f"warning: the summaries differ in length (ours {lens['ours']}, peer {lens['peer']} tokens): "
              "compaction_ms is not like for like; rerun with --summary-tokens at most the shorter", file=sys.stderr)
    result["loadavg_end"] = os.getloadavg()
    if out:
        pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(out).write_text(json.dumps(result, indent=1, default=str) + "\n")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--repeats", type=int, default=5, help="rounds; each round runs one ours and one peer process")
    ap.add_argument("--n-threads", type=int, default=None, help="default: pykvcompact.physical_cores()")
    ap.add_argument("--quick", action="store_true", help="smoke run: small contexts, 1 round")
    ap.add_argument("--before", action="store_true", help="ours = the frozen build (same as PKV_IMPL=before)")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds per worker process")
    ap.add_argument("--extra-bufts", action="store_true",
                    help="turn ggml's extra buffer types (AMX repacking) on for both sides; off by default, as in "
                         "Engine: they crash quantized models on some AMX CPUs")
    ap.add_argument("--flash-attn", choices=("on", "off"), default="on",
                    help="flash attention on both sides (on: what Engine's default, auto, picks where llama.cpp "
                         "supports it; the peer's own default is off)")
    ap.add_argument("--summary-tokens", type=int, default=None,
                    help="summary length of the compaction figure (default 150, --quick 32); lower it when one "
                         "side's greedy summary ends earlier than the other's")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    impl = "before" if args.before or os.environ.get("PKV_IMPL") == "before" else "live"
    repeats = 1 if args.quick else args.repeats
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "ours_impl": impl, "model": args.model, "quick": args.quick, "repeats": repeats,
              "machine": machine_info(), "loadavg_start": os.getloadavg(), "unit": "ms (bg_speed_ratio: x)"}
    job = build_job(args)
    from pykvcompact.remote.llama_cpp_peer import setting_line

    result["peer_setting"] = setting_line(job["use_extra_bufts"])
    print(result["peer_setting"], file=sys.stderr)
    result["setup"] = {k: v for k, v in job.items() if not isinstance(v, list) or k in ("contexts", "labels")}
    result["setup"].update({"transcript_len": len(job["transcript"]), "probe_len": len(job["probe"]),
                            "summarizer_prompt_len": len(job["summarizer_prompt"])})
    rounds = []
    with tempfile.TemporaryDirectory(prefix="pkv-peer-") as tmp:
        job_path = os.path.join(tmp, "job.json")
        pathlib.Path(job_path).write_text(json.dumps(job))
        for r in range(repeats):
            rnd = {"loadavg_start": os.getloadavg()}
            for side in (("ours", "peer") if r % 2 == 0 else ("peer", "ours")):
                rnd[side] = run_worker(side, job_path, impl, args.timeout)
                print(f"round {r + 1}/{repeats} {side}: " + ", ".join(
                    f"{k} {v:.1f}" for k, v in rnd[side]["samples"].items() if isinstance(v, float)), file=sys.stderr)
            rnd["loadavg_end"] = os.getloadavg()
            rounds.append(rnd)
            finish(result, job, rounds, args.out, complete=r + 1 == repeats)  # partial results survive a stop
    for key, f in result["figures"].items():
        o, p = f["ours"], f["peer"]
        print(f"{key:28s} ours {o['median']:9.2f} [{o['min']:.2f}-{o['max']:.2f}]  peer {p['median']:9.2f} "
              f"[{p['min']:.2f}-{p['max']:.2f}]  ours/peer {f['ratio_ours_over_peer']:.3f}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
