"""Recall (compaction/recall.py): a new user message or tool call that names something only the offloaded
history holds brings its best lines (the search_history ranking) back into the live context before the
reply, within a small budget, as a flagged tool message — and nothing happens otherwise."""
from __future__ import annotations

import json
import time

import pytest

import pykvcompact as pk
from pykvcompact import events as ev
from pykvcompact.compaction.tools import history_search
from pykvcompact.session.session import ContextWindowError
from pykvcompact.compaction import names as naming, recall

from fake_engine import FakeEngine, default_responder

QUESTION = "What is max_pool_size in services/auth/config.toml?"
HEADER_START = "Recalled from the offloaded history (search_history found these lines for "
TOOLS = [{"type": "function", "function": {"name": n, "description": d,
                                           "parameters": {"type": "object", "properties": {p: {"type": "string"}}}}}
         for n, d, p in (("read_file", "Read a file of the repository", "path"),
                         ("get_account", "Look an account up", "account_id"),
                         ("tail_log", "The last lines of a service log", "service"))]


# ---------------------------------------------------------------------------- realistic outputs
def config_toml() -> str:
    """A 40-line TOML listing with ``max_pool_size = 47`` on line 20 (nobody restates it)."""
    lines = ["# services/auth/config.toml", "[server]", 'host = "0.0.0.0"', "port = 8443",
             "read_timeout_ms = 2500", "", "[database]", 'url = "postgres://auth@db.internal:5432/auth"',
             "min_pool_size = 4", "statement_timeout_ms = 9000", "", "[cache]", 'backend = "redis"',
             "ttl_seconds = 300", "", "[tokens]", 'issuer = "https://auth.example.com"', "lifetime_s = 3600",
             "", "max_pool_size = 47"]
    k = 0
    while len(lines) < 40:
        lines.append(f"feature_flag_{k} = {'true' if k % 3 else 'false'}")
        k += 1
    assert lines[19] == "max_pool_size = 47"
    return "\n".join(lines)


def deployment_yaml() -> str:
    return "\n".join(["apiVersion: apps/v1", "kind: Deployment", "metadata:", "  name: payments-api",
                      "  namespace: prod", "spec:", "  replicas: 7", "  template:", "    spec:",
                      "      containers:", "        - name: api", "          image: registry.local/payments:4.12.3",
                      "          resources:", "            limits:", "              memory: 1536Mi",
                      "              cpu: 1500m", "          env:", "            - name: GATEWAY_RETRIES",
                      "              value: \"5\""])


def accounts_jsonl() -> str:
    rows = [{"account_id": f"ACC-10{k:02d}", "status": "active" if k % 4 else "frozen", "balance": 100 + 37 * k,
             "currency": "EUR"} for k in range(24)]
    return "\n".join(json.dumps(r) for r in rows)


def auth_log() -> str:
    out = []
    for k in range(30):
        lvl = "WARN" if k % 7 == 3 else "INFO"
        req = f"req-{8800 + k}"
        out.append(f"2024-05-0{1 + k % 9}T10:{k:02d}:11Z {lvl} auth {req} latency_ms={40 + k} status=200")
    out[17] = "2024-05-08T10:17:11Z ERROR auth req-8817 upstream build_77 timed out after 3000 ms"
    return "\n".join(out)


def call(cid: str, name: str, **args) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


# ---------------------------------------------------------------------------- sessions
class Recorder:
    """The fake model: remembers each prompt it answered (the last one is what the reply was written on)."""

    def __init__(self):
        self.prompts = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return default_responder(prompt)


def make(tmp_path, *, window=4096, recall_tokens=None, mode="hard", **pol):
    rec = Recorder()
    eng = FakeEngine(n_ctx=16384, responder=rec)
    pol.setdefault("summary_max_tokens", 48)
    pol.setdefault("compact_tool", False)
    kw = {} if recall_tokens is None else {"recall_tokens": recall_tokens}
    s = pk.Session(eng, system="You are a careful ops agent.", history_dir=tmp_path, tools=TOOLS,
                   policy=pk.Policy(mode=mode, window=window, **pol), **kw)
    return eng, s, rec


