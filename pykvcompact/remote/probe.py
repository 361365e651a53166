"""The rubric probe over HTTP: one completion of ``context + rubric`` with ``max_tokens=1`` and the top-k
``logprobs`` of that token; each label's probability is read from those k entries.

Approximate, where the local engine is exact:

- only the ``top_k`` most likely first tokens are known (servers cap k: OpenAI 5, vLLM 20 by default);
  a label none of whose tokens is among them gets an upper bound, ``min(smallest top-k probability,
  1 - the top-k mass)``, so two absent labels come out even (0.5 / 0.5);
- a top-k token counts for a label when its text, stripped and compared case-insensitively, is a prefix of
  the label (``"COMP"``, ``"Com"`` and ``" COMPRESS"`` all count for COMPRESS) and of no other label
  (``"CO"`` is ambiguous and counts for neither); the local engine reads the logit of the label's own
  first token only;
- the probabilities are the server's (its sampler's view of the logits), normalised over the labels.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

from .errors import RemoteProtocolError


def top_logprobs(resp: dict, url: str = "") -> Dict[str, float]:
    """The first generated token's top-k ``{text: logprob}`` from a completion answer (the OpenAI legacy
    form, a list of ``{token, logprob}``, or llama-server's ``content[0].top_logprobs``)."""
    try:
        lp = resp["choices"][0].get("logprobs")
    except (KeyError, IndexError, TypeError, AttributeError):
        raise RemoteProtocolError(f"{url}: a completion answer without choices: {str(resp)[:200]}", url=url) from None
    if not lp:
        raise RemoteProtocolError(f"{url}: the answer has no logprobs (the server must return them for a probe; "
                                  "llama-cpp-python needs logits_all, its server's default)", url=url)
    entries = None
    if isinstance(lp.get("top_logprobs"), list) and lp["top_logprobs"]:
        entries = lp["top_logprobs"][0]
    elif isinstance(lp.get("content"), list) and lp["content"]:
        entries = lp["content"][0].get("top_logprobs")
    out: Dict[str, float] = {}
    if isinstance(entries, dict):
        out = {str(k): float(v) for k, v in entries.items() if v is not None}
    elif isinstance(entries, list):
        for e in entries:
            if isinstance(e, dict) and e.get("logprob") is not None:
                tok = e.get("token", e.get("text", ""))
                out[str(tok)] = max(out.get(str(tok), -math.inf), float(e["logprob"]))
    if not out:
        raise RemoteProtocolError(f"{url}: no top logprobs in the answer: {str(lp)[:200]}", url=url)
    return out


def _lse(xs: List[float]) -> float:
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs))


def label_scores(top: Dict[str, float], labels: Sequence[str]) -> Tuple[Dict[str, float], List[str]]:
    """``({label: logprob estimate}, [labels absent from the top-k])``."""
    low = [lab.lower() for lab in labels]
    hits: Dict[str, List[float]] = {lab: [] for lab in labels}
    for text, lp in top.items():
        s = text.strip().lower()
        if not s:
            continue
        owners = [lab for lab, lo in zip(labels, low) if lo.startswith(s)]
        if len(owners) == 1:
            hits[owners[0]].append(lp)
    mass = sum(math.exp(v) for v in top.values())
    bound = min(min(top.values()), math.log(max(1e-12, 1.0 - mass)))
    scores, missing = {}, []
    for lab in labels:
        if hits[lab]:
            scores[lab] = _lse(hits[lab])
        else:
            scores[lab] = bound
            missing.append(lab)
    return scores, missing


def normalise(scores: Dict[str, float]) -> Dict[str, float]:
    m = max(scores.values())
    ex = {k: math.exp(v - m) for k, v in scores.items()}
    tot = sum(ex.values())
    return {k: v / tot for k, v in ex.items()}


def _first_choice(ev, url: str) -> dict:
    """The first choice of a streamed event; an error event or a malformed one is a clear error."""
    if isinstance(ev, dict) and ev.get("error"):
        raise RemoteProtocolError(f"{url}: the stream reported an error: {str(ev['error'])[:300]}", url=url)
    choices = ev.get("choices") if isinstance(ev, dict) else None
    if not choices:
        return {}
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise RemoteProtocolError(f"{url}: an event whose choices are not a list of objects: {str(ev)[:200]}", url=url)
    return choices[0]


def probe_body(model: str, prompt, top_k: int, extras: Optional[dict] = None, stream: bool = True) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "logprobs": int(top_k),
            "stream": stream}
    body.update(extras or {})
    return body


def ask(http, body: dict, on_request=lambda: None) -> Tuple[Dict[str, float], dict]:
    """``(top-k {text: logprob}, the answer)`` for a probe request.  Streamed first: llama-cpp-python's
    non-streamed answer computes a log-softmax over the logits of every prompt position (seconds on a
    long context), its stream only over the token's own.  A stream whose token was the end of generation
    carries no logprobs: then the same request unstreamed."""
    url = http.url("/v1/completions")
    on_request()
    stream = http.stream("/v1/completions", dict(body, stream=True))
    try:
        for ev in stream:
            ch = _first_choice(ev, url)
            if ch.get("logprobs"):
                return top_logprobs(ev, url), ev
    finally:
        stream.close()
    on_request()
    resp = http.post("/v1/completions", dict(body, stream=False))
    return top_logprobs(resp, url), resp


__all__ = ["top_logprobs", "label_scores", "normalise", "probe_body", "ask"]
