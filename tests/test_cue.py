"""Issue 33: the probe's cue is structural (the assistant answered without calling a tool; a user message
arrived since the last probe), never the wording of a tool's output; its weight is ``Policy.cue_weight``
(``result_cue`` accepted as the deprecated name)."""
from __future__ import annotations

import dataclasses

import pytest

import pykvcompact as pk
from pykvcompact.compaction import policy as P
from pykvcompact.compaction.cue import answered, structural_cue

from fake_engine import FakeEngine


def call(i, name, **args):
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": args}}]}


def out(i, text):
    return {"role": "tool", "tool_call_id": f"c{i}", "content": text}


USER = {"role": "user", "content": "Now reconcile ACC-2."}
ANSWER = {"role": "assistant", "content": "ACC-1 is settled."}


# ------------------------------------------------------------------ the pure function
def test_a_tool_call_a_plain_answer_and_a_user_message():
    history = [{"role": "user", "content": "Reconcile ACC-1."}, call(0, "list"), out(0, "tx 1\ntx 2")]
    # the newest message is a tool output, nothing new from the user since the last probe: no cue
    assert structural_cue(history, new=2) == ""
    # the assistant answered in text, no tool call
    assert structural_cue(history + [ANSWER], new=1) == "answered"
    assert answered(ANSWER) and not answered(call(1, "settle")) and not answered(USER)
    # ... a tool call with text is not an answer, nor an empty reply
    with_text = dict(call(1, "settle"), content="Settling now.")
    assert structural_cue(history + [with_text], new=1) == ""
    assert structural_cue(history + [{"role": "assistant", "content": "  "}], new=1) == ""
    # content as a list of parts
    assert structural_cue(history + [{"role": "assistant", "content": [{"type": "text", "text": "Done."}]}], 1) == \
        "answered"
    # a user message since the last probe, then the assistant's tool call and its output
    turn = [USER, call(1, "list"), out(1, "tx 3")]
    assert structural_cue(history + turn, new=3) == "user"
    # the same user message, already seen by the last probe: no cue
    assert structural_cue(history + turn, new=2) == ""
    # the first probe: everything is new (the task is a user message)
    assert structural_cue(history, new=len(history)) == "user"
    # while the assistant is still writing, the last complete answer is not "answered"
    assert structural_cue(history + [ANSWER], new=1, replying=True) == ""
    assert structural_cue([], new=0) == "" and structural_cue(history, new=99) == "user"


def test_the_wording_of_a_tool_output_is_no_cue():
    """What the removed regex called a result, an error or progress: all the same to the structural cue."""
    for text in ("Settled total: -1,037.25", "Registry check passed. The verified launch code is HR-8619",
                 "Error: connection refused", "Progress: 45%", "12 passed in 0.20s [100%]",
                 "Found 12 matches in 4 files"):
        assert structural_cue([call(0, "t"), out(0, text)], new=2) == "", text


# ------------------------------------------------------------------ the verdict and the weight
def test_verdict_with_the_cue():
    p = pk.Policy(mode="rubric", window=1000, threshold=0.5, cue_weight=0.2)
    lim = p.limits(1000)
    assert P.verdict(p, lim, 0.45, 500) == ("CONTINUE", "model")
    assert P.verdict(p, lim, 0.45, 500, cue=True) == ("COMPRESS", "model+cue")
    assert P.verdict(p, lim, 0.25, 500, cue=True) == ("CONTINUE", "model")
    assert P.verdict(p, lim, 0.55, 500, cue=True) == ("COMPRESS", "model")
    assert P.verdict(p.with_(cue_weight=0.0), lim, 0.45, 500, cue=True) == ("CONTINUE", "model")
    assert P.verdict(p, lim, 0.99, 100, cue=True) == ("CONTINUE", "below_floor")
    # the default weight is 0: the stored calibration gave the cue no value (bench/eval/calibrate.py --lofo)
    assert pk.Policy().cue_weight == 0.0
    assert P.verdict(pk.Policy(mode="rubric", window=1000, threshold=0.5), lim, 0.45, 500, cue=True) == \
        ("CONTINUE", "model")


def test_result_cue_is_the_deprecated_name_of_cue_weight():
    p = pk.Policy(result_cue=0.3)
    assert p.cue_weight == 0.3 and p.result_cue == 0.3
    assert p.with_(result_cue=0.1).cue_weight == 0.1
    assert dataclasses.replace(p, result_cue=0.05).cue_weight == 0.05
    assert p.with_(cue_weight=0.2).cue_weight == 0.2          # the old value is not carried over the new one
    p.result_cue = 0.25
    assert p.cue_weight == 0.25
    assert "result_cue" not in dataclasses.asdict(p)
    with pytest.raises(ValueError, match="cue_weight"):
        pk.Policy(result_cue=1.5)
    with pytest.raises(ValueError, match="cue_weight"):
        pk.Policy(cue_weight=-0.1)