def agent_history(s) -> None:
    """An agent's early work replayed with Session.add: it reads a config, a deployment, an accounts dump
    and a log; the assistant never restates a value."""
    s.add([{"role": "user", "content": "Audit the auth and payments services before the release."},
           {"role": "assistant", "content": None,
            "tool_calls": [call("c1", "read_file", path="services/auth/config.toml")]},
           {"role": "tool", "tool_call_id": "c1", "name": "read_file", "content": config_toml()},
           {"role": "assistant", "content": "Read the auth config; next the payments deployment."},
           {"role": "assistant", "content": None,
            "tool_calls": [call("c2", "read_file", path="k8s/payments/deployment.yaml")]},
           {"role": "tool", "tool_call_id": "c2", "name": "read_file", "content": deployment_yaml()},
           {"role": "assistant", "content": None, "tool_calls": [call("c3", "get_account", account_id="all")]},
           {"role": "tool", "tool_call_id": "c3", "name": "get_account", "content": accounts_jsonl()},
           {"role": "assistant", "content": None, "tool_calls": [call("c4", "tail_log", service="auth")]},
           {"role": "tool", "tool_call_id": "c4", "name": "tail_log", "content": auth_log()}])


def filler(s, n=5) -> None:
    for i in range(n):
        s.chat(f"Step {i}: continue with the next part of the review and keep notes short. "
               + " ".join(f"note{i}x{k}" for k in range(25)), max_tokens=12)


def offloaded_session(tmp_path, **kw):
    eng, s, rec = make(tmp_path, **kw)
    agent_history(s)
    filler(s)
    s.compact()
    live = s.render()
    assert s.offloaded and "max_pool_size = 47" not in live and "replicas: 7" not in live
    return eng, s, rec


def recalls(s):
    """The recall results in the live context (each follows its search_history call, also flagged)."""
    return [m for m in s.messages if m.get("recall") and m["role"] == "tool"]


def recalled_events(s):
    return [e for e in s.events if isinstance(e, ev.Recalled)]


# ---------------------------------------------------------------------------- names, by syntax
@pytest.mark.parametrize("text,names", [
    (QUESTION, ["max_pool_size", "services/auth/config.toml"]),
    ("Why did build_77 fail for ACC-1042 at 10:30 on 2024-05-08?", ["build_77", "ACC-1042", "10:30", "2024-05-08"]),
    ("Check getUserById in /etc/auth/hosts and the 4,096 limit", ["getUserById", "/etc/auth/hosts", "4,096"]),
    ('Use the "blue-green rollout" and `db.pool.size`', ["blue-green rollout", "db.pool.size"]),
    ("Please continue and check the configuration again, then report the total and/or failures, e.g. the "
     "warnings.", []),
    ("Was it 47 or 12 (well-known issue)?", []),
    ('{"path": "src/app.py"}', ["src/app.py"]),
])
def test_names_are_recognised_by_syntax_only(text, names):
    assert naming.names_in(text) == names


def test_names_of_messages_of_every_shape():
    assert naming.names_of_message({"role": "assistant", "content": None,
                                    "tool_calls": [call("x", "read_file", path="services/auth/config.toml")]}) == \
        ["services/auth/config.toml"]   # the argument values, not the function's name (read_file)
    bad = {"role": "assistant", "content": None,
           "tool_calls": [{"function": {"name": "f", "arguments": "{oops ACC-7 build_9"}}, "junk", {"x": 1}]}
    assert naming.names_of_message(bad) == ["ACC-7", "build_9"]   # unparsable arguments: their text
    assert naming.names_of_message({"role": "user", "content": [{"type": "text", "text": "see ACC-1042"},
                                                                {"type": "image_url"}]}) == ["ACC-1042"]
    for m in ({"role": "user", "content": 7}, {"role": "user"}, {"role": "tool", "content": "ACC-1"},
              {"role": "user", "content": "ACC-1042", "summary": True}, "ACC-1042", None,
              {"role": "assistant", "tool_calls": "nope"}):
        assert naming.names_of_message(m) == []
    huge = "filler text " * 50000 + " finally ask about build_1234?"
    t = time.perf_counter()
    assert naming.names_in(huge) == ["build_1234"]   # the head and tail are scanned
    assert time.perf_counter() - t < 1.0


