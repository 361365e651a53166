"""What the model's summary text becomes in the summary message, for the outputs a small model writes after
the facts-first prefill ("Verified facts:\n-"): facts only, "none" or a short way to say nothing, markdown
or numbered headings, "Next steps:" in the plural, a loop, a tool call, a heading-less list, a cut list.
The user's words survive, the message carries no bare heading, and the standing instructions hold only
what the model put under that heading (FakeEngine: the model's outputs are scripted).  Written by an
adversarial review of the prompt change."""
from __future__ import annotations

import itertools
import re

import pytest

import pykvcompact as pk
from fake_engine import FakeEngine, default_responder

ASK = "write a summary of the conversation"
COPIES = True   # a model that copies the listed user messages under the prefilled "Standing instructions:"
RULE = "Never refund more than 50 dollars to ACME."
TASK = "New task: process the refund tickets. Deploy on port 8137."
OWN = "Reply to ACME in English only."   # an instruction the model writes that no kept message holds


def asked(prompt):
    return ASK in prompt.rsplit("<|im_start|>user\n", 1)[-1]


def mk(tmp_path, says, sid, mode="hard", **pol):
    """A session whose model writes ``says(n, request)`` (after the prefilled head) for its n-th summary."""
    n = itertools.count(1)
    seen = []

    def responder(prompt):
        if asked(prompt):
            req = prompt.rsplit("<|im_start|>user\n", 1)[-1]
            seen.append(req)
            out = says(next(n), req)
            if COPIES and "These user messages will not be kept" in req and out.strip() not in ("none", ""):
                listed = [l for l in req.split("These user messages will not be kept", 1)[1].split("\n")
                          if l.startswith("- ")]
                out = "\n" + "\n".join(listed) + "\nVerified facts:\n-" + out
            return out
        return default_responder(prompt)
    eng = FakeEngine(n_ctx=8192, responder=responder, probe_fn=lambda t: 0.9)
    pol.setdefault("summary_max_tokens", 64)
    pol.setdefault("compact_tool", False)
    pol.setdefault("history_tool", False)
    s = pk.Session(eng, system="You are a support agent.", history_dir=tmp_path, session_id=sid,
                   policy=pk.Policy(mode=mode, window=1000, **pol))
    return eng, s, seen


