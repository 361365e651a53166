"""One episode under one of our policies: the environment drives the session through the tool steps,
then the questions are asked through the session and scored."""
from __future__ import annotations

import time

from .environment import Environment
from .episode import Episode
from .policies import Settings, make_policy
from .recorder import Recorder
from .scoring import ANSWER_GRAMMAR, is_correct


def token_delta(before: dict, after: dict, decode: int) -> dict:
    """Tokens evaluated, from ``engine.stats()``: foreground rows not spent on replies are prefill (the
    history, and synchronous summaries written on a fork); probe and background rows as counted."""
    fg = after["rows"]["foreground"] - before["rows"]["foreground"]
    out = {"prefill": fg - decode, "decode": decode,
           "probe": after["rows"]["probe"] - before["rows"]["probe"],
           "background": after["rows"]["background"] - before["rows"]["background"]}
    out["total"] = sum(out.values())
    # (not evaluated, so not in the total: rebased tokens found already in place and shared)
    out["reused"] = after.get("rebase_reused_rows", 0) - before.get("rebase_reused_rows", 0)
    return out


def _answer(session, env, prompt: str, settings, *, searching: bool):
    """The reply to one final question and its completion tokens.  Without the search tool the reply is
    constrained to one line of text.  With it the model may first call ``search_history`` (the session runs
    it and the model answers from the result); a reply that is not text (another tool call) is answered by
    the environment and the question asked again, constrained."""
    if not searching:
        r = session.chat(prompt, max_tokens=settings.answer_tokens, grammar=ANSWER_GRAMMAR)
        return r["choices"][0]["message"].get("content") or "", r["usage"]["completion_tokens"]
    r = session.chat(prompt, max_tokens=settings.answer_tokens + 40)
    n, msg = r["usage"]["completion_tokens"], r["choices"][0]["message"]
    if (msg.get("content") or "").strip() and not msg.get("tool_calls"):
        return msg["content"], n
    pending = env.answer(msg)
    if pending:
        session.add(pending)
    r = session.chat(prompt, max_tokens=settings.answer_tokens, grammar=ANSWER_GRAMMAR)
    return r["choices"][0]["message"].get("content") or "", n + r["usage"]["completion_tokens"]


def tool_wait(session, seconds: float) -> None:
    """The scripted tool takes ``seconds``: the session may use them (``Session.idle``), the rest is slept."""
    if seconds <= 0:
        return
    t0 = time.perf_counter()
    session.idle(seconds)
    time.sleep(max(0.0, seconds - (time.perf_counter() - t0)))


def run_episode(engine, ep: Episode, policy_name: str, settings: Settings, history_dir: str) -> dict:
    import pykvcompact as pk

    policy = make_policy(policy_name, ep.family, settings)
    env = Environment(ep)
    before = engine.stats()
    t0 = time.perf_counter()
    session = pk.Session(engine, system=ep.system, policy=policy, tools=ep.tools, history_dir=history_dir,
                         session_id=f"{ep.family}-{ep.seed}-{policy_name.replace('+', '_')}")
    rec = Recorder(ep, session.window)
    decode, pending, answers, replies = 0, [], [], []
    try:
        session.add({"role": "user", "content": ep.task})
        rec.after(session, -1, adding=True)
        for i, step in enumerate(ep.steps):
            tool_wait(session, settings.tool_latency)
            session.add(pending + env.step_messages(i, step))
            pending = []
            rec.after(session, i, adding=True)
            if step.say:   # the assistant's scripted statement is the step's reply
                replies.append(step.say)
                continue
            r = session.chat([], max_tokens=settings.reply_tokens)
            decode += r["usage"]["completion_tokens"]
            replies.append(r["choices"][0]["message"].get("content") or "")
            rec.after(session, i, adding=False)
            pending = env.answer(r["choices"][0]["message"])
        if pending:
            session.add(pending)
        for q in ep.questions:
            reply, n = _answer(session, env, q.prompt, settings, searching=policy.history_tool)
            decode += n
            rec.after(session, len(ep.steps), adding=False)
            answers.append({"prompt": q.prompt, "answer": q.answer, "reply": reply, "early": q.early,
                            "place": q.place, "correct": is_correct(reply, q.answer)})
    finally:
        window = session.window
        session.close()
    wall = time.perf_counter() - t0
    searches = [m for m in session.transcript if m.get("role") == "tool" and m.get("name") == "search_history"]
    return dict(family=ep.family, seed=ep.seed, policy=policy_name, window=window, wall_s=wall,
                answers=answers, replies=replies, tokens=token_delta(before, engine.stats(), decode),
                model_tool_calls=env.model_calls, model_tool_calls_matched=env.model_calls_matched,
                search_calls=len(searches),
                search_found=sum(any(is_correct(m["content"], q.answer) for q in ep.questions) for m in searches),
                **rec.result())