# ---------------------------------------------------------------------------- the session
def test_a_value_in_the_middle_of_an_offloaded_output_is_recalled_before_the_reply(tmp_path):
    _, s, rec = offloaded_session(tmp_path)
    n_before = len(s.transcript)
    got = list(s.stream(QUESTION, max_tokens=12))
    # the event is streamed, before the reply's text
    evs = [x for x in got if isinstance(x, ev.Recalled)]
    assert len(evs) == 1 and "max_pool_size" in evs[0].names and evs[0].lines >= 1
    assert got.index(evs[0]) < min(k for k, x in enumerate(got) if isinstance(x, str))
    assert evs[0].to_dict()["event"] == "recalled"
    # the live context: the recall (a search_history call and its result), then the question, then the reply:
    # the question is the last thing the model reads before it answers
    msgs = s.messages
    k = next(i for i, m in enumerate(msgs) if m.get("recall") and m["role"] == "tool")
    assert msgs[k + 1] == {"role": "user", "content": QUESTION}
    lookup = msgs[k - 1]
    assert lookup["role"] == "assistant" and lookup["recall"] is True and not lookup["content"]
    [c] = lookup["tool_calls"]
    assert c["function"]["name"] == history_search.NAME and "max_pool_size" in c["function"]["arguments"]
    assert msgs[k + 2]["role"] == "assistant"
    m = msgs[k]
    assert m["role"] == "tool" and m["name"] == history_search.NAME and m["recall"] is True
    assert m["tool_call_id"] == c["id"]
    assert m["content"].startswith(HEADER_START + "max_pool_size")
    assert "max_pool_size = 47" in m["content"].splitlines()
    # the model wrote its reply on a prompt that held the line
    assert "max_pool_size = 47" in rec.prompts[-1]
    assert rec.prompts[-1].index("max_pool_size = 47") < rec.prompts[-1].index(QUESTION)
    # it is in the transcript (and so in the log) where it was added
    assert [x.get("recall") for x in s.transcript[n_before:]] == [True, True, None, None]
    s.close()


def test_yaml_and_json_lines_are_recalled_by_the_words_around_the_name(tmp_path):
    _, s, _ = offloaded_session(tmp_path)
    # the path is visible (the summary lists the read_file call that read it), the value the file holds is
    # not: the file's line that answers is recalled (the call's path ranks its output's lines)
    assert "k8s/payments/deployment.yaml" in s.render() and "replicas: 7" not in s.render()
    s.chat("How many replicas does k8s/payments/deployment.yaml ask for?", max_tokens=8)
    body = recalls(s)[-1]["content"].splitlines()
    assert body[0] == HEADER_START + "k8s/payments/deployment.yaml):"
    assert body[1].startswith("[message ") and body[2] == "  replicas: 7"
    # an indented YAML key, named by its syntax; the question's other words rank the lines too, and a line
    # the live context shows (recalled above) is not recalled again
    s.chat("Is GATEWAY_RETRIES still 5 for payments, and how many replicas run?", max_tokens=8)
    body = recalls(s)[-1]["content"].splitlines()
    assert body[0] == HEADER_START + "GATEWAY_RETRIES):"
    assert "            - name: GATEWAY_RETRIES" in body and "  replicas: 7" not in body
    # JSON lines: the account's own line, not its neighbours
    s.chat("What is the balance of ACC-1017 and is it frozen?", max_tokens=8)
    body = recalls(s)[-1]["content"].splitlines()
    assert body[1].startswith("[message ") and '"account_id": "ACC-1017"' in body[2] and '"balance": 729' in body[2]
    # a log line in the middle of a tail
    s.chat("Which upstream timed out, build_77?", max_tokens=8)
    assert any("upstream build_77 timed out" in ln for ln in recalls(s)[-1]["content"].splitlines())
    assert [e.names for e in recalled_events(s)] == [["k8s/payments/deployment.yaml"], ["GATEWAY_RETRIES"],
                                                     ["ACC-1017"], ["build_77"]]
    s.close()