# ------------------------------------------------------------------ the prober uses it
def _session(tmp_path, **pol):
    eng = FakeEngine(n_ctx=8192, probe_fn=lambda t: 0.4)
    kw = dict(mode="rubric", window=1000, threshold=0.5, compact_tool=False, history_tool=False,
              summary_max_tokens=96, probe_min_fill=0.0, cue_weight=0.2)
    kw.update(pol)
    return pk.Session(eng, history_dir=tmp_path, session_id="cue", policy=pk.Policy(**kw))


def page(i, n=3):
    return "\n".join(f"tx ACC-1-{i}{k:02d} {k * 13.5 - 40:+.2f} Acme" for k in range(n))


def test_the_prober_adds_the_weight_after_a_user_turn_not_after_a_stated_result(tmp_path):
    s = _session(tmp_path)
    s.add({"role": "user", "content": "Reconcile ACC-1."})
    for i in range(4):  # the first due probe sees the task (then skipped: nothing to cut yet), the rest nothing new
        s.add([call(i, "list_transactions", page=i + 1), out(i, page(i))])
    s.add([call(4, "settle", account="ACC-1"), out(4, "Settled total: -1,037.25")])   # the old regex's cue
    probes = [e for e in s.events if e.name == "probe"]
    assert len(probes) >= 2 and probes[-1].cue is False
    assert all((e.verdict, e.cue, e.reason) == ("CONTINUE", False, "model") for e in probes)
    s.add([USER, call(5, "list_transactions", page=1), out(5, page(5))])
    last = [e for e in s.events if e.name == "probe"][-1]
    assert (last.verdict, last.cue, last.reason) == ("COMPRESS", True, "model+cue")
    assert [e.trigger for e in s.events if e.name == "rebased"][-1] == "compress"
    s.close()


def test_the_prober_sees_a_plain_answer(tmp_path):
    """A reply that answers in text (the fake model's) is the cue at the probe after the turn."""
    s = _session(tmp_path, probe_every=4, probe_on_tool_result=False)
    s.add({"role": "user", "content": "Reconcile ACC-1."})
    for i in range(4):
        s.add([call(i, "list_transactions", page=i + 1), out(i, page(i))])
    r = s.chat([], max_tokens=32)
    assert not r["choices"][0]["message"].get("tool_calls")
    probes = [e for e in s.events if e.name == "probe"]
    # the probe after the turn: the reply is complete, in text, no tool call
    assert probes and probes[-1].cue and (probes[-1].verdict, probes[-1].reason) == ("COMPRESS", "model+cue")
    assert sum(e.name in ("probe", "probe_skipped") for e in s.events) >= 1
    s.close()


def test_no_cue_without_weight_changes_nothing_but_is_reported(tmp_path):
    s = _session(tmp_path, cue_weight=0.0)
    s.add({"role": "user", "content": "Reconcile ACC-1."})
    for i in range(4):
        s.add([call(i, "list_transactions", page=i + 1), out(i, page(i))])
    s.add([USER, call(5, "list_transactions", page=1), out(5, page(5))])
    last = [e for e in s.events if e.name == "probe"][-1]
    assert (last.verdict, last.cue, last.reason) == ("CONTINUE", True, "model")
    s.close()


def test_an_older_log_does_not_bring_back_the_wording_cues_weight(tmp_path):
    """Review: logs written before the structural cue stored result_cue=0.2 (the weight of a wording cue that
    is gone); loaded, that must not turn the structural cue on."""
    import json
    import os

    from fake_engine import FakeEngine
    s = pk.Session(FakeEngine(n_ctx=8192), system="You are a test.", history_dir=tmp_path, session_id="old",
                   policy=pk.Policy(mode="background", window=2400, compact_tool=False, history_tool=False))
    s.chat("hello", max_tokens=8)
    log = s.log_path
    s.close()
    recs = [json.loads(x) for x in open(log).read().splitlines()]
    for r in recs:
        if "policy" in r:
            r["policy"].pop("cue_weight")
            r["policy"].pop("notes")
            r["policy"]["result_cue"] = 0.2   # as every log before it stored the policy
    with open(log, "w") as f:
        f.write("\n".join(json.dumps(r) for r in recs) + "\n")
    s2 = pk.Session.load(FakeEngine(n_ctx=8192), log)
    assert s2.policy.cue_weight == 0.0 and s2.policy.takes_notes
    s2.close()
    assert os.path.exists(log)