def tool_turn(s, i, words=60):
    call = {"id": f"c{i}", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    s.chat([{"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": " ".join(f"t{i}_{k}" for k in range(words))}],
           max_tokens=16)


def drive(s, turns=30, rule_at=1):
    s.chat(TASK, max_tokens=8)
    for i in range(turns):
        if i == rule_at:
            s.chat(RULE, max_tokens=8)
        tool_turn(s, i)


def summaries(s):
    return [m["content"] for m in s.transcript if m.get("summary")]


def nreb(s):
    return sum(e.name == "rebased" for e in s.events)


def junk(text):
    """A bare prefilled head, a bullet that says nothing, a heading-only line with nothing below."""
    bad = []
    if re.search(r"Verified facts:\n-\s*(\n|$)", text):
        bad.append("bare 'Verified facts:\\n-'")
    if re.search(r"^-\s*\(?(none|n/a|nothing)\)?\.?\s*$", text, re.I | re.M):
        bad.append("none bullet")
    if re.search(r"Verified facts:\s*$", text):
        bad.append("trailing empty 'Verified facts:'")
    return bad


def model_standing(s):
    """The standing instructions the newest summary message holds (SummaryMeta.standing)."""
    msg = [e.msg for e in s._ctx.entries if e.summary][-1]
    return s._maker.meta[id(msg)].standing


# ------------------------------------------------------------------ scripted model outputs (after the prefill)
OUTPUTS = {
    "facts_only": lambda n, r: f" order ORD-{7000 + n} total ${n}.10\n- refund REF-{n} approved",
    "facts_then_standing": lambda n, r: (f" order ORD-{7000 + n} total ${n}.10\nStanding instructions:\n- {RULE}\n"
                                         f"Next step: email ticket T-{n}"),
    "none_only": lambda n, r: " none",
    "markdown": lambda n, r: (f" order ORD-{7000 + n}\n\n**Standing instructions:**\n- {RULE}\n\n"
                              f"**Next step:** email ticket T-{n}"),
    "loop": lambda n, r: "".join(" ticket T-1 is still open\n-" for _ in range(60)),
    "tool_call": lambda n, r: ' <tool_call>\n{"name": "lookup", "arguments": {"id": 1}}\n</tool_call>',
    "heading_less": lambda n, r: f" ORD-{7000 + n} shipped\n- REF-{n} approved\n- {RULE}",
    "empty": lambda n, r: "",
}


@pytest.mark.parametrize("kind", list(OUTPUTS))
@pytest.mark.parametrize("keep_user_tokens", [200, 0])   # 200: the rule stays kept; 0: it is listed to copy
def test_outputs_survive_several_compactions(kind, keep_user_tokens, tmp_path):
    eng, s, seen = mk(tmp_path, OUTPUTS[kind], f"a-{kind}-{keep_user_tokens}", keep_user_tokens=keep_user_tokens)
    drive(s)
    assert nreb(s) >= 3, nreb(s)
    live = s.render()
    assert RULE in live and "Deploy on port 8137." in live
    for text in summaries(s):
        assert not junk(text), (junk(text), text)
    assert s.tokens == eng.tokenize(live)


@pytest.mark.parametrize("mode", ["hard", "background"])
def test_standing_written_after_the_facts_is_extracted_and_kept(mode, tmp_path):
    """No user message over budget (head = facts); the model writes an instruction under a later heading."""
    says = lambda n, r: f" order ORD-{7000 + n}\nStanding instructions:\n- {OWN}\nNext step: email T-{n}"  # noqa: E731
    eng, s, seen = mk(tmp_path, says, f"b-{mode}", mode=mode, keep_user_tokens=200)
    drive(s)
    assert any(OWN in x for x in model_standing(s)), model_standing(s)


# ------------------------------------------------------------------ realistic non-"none" ways to say nothing
@pytest.mark.parametrize("says", [" (none)", " none.", " N/A", " -"])
def test_a_facts_bullet_that_says_nothing_is_not_kept(says, tmp_path):
    eng, s, seen = mk(tmp_path, lambda n, r: says, f"c-{len(says)}", keep_user_tokens=200)
    drive(s, 20)
    assert nreb(s) >= 2
    for text in summaries(s):
        assert "Verified facts:\n-" + says.strip() not in text, text


# ------------------------------------------------------------------ heading variants a small model writes
def test_plural_next_steps_after_standing_is_not_a_standing_instruction(tmp_path):
    says = lambda n, r: (f" order ORD-{7000 + n}\nStanding instructions:\n- {RULE}\nNext steps:\n"  # noqa: E731
                         f"- email ticket T-{n}")
    eng, s, seen = mk(tmp_path, says, "d", keep_user_tokens=200)
    drive(s)
    st = model_standing(s)
    assert not any("email ticket" in x or x.startswith("Next steps") for x in st), st


def test_numbered_standing_heading_is_extracted(tmp_path):
    says = lambda n, r: (f" order ORD-{7000 + n}\n2. Standing instructions:\n- {OWN}\n3. Next step:\n"  # noqa: E731
                         f"- email ticket T-{n}")
    eng, s, seen = mk(tmp_path, says, "e", keep_user_tokens=200)
    drive(s)
    assert any(OWN in x for x in model_standing(s)), model_standing(s)


# ------------------------------------------------------------------ carried facts keep their heading
def test_carried_facts_of_a_later_summary_stay_under_verified_facts(tmp_path):
    """Each model summary starts with the same line "Verified facts:"; when the bodies are carried forward
    (plan.carried = informative(bodies)), the repeated heading line is dropped, so a later summary's facts
    land under the earlier summary's last heading ("Next step: ...")."""
    says = lambda n, r: f" order ORD-{7000 + n} shipped\nNext step: email ticket T-{n}"  # noqa: E731
    eng, s, seen = mk(tmp_path, says, "f", keep_user_tokens=200)
    drive(s, 60)
    bad = []
    for text in summaries(s) + [m.body for m in s._maker.meta.values()]:
        bad += re.findall(r"Next step: email ticket T-\d+\n-order ORD-\d+ shipped", text)
    assert not bad, bad


def test_first_fact_keeps_its_bullet_space(tmp_path):
    eng, s, seen = mk(tmp_path, OUTPUTS["facts_only"], "g", keep_user_tokens=200)
    drive(s, 12)
    text = summaries(s)[-1]
    assert "Verified facts:\n- order ORD-" in text, text


# ------------------------------------------------------------------ cut at the token budget (over_length)
def test_a_cut_list_of_facts_keeps_its_complete_lines(tmp_path):
    says = lambda n, r: "".join(f" fact F{n}_{k} = {k * 7}\n-" for k in range(80))  # noqa: E731
    eng, s, seen = mk(tmp_path, says, "h", keep_user_tokens=200)
    drive(s, 20)
    texts = summaries(s)
    assert texts and all(not junk(t) for t in texts), [junk(t) for t in texts]
    model = [t for t in texts if "fact F" in t]
    assert model, "no model summary kept"
    for t in model:   # no cut line: every listed fact is whole
        assert not re.search(r"fact F\d+_\d+ = ?$", t, re.M), t


def test_one_long_line_cut_at_the_budget_is_not_a_bare_heading(tmp_path):
    says = lambda n, r: " " + " ".join(f"ORD-{k}" for k in range(400))  # noqa: E731
    eng, s, seen = mk(tmp_path, says, "i", keep_user_tokens=200)
    drive(s, 20)
    assert nreb(s) >= 2
    for t in summaries(s):
        assert not junk(t), t


def test_next_steps_absorbed_into_standing_do_not_push_out_the_users_rule(tmp_path):
    """The rule is over budget (listed, copied under the prefilled heading once); later summaries (facts
    head) write a standing section followed by "Next steps:" (plural): each summary's next step becomes a
    standing instruction, and trim_standing drops the oldest first."""
    def says(n, r):
        if "These user messages will not be kept" in r:
            return ""   # COPIES adds the listed rule under the prefilled "Standing instructions:"
        return (f" order ORD-{7000 + n} shipped\nStanding instructions:\n- Reply in English.\nNext steps:\n"
                f"- email the customer about ticket T-{n} and close refund request REF-{n} today")
    eng, s, seen = mk(tmp_path, lambda n, r: says(n, r) or " ok", "j", keep_user_tokens=0)
    drive(s, 80)
    assert nreb(s) >= 8
    st = model_standing(s)
    assert not any("ticket T-" in x for x in st), st
    assert RULE in s.render()


@pytest.mark.parametrize("heading", ["Standing instructions:", "## Standing instructions", "STANDING INSTRUCTIONS",
                                     "2. Standing Instructions:", "**Standing instruction:**"])
def test_standing_heading_variants_are_read_and_the_next_heading_ends_them(heading):
    from pykvcompact.compaction.summary.keeper import split_standing
    for nxt in ("Next steps:", "Decisions:", "### Next step", "Open items:", "**Goal:**"):
        text = f"Verified facts:\n- ORD-7 shipped\n{heading}\n- {RULE}\n{nxt}\n- email T-1"
        standing, rest = split_standing(text)
        assert standing == [f"- {RULE}"], (heading, nxt, standing)
        assert "email T-1" in rest and "ORD-7 shipped" in rest


@pytest.mark.parametrize("line,nothing", [("none", True), ("- (none)", True), ("None.", True),
                                          ("N/A", True), ("- nothing", True), ("-", True),
                                          ("None failed.", False), ("Nothing on Fridays.", False),
                                          ("None of the refunds were approved", False),
                                          ("none of 12 tests failed", False), ("No refunds over 50 EUR", False)])
def test_a_line_that_says_nothing(line, nothing):
    from pykvcompact.compaction.summary.keeper import _NONE_RE
    assert bool(_NONE_RE.match(line)) is nothing


def test_the_requests_own_sentences_are_not_kept_as_standing_instructions(tmp_path):
    """Qwen2.5-Coder-1.5B filed the summary request's sentences under "Standing instructions" ("Do not call
    any tool.", "Save the full messages in ..."): carried forward, they would steer every later turn."""
    says = lambda n, r: (f" order ORD-{7000 + n} shipped\nStanding instructions:\n- Do not call any tool.\n"  # noqa: E731
                         f"- Save the full messages in history/x.jsonl.\n- {OWN}\nNext step: email T-{n}")
    eng, s, seen = mk(tmp_path, says, "k", keep_user_tokens=200, summary_max_tokens=120)
    drive(s)
    assert nreb(s) >= 3
    st = model_standing(s)
    assert any(OWN in x for x in st) and not any("call any tool" in x or "full messages" in x for x in st), st
    assert "Do not call any tool" not in s.render()


def test_only_the_requests_own_sentences_are_left_out_of_the_standing_instructions():
    from pykvcompact.compaction.summary.keeper import not_the_request, words_of
    from pykvcompact.compaction.summary.summarizer import summarizer_request
    request = words_of(summarizer_request("history/x.jsonl", 100, has_earlier=True))
    users = words_of("Do not email the customer yet; tell me if any ticket is missing. Save the report in "
                     "out/report.csv and show me the full list. Copy the numbers word for word. "
                     "请不要修改billing.py文件，部署端口是8137。 Não faça deploy às sextas.")
    lines = ["- Do not call any tool.", "- Save the full messages in history/x.jsonl.", "Write plain text.",
             "- Do not email the customer yet.", "- Copy the numbers word for word.", "- 不要修改billing.py文件",
             "- Do not deploy on Fridays.", "- Nao faca deploy as sextas", "- Deploy on port 8137/8138."]
    assert not_the_request(lines, request, users) == lines[3:]


def test_request_sentences_go_even_when_the_user_used_some_of_their_words(tmp_path):
    says = lambda n, r: (f" order ORD-{7000 + n} shipped\nStanding instructions:\n- Do not call any tool.\n"  # noqa: E731
                         f"- Save the full messages in history/x.jsonl.\nNext step: email T-{n}")
    eng, s, seen = mk(tmp_path, says, "l", keep_user_tokens=200, summary_max_tokens=120)
    s.chat("New task: process the refund tickets.", max_tokens=8)
    s.chat("Do not email the customer yet; tell me if any ticket is missing.", max_tokens=8)
    s.chat("Save the report in out/report.csv and show me the full list.", max_tokens=8)
    for i in range(20):
        tool_turn(s, i)
    assert nreb(s) >= 3
    assert not any("call any tool" in x or "full messages" in x for x in model_standing(s)), model_standing(s)


@pytest.mark.parametrize("rule", ["Files: never edit billing.py or anything under /etc.",
                                  "Decision: always ask j.berg before refunds.", "Facts: the prod DB is read-only.",
                                  "Nothing on Fridays.", "None for ACME on weekends."])
def test_a_users_rule_that_looks_like_a_heading_or_like_nothing_stays_a_rule(rule):
    from pykvcompact.compaction.summary.keeper import split_standing
    standing, rest = split_standing(f"Standing instructions:\n- {rule}\n- Reply in English.\nVerified facts:\n- ORD-7")
    assert standing == [f"- {rule}", "- Reply in English."], standing


@pytest.mark.parametrize("fact", ["- None failed.", "- Nothing was deleted.", "- N/A for ACME"])
def test_a_short_negative_fact_is_kept(fact):
    from pykvcompact.compaction.summary.novelty import informative
    assert fact in informative("Verified facts:\n- ORD-7 shipped\n" + fact + "\nNext step: email T-1")


def test_a_model_that_starts_with_its_own_bullet_gets_no_second_one(tmp_path):
    eng, s, seen = mk(tmp_path, lambda n, r: f"\n- order ORD-{n} shipped\n- REF-{n} approved", "m",
                      keep_user_tokens=200)
    drive(s, 12)
    text = summaries(s)[-1]
    assert "Verified facts:\n- order ORD-" in text and "- - order" not in text, text


def test_a_near_verbatim_copy_of_an_instruction_counts_once():
    from pykvcompact.compaction.summary.keeper import merge_standing, standing_key
    rule = "Don't refund more than 50 dollars to ACME."
    assert merge_standing([rule], ["- Don\u2019t refund more than 50 dollars to ACME", f"**{rule}**"]) == [rule]
    assert standing_key(rule) in standing_key(f"Standing instructions:\n- \u201c{rule[:-1]}\u201d\nNext step: x")


def test_a_kept_user_message_the_model_copied_as_an_instruction_is_said_once(tmp_path):
    """The default model copied the user's requests ("Next ticket: ...") under the standing instructions,
    beside the same messages kept verbatim."""
    says = lambda n, r: (f" order ORD-{7000 + n} shipped\nStanding instructions:\n- {TASK}\n- {RULE}\n"  # noqa: E731
                         f"Next step: email T-{n}")
    eng, s, seen = mk(tmp_path, says, "n", keep_user_tokens=200, summary_max_tokens=120)
    drive(s)
    assert nreb(s) >= 3
    live = s.render()
    assert live.count(RULE) == 1 and live.count(TASK) == 1, live