def test_nothing_is_recalled_for_a_name_the_live_context_shows(tmp_path):
    _, s, _ = offloaded_session(tmp_path)
    s.add([{"role": "user", "content": "Note for later: build_77 is the flaky upstream."},
           {"role": "assistant", "content": "Noted: build_77 is flaky."}])
    # the user's message named what only the offloaded history held: recalled before it, once
    assert len(recalled_events(s)) == 1 and len(recalls(s)) == 1
    s.chat("Did build_77 time out again?", max_tokens=8)   # offloaded too, but visible above
    assert len(recalled_events(s)) == 1 and len(recalls(s)) == 1
    # the tool schemas are part of the live context: naming a tool recalls nothing
    s.chat("Use read_file and tail_log as before.", max_tokens=8)
    assert len(recalled_events(s)) == 1
    # once recalled, a name is visible: asking again recalls nothing more
    s.chat(QUESTION, max_tokens=8)
    s.chat("And max_pool_size again, to be sure?", max_tokens=8)
    assert len(recalled_events(s)) == 2 and len(recalls(s)) == 2
    s.close()


def test_nothing_offloaded_means_no_scan_and_no_event(tmp_path, monkeypatch):
    _, s, _ = make(tmp_path)
    agent_history(s)
    assert not s.offloaded

    def boom(*a, **k):
        raise AssertionError("scanned with nothing offloaded")
    monkeypatch.setattr(recall, "names_in", boom)
    monkeypatch.setattr(recall, "text_of", boom)
    s.chat(QUESTION, max_tokens=8)
    assert not recalled_events(s) and not recalls(s)
    s.close()


def test_common_words_and_names_the_history_never_held_recall_nothing(tmp_path):
    _, s, _ = offloaded_session(tmp_path)
    s.chat("Please continue the review and check the configuration and the pool size again.", max_tokens=8)
    s.chat("Summarize what failed, what passed, and the total so far.", max_tokens=8)
    s.chat("Is zeta_queue_depth set anywhere in services/billing/config.toml?", max_tokens=8)
    assert not recalled_events(s) and not recalls(s)
    s.close()


@pytest.mark.parametrize("budget", [128, 200])
def test_the_budget_is_respected(tmp_path, budget):
    eng, s, _ = offloaded_session(tmp_path, recall_tokens=budget)
    assert s.recall_tokens == budget
    before = len(s.sequence.tokens)
    # every account line holds "EUR" and "active": many lines match, only the budget's worth is shown
    s.add({"role": "user", "content": "List ACC-1003 ACC-1005 ACC-1006 ACC-1007 ACC-1009 ACC-1010 ACC-1011"})
    m = recalls(s)[-1]
    tokens = len(eng.tokenize(m["content"], add_special=False))
    assert tokens <= budget and recalled_events(s)[-1].tokens == tokens
    # the user message, the search_history call and the turn markers besides
    assert len(s.sequence.tokens) - before <= budget + 120
    assert "more matching lines not shown: search_history finds them)" in m["content"]
    head = m["content"].splitlines()[0]
    assert head.startswith(HEADER_START + "ACC-1003")
    assert ("more):" in head) == (budget == 128)   # a small budget names the first ones, counts the rest
    s.close()


def test_default_budget_and_zero_turns_it_off(tmp_path):
    assert recall.default_budget(2048) == 170 and recall.default_budget(1024) == 85
    assert recall.default_budget(8192) == 256 and recall.default_budget(256) == recall.MIN_TOKENS
    _, s, _ = offloaded_session(tmp_path / "a")
    assert s.recall_tokens == 256
    s.close()
    _, s, _ = offloaded_session(tmp_path / "b", recall_tokens=0)
    s.chat(QUESTION, max_tokens=8)
    assert not recalls(s) and not recalled_events(s)
    s.close()
    for bad in (-1, 1.5, True, "64"):
        with pytest.raises(ValueError, match="recall_tokens"):
            make(tmp_path / "c", recall_tokens=bad)


def test_a_tool_call_naming_an_offloaded_thing_recalls_after_its_result(tmp_path):
    """The agent's own call (replayed with add, or generated) names an id: the recall follows the call's
    results, never between the call and them."""
    _, s, rec = offloaded_session(tmp_path)
    s.add([{"role": "assistant", "content": None, "tool_calls": [call("c9", "get_account", account_id="ACC-1021")]}])
    assert not recalls(s)   # the call waits for its result: no recall in between
    s.add({"role": "tool", "tool_call_id": "c9", "name": "get_account", "content": '{"error": "timeout"}'})
    msgs = s.messages
    assert msgs[-1].get("recall") and msgs[-2].get("recall") and msgs[-3]["tool_call_id"] == "c9"
    assert '"account_id": "ACC-1021"' in msgs[-1]["content"]

    # a call the model generates for the caller: recalled when the caller brings its result
    def responder(prompt):
        rec.prompts.append(prompt)
        tail = prompt.rsplit("<|im_start|>user\n", 1)[-1]
        if "open the old auth log" in tail and "<|im_start|>tool" not in tail:
            return '<tool_call>\n{"name": "tail_log", "arguments": {"service": "req-8817"}}\n</tool_call>'
        return default_responder(prompt)
    s.engine.responder = responder
    r = s.chat("Now open the old auth log for that request.", max_tokens=40)
    assert r["choices"][0]["finish_reason"] == "tool_calls" and len(recalls(s)) == 1
    cid = r["choices"][0]["message"]["tool_calls"][0]["id"]
    s.chat({"role": "tool", "tool_call_id": cid, "name": "tail_log", "content": "log rotated, nothing kept"},
           max_tokens=8)
    last = recalls(s)[-1]
    assert "req-8817" in last["content"] and "build_77 timed out" in last["content"]
    assert s.messages[-4]["tool_call_id"] == cid and s.messages[-3].get("recall") and s.messages[-2] is not None
    assert "build_77 timed out" in rec.prompts[-1]
    s.close()


def test_a_repeated_call_does_not_recall_its_own_earlier_output(tmp_path):
    """The agent reads the same file again: its earlier call and output are superseded by the new result,
    not recalled; after a different call naming the same path, a question about it still recalls them.
    (Mode "none": its drops
    leave no summary that would show the path.)"""
    _, s, _ = make(tmp_path, mode="none", window=2048)
    s.add([{"role": "user", "content": "Check the deploy env."},
           {"role": "assistant", "content": None, "tool_calls": [call("d1", "read_file", path="deploy/build_91.env")]},
           {"role": "tool", "tool_call_id": "d1", "name": "read_file", "content": "REGION=eu-west-1\nTOKEN_TTL=900"}])
    while not s.offloaded:
        filler(s, 1)
    assert "deploy/build_91.env" not in s.render()
    s.add([{"role": "assistant", "content": None, "tool_calls": [call("d2", "read_file", path="deploy/build_91.env")]},
           {"role": "tool", "tool_call_id": "d2", "name": "read_file", "content": "REGION=eu-west-1\nTOKEN_TTL=600"}])
    assert not recalls(s) and not recalled_events(s)
    s.add([{"role": "user", "content": "What is TOKEN_TTL now?"}])   # visible in the new result: nothing
    assert not recalls(s)
    s.close()
    # the same history with a different call naming the path: its earlier read is a source
    _, s, _ = make(tmp_path / "b", mode="none", window=2048)
    s.add([{"role": "user", "content": "Check the deploy env."},
           {"role": "assistant", "content": None, "tool_calls": [call("d1", "read_file", path="deploy/build_91.env")]},
           {"role": "tool", "tool_call_id": "d1", "name": "read_file", "content": "REGION=eu-west-1\nTOKEN_TTL=900"}])
    while not s.offloaded:
        filler(s, 1)
    s.add([{"role": "assistant", "content": None,
            "tool_calls": [call("d3", "tail_log", service="deploy/build_91.env")]},
           {"role": "tool", "tool_call_id": "d3", "name": "tail_log", "content": "no log for a file"}])
    # the new call's own result is as much about the path as the earlier read's lines: nothing yet
    assert not recalled_events(s)
    s.add([{"role": "user", "content": "What did deploy/build_91.env set TOKEN_TTL to?"}])
    assert [e.names for e in recalled_events(s)] == [["TOKEN_TTL", "deploy/build_91.env"]]
    # the earlier read's output line (its call names the path), never the agent's call line itself
    assert "TOKEN_TTL=900" in recalls(s)[-1]["content"].splitlines()
    assert "read_file(" not in recalls(s)[-1]["content"]
    s.close()


def test_recall_survives_save_load_and_the_log(tmp_path):
    eng, s, _ = offloaded_session(tmp_path)
    s.chat(QUESTION, max_tokens=8)
    live, transcript = s.messages, s.transcript
    snap = tmp_path / "snap.bin"
    s.save(snap)
    log = s.log_path
    s.close()
    for source in (snap, log):   # the snapshot, and the log alone (after a crash)
        s2 = pk.Session.load(FakeEngine(n_ctx=16384), source)
        assert s2.messages == live and s2.transcript == transcript
        assert recalls(s2) and recalls(s2)[0]["recall"] is True and "max_pool_size = 47" in recalls(s2)[0]["content"]
        assert "max_pool_size = 47" in s2.render()
        if source == log:   # the loaded session goes on (its names are visible now: nothing more recalled)
            s2.chat("And the max_pool_size, once more?", max_tokens=8)
            assert not recalled_events(s2)
            s2.chat("And build_77?", max_tokens=8)
            assert [e.names for e in recalled_events(s2)] == [["build_77"]]
        s2.close()
    # every log line is JSON and the recall record carries its flag
    recs = [json.loads(x) for x in open(log).read().splitlines()]
    assert any(r.get("op") == "msg" and r["msg"].get("recall") for r in recs)


def test_a_later_summary_does_not_take_the_recall_for_the_users_words(tmp_path):
    _, s, _ = offloaded_session(tmp_path)
    s.chat(QUESTION, max_tokens=8)
    filler(s, 6)
    s.compact()
    assert all(not m.get("recall") for m in s.messages), "the recall should have been compacted"
    summary = next(m for m in s.messages if m.get("summary"))["content"]
    assert HEADER_START not in summary and "Recalled from the offloaded history" not in summary
    users = summary.split("User messages, verbatim", 1)[-1].split("\n\n", 1)[0] if "User messages, verbatim" \
        in summary else ""
    assert "Recalled" not in users
    # the recall is offloaded with the rest, but a later search finds the original lines, not the echo
    assert any(m.get("recall") for m in s.offloaded)
    out = s.search_history("max_pool_size")
    heads = [ln for ln in out.splitlines() if ln.startswith("[message")]
    rec_idx = next(i for i, m in enumerate(s.transcript) if m.get("recall"))
    assert heads and all(f"[message {rec_idx}," not in h for h in heads)
    s.close()


def test_a_caller_message_shape_that_is_odd_does_not_crash(tmp_path):
    _, s, _ = offloaded_session(tmp_path)
    s.chat([{"role": "user", "content": [{"type": "text", "text": "About "}, {"type": "text", "text": QUESTION}]}],
           max_tokens=8)
    assert len(recalls(s)) == 1
    huge = ("2024-05-08T10:17:11Z INFO noise line without names\n" * 4000) + "\nso what was max_pool_size?"
    with pytest.raises(ContextWindowError):
        s.chat(huge, max_tokens=8)   # refused as any message over the window is: the recall adds no error
    s.add([{"role": "user", "content": "check"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "b1", "type": "function", "function": {"name": "tail_log", "arguments": "{not json ACC-1019"}}]},
           {"role": "tool", "tool_call_id": "b1", "name": "tail_log", "content": "bad arguments"}])
    assert "ACC-1019" in recalls(s)[-1]["content"]
    s.close()


def test_a_template_that_refuses_the_message_means_no_recall(tmp_path, monkeypatch):
    _, s, _ = offloaded_session(tmp_path)
    real = s._ctx.render

    def render(views=None, add_generation_prompt=False):
        if views and any(v.get("recall") for v in views):
            raise RuntimeError("this template wants a tool call before a tool message")
        return real(views, add_generation_prompt)
    monkeypatch.setattr(s._ctx, "render", render)
    r = s.chat(QUESTION, max_tokens=8)
    assert r["choices"][0]["message"]["content"] and not recalls(s) and not recalled_events(s)
    s.close()


# ---------------------------------------------------------------------------- a real template and tokenizer
def test_on_smollm2_the_recall_renders_and_fits_its_budget(smollm_engine, tmp_path):
    """SmolLM2's own template and tokenizer; mode "none" (its drops offload without asking the model) keeps
    this test cheap on a CPU.  On this history the model answers "The max_pool_size is 47." once the line is
    recalled."""
    s = pk.Session(smollm_engine, system="You are a careful ops agent. Answer in one short sentence.",
                   history_dir=tmp_path, tools=TOOLS[:1],
                   policy=pk.Policy(mode="none", window=1024, compact_tool=False, probe_every=10_000))
    assert s.recall_tokens == recall.default_budget(1024) == 85
    s.add([{"role": "user", "content": "Audit the auth service before the release."},
           {"role": "assistant", "content": None,
            "tool_calls": [call("c1", "read_file", path="services/auth/config.toml")]},
           {"role": "tool", "tool_call_id": "c1", "name": "read_file", "content": config_toml()},
           {"role": "assistant", "content": "Read it; moving on to the logs."}])
    for k in range(3):
        s.add([{"role": "user", "content": f"Look at the next page of logs ({k})."},
               {"role": "assistant", "content": None, "tool_calls": [call(f"t{k}", "read_file", path="auth.log")]},
               {"role": "tool", "tool_call_id": f"t{k}", "name": "read_file",
                "content": "\n".join(f"INFO auth request served in {40 + j} ms" for j in range(20))}])
    assert s.offloaded and "max_pool_size = 47" not in s.render()
    assert any(e.name == "dropped" for e in s.events)
    s.add({"role": "user", "content": QUESTION})
    rec = recalls(s)
    assert len(rec) == 1 and "max_pool_size = 47" in rec[0]["content"].splitlines()
    assert len(smollm_engine.tokenize(rec[0]["content"], add_special=False)) <= s.recall_tokens
    text = s.render(add_generation_prompt=True)
    assert text.index(QUESTION) > text.index("max_pool_size = 47")   # the question is read last
    assert text.rstrip().endswith("<|im_start|>assistant")   # the reply comes next
    assert len(s.tokens) <= s.window
    s.close()


def test_a_refused_message_leaves_no_recall_behind(tmp_path):
    """Review: the lookup was added before a user message too long for the window, which then raised."""
    _, s, _ = offloaded_session(tmp_path)
    before = (list(s.transcript), list(s.messages), s.tokens)
    huge = "What did build_77 say? " + "filler words here " * 3000
    with pytest.raises(ContextWindowError):
        s.chat(huge, max_tokens=8)
    assert not recalled_events(s) and not recalls(s)
    assert (list(s.transcript), list(s.messages), s.tokens) == before
    s.close()


def test_a_stream_closed_after_the_recall_event_keeps_the_question(tmp_path):
    """Review: closing the stream right after the Recalled event left the lookup without its question."""
    _, s, _ = offloaded_session(tmp_path)
    it = s.stream(QUESTION, max_tokens=8)
    first = next(it)
    it.close()
    if isinstance(first, ev.Recalled):
        k = next(i for i, m in enumerate(s.transcript) if m.get("recall") and m["role"] == "tool")
        assert s.transcript[k + 1] == {"role": "user", "content": QUESTION}
    s.close()


def test_a_batch_whose_later_messages_name_it_too_still_recalls(tmp_path):
    """Review: a user turn, then the scripted call naming the same thing (the eval's step shape)."""
    _, s, _ = offloaded_session(tmp_path)
    s.add([{"role": "user", "content": "What is max_pool_size in services/auth/config.toml now?"},
           {"role": "assistant", "content": None, "tool_calls": [{"id": "again1", "type": "function", "function": {
               "name": "read_file", "arguments": {"path": "services/auth/config.toml", "key": "max_pool_size"}}}]},
           {"role": "tool", "tool_call_id": "again1", "content": '{"error": "timeout"}'}])
    assert len(recalled_events(s)) == 1
    k = next(i for i, m in enumerate(s.messages) if m.get("recall") and m["role"] == "tool")
    assert "max_pool_size = 47" in s.messages[k]["content"]
    s.close()
