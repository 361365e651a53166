"""The model's notes (compaction/summary/notes.py): right after a tool result, on a fork in the background, the model
copies the lines of that output the task needs; a summary replacing the output keeps them first."""
from __future__ import annotations

import pykvcompact as pk
from pykvcompact.compaction.summary import notes as N
from pykvcompact.compaction.summary import results as R

from fake_engine import FakeEngine


def call(i, name, **args):
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": args}}]}


def out(i, text):
    return {"role": "tool", "tool_call_id": f"c{i}", "content": text}


def config(i):
    keys = [f"opt_{k} = {k * 7 + i}" for k in range(24)]
    keys.insert(1, f"max_pool_size = {40 + i}")   # second line: what the fake model notes
    return "\n".join(keys)


def test_choices_grammar_and_the_lines_kept():
    text = "a = 1\n\n  b = 2\na = 1\n" + "x" * 300 + "\nquote \"q\" \\ end"
    lines = N.choices(text)
    assert lines == ["a = 1", "b = 2", 'quote "q" \\ end']   # stripped, each once, no over-long line
    g = N.grammar(lines, 3)
    assert g.startswith('root ::= line ("\\n" line){0,2}') and '"quote \\"q\\" \\\\ end"' in g
    assert N.noted_lines("b = 2\nnot a line\nb = 2\n a = 1 ", lines) == ["b = 2", "a = 1"]
    assert N.noted_lines("", lines) == [] and N.noted_lines("zzz", lines) == []


def test_syntax_lines_are_not_offered_and_heads_name_one_line_each():
    text = "{\n  \"max_pool_size\": 40,\n  \"max_pool_size_eu\": 12,\n}\n```\n---\nretry limit is\nretry limit is 5 now"
    lines = N.choices(text)
    assert lines == ['"max_pool_size": 40,', '"max_pool_size_eu": 12,', "retry limit is", "retry limit is 5 now"]
    offered = N.heads(lines)
    # the shortest whole-word prefix (12 characters or more) no other line starts with
    assert offered == {'"max_pool_size":': '"max_pool_size": 40,', '"max_pool_size_eu":': '"max_pool_size_eu": 12,',
                       "retry limit is": "retry limit is", "retry limit is 5": "retry limit is 5 now"}
    assert N.noted_lines('"max_pool_size_eu":\nretry limit is 5\nretry limit is', offered) == [
        '"max_pool_size_eu": 12,', "retry limit is 5 now", "retry limit is"]
    assert N.noted_lines("retry limit", offered) == []   # not a head: nothing


def session(tmp_path, mode="background", *, bg_polls=0, window=1600, **pol):
    eng = FakeEngine(n_ctx=8192, bg_polls=bg_polls)
    return eng, pk.Session(eng, system="You are an agent.", history_dir=tmp_path, session_id=mode,
                           policy=pk.Policy(mode=mode, window=window, compact_tool=False, history_tool=False,
                                            summary_max_tokens=160, **pol))


def read_and_comment(s, n):
    """``n`` config reads, each followed by the agent's comment and a user turn."""
    s.chat("Audit the pool sizes.", max_tokens=8)
    for i in range(n):
        s.add([call(i, "read_file", path=f"services/s{i}/config.toml"), out(i, config(i)),
               {"role": "assistant", "content": f"Read the config of s{i}."}])
        s.chat(f"go on {i}", max_tokens=8)


def test_a_note_per_tool_result_in_background_mode_and_its_lines_outlive_the_output(tmp_path):
    eng, s = session(tmp_path)
    s.chat("Audit the pool sizes of every service.", max_tokens=8)
    for i in range(12):
        s.add([call(i, "read_file", path=f"services/s{i}/config.toml"), out(i, config(i))])
    noted = [e for e in s.events if e.name == "noted"]
    assert len(noted) >= 10 and all(e.lines and e.lines[0].startswith("max_pool_size = ") for e in noted)
    assert all(e.prompt_tokens > 0 and e.tokens > 0 for e in noted)
    assert sum(e.name == "rebased" for e in s.events) >= 2
    text = "\n".join(m["content"] for m in s.messages if m.get("summary"))
    gone = [i for i in range(12) if not any(f"max_pool_size = {40 + i}" in (m.get("content") or "")
                                            for m in s.messages if not m.get("summary"))]
    assert gone
    import re
    left_out = sum(int(x) for x in re.findall(r"\((\d+) earlier lines left out for space", text.split("\n\n")[-1]))
    missing = [i for i in gone if f"{R.NOTED} read_file(path=services/s{i}/config.toml): max_pool_size = {40 + i}"
               not in text]
    assert len(missing) <= left_out and max(gone) not in missing, text   # only the oldest, for space
    s.close()
    assert s._maker.notes._writing is None


def test_no_notes_in_synchronous_modes_or_when_turned_off(tmp_path):
    for mode, pol in (("hard", {}), ("background", {"notes": False})):
        _, s = session(tmp_path / mode, mode, **pol)
        s.chat("Audit.", max_tokens=8)
        for i in range(3):
            s.add([call(i, "read_file", path=f"s{i}.toml"), out(i, config(i))])
        assert not any(e.name in ("noted", "note_skipped") for e in s.events), mode
        s.close()


def test_a_note_that_copies_nothing_of_the_output_is_not_kept(tmp_path):
    eng, s = session(tmp_path)
    eng.responder = lambda prompt: "The pool size is probably 99."   # not a line of the output
    s.chat("Audit.", max_tokens=8)
    s.add([call(0, "read_file", path="a.toml"), out(0, config(0))])
    s.chat("next", max_tokens=8)
    assert [e.reason for e in s.events if e.name == "note_skipped"] == ["empty"]
    assert not s._maker.notes.notes
    s.close()


def test_short_outputs_and_recall_messages_get_no_note(tmp_path):
    _, s = session(tmp_path)
    s.chat("Audit.", max_tokens=8)
    s.add([call(0, "check"), out(0, "ok\nall good")])
    s.chat("next", max_tokens=8)
    assert not any(e.name in ("noted", "note_skipped") for e in s.events)
    s.close()


def test_notes_policy_validation():
    import pytest
    with pytest.raises(ValueError, match="notes"):
        pk.Policy(notes="yes")
    assert pk.Policy().takes_notes and not pk.Policy(mode="hard").takes_notes
    assert not pk.Policy(notes=False).takes_notes


def test_a_slow_note_does_not_hold_the_old_sequence_through_a_swap(tmp_path):
    """Review: a note still being written when a swap came kept its fork of the old sequence, whose cells the
    rebased context then lacked (ContextFullError on a pool sized for the session)."""
    eng = FakeEngine(n_ctx=3100, bg_polls=12)   # background jobs need 12 polls: notes overlap the swaps
    s = pk.Session(eng, system="You are an agent.", history_dir=tmp_path, session_id="slow",
                   policy=pk.Policy(mode="background", window=1600, compact_tool=False, history_tool=False,
                                    summary_max_tokens=160))
    s.chat("Audit the pool sizes.", max_tokens=8)
    for i in range(16):
        s.add([call(i, "read_file", path=f"services/s{i}/config.toml"), out(i, config(i))])
        if i % 2:
            s.chat(f"next {i}", max_tokens=8)
    assert sum(e.name == "rebased" for e in s.events) >= 2
    s.close()


def test_a_splice_swap_ends_the_note_being_written_first(tmp_path, monkeypatch):
    """A note's fork shares the cells a splice moves, and the engine refuses to move them: the swap then
    prefilled a fresh sequence (12 s, Qwen2.5-Coder-1.5B).  The note is ended before a splice commit."""
    eng = FakeEngine(n_ctx=8192, bg_polls=12)   # notes take 12 polls: they overlap the swaps
    s = pk.Session(eng, system="You are an agent.", history_dir=tmp_path, session_id="splice",
                   policy=pk.Policy(mode="background", window=1600, compact_tool=False, history_tool=False,
                                    summary_max_tokens=160, rebase="splice"))
    seen = []
    orig = type(s._ctx.seq).commit_rebase

    def commit(seq, rb):
        if rb.mode == "splice":
            seen.append(s._compactor.maker.notes.writing)
        return orig(seq, rb)

    monkeypatch.setattr(type(s._ctx.seq), "commit_rebase", commit)
    s.chat("Audit the pool sizes.", max_tokens=8)
    for i in range(16):
        s.add([call(i, "read_file", path=f"services/s{i}/config.toml"), out(i, config(i))])
        if i % 2:
            s.chat(f"next {i}", max_tokens=8)
    assert seen and not any(seen), seen
    assert any(e.name == "note_skipped" and e.reason == "splice" for e in s.events)
    s.close()


def test_notes_survive_save_and_load(tmp_path):
    eng, s = session(tmp_path)
    s.chat("Audit the pool sizes.", max_tokens=8)
    for i in range(3):
        s.add([call(i, "read_file", path=f"services/s{i}/config.toml"), out(i, config(i))])
    s.chat("next", max_tokens=8)
    before = dict(s._maker.notes.notes)
    assert before
    path = tmp_path / "snap.pkv"
    s.save(path)
    s.close()
    s2 = pk.Session.load(FakeEngine(n_ctx=8192), path)
    assert s2._maker.notes.notes == before
    s2.close()
    s3 = pk.Session.load(FakeEngine(n_ctx=8192), s.log_path)   # from the log alone
    assert s3._maker.notes.notes == before
    s3.close()


def test_control_characters_and_unencodable_lines_keep_the_grammar_valid():
    lines = N.choices("a\x00b = 1\nc\x1b[0m = 2\n\ud800 lone\nplain = 3")
    assert lines == ["a\x00b = 1", "c\x1b[0m = 2", "plain = 3"]
    g = N.grammar(lines)
    assert "\x00" not in g and "\x1b" not in g and "\\x00" in g and "\\x1B" in g


def test_a_backend_without_grammars_turns_notes_off_once(tmp_path):
    from pykvcompact.errors import UnsupportedOperationError
    eng, s = session(tmp_path)
    real = type(s._ctx.seq).generate_background

    def no_grammar(self, max_tokens, **kw):
        if kw.get("grammar"):
            raise UnsupportedOperationError("this server takes no grammar")
        return real(self, max_tokens, **kw)
    type(s._ctx.seq).generate_background = no_grammar
    try:
        s.chat("Audit.", max_tokens=8)
        for i in range(3):
            s.add([call(i, "read_file", path=f"s{i}.toml"), out(i, config(i))])
        skipped = [e.reason for e in s.events if e.name == "note_skipped"]
        assert len(skipped) == 1 and skipped[0].startswith("unsupported") and not s._maker.notes.enabled
    finally:
        type(s._ctx.seq).generate_background = real
        s.close()


def test_notes_true_needs_background_mode():
    import pytest
    with pytest.raises(ValueError, match="background"):
        pk.Policy(mode="hard", notes=True)
    assert pk.Policy(mode="background", notes=True).takes_notes


def test_the_request_quotes_the_task(tmp_path):
    assert N.note_request("") == N.NOTE_REQUEST
    req = N.note_request('Audit the "pools"   of\nevery service.')
    assert req.startswith("The task: \"Audit the 'pools' of every service.\"\n") and "Copy them exactly" in req
    long = N.note_request("start " + "x " * 400 + "end")
    assert " … " in long and "start" in long and "end" in long and len(long) < N.TASK_CHARS + 200
    seen = []
    eng, s = session(tmp_path)
    real = eng.responder
    eng.responder = lambda prompt: (seen.append(prompt), real(prompt))[1]
    s.chat("Audit the pool sizes of every service.", max_tokens=8)
    s.add([call(0, "read_file", path="a.toml"), out(0, config(0))])
    s.chat("next", max_tokens=8)
    assert any("The task: \"Audit the pool sizes of every service.\"" in p for p in seen)
    s.close()


def test_a_model_measured_to_note_nothing_useful_takes_no_notes_unless_asked(tmp_path):
    eng = FakeEngine(n_ctx=8192)
    eng.model_name, eng.model_path = "smollm2-135m", "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    for notes, expect in ((None, False), (True, True)):
        s = pk.Session(eng, system="You are an agent.", history_dir=tmp_path / str(notes), session_id="m",
                       policy=pk.Policy(mode="background", window=1600, compact_tool=False, history_tool=False,
                                        notes=notes))
        assert s._maker.notes.enabled is expect
        s.close()


def _notes_of(s):
    """transcript index of each noted output -> its note's lines; and the skip reasons."""
    noted = {e.message: e.lines for e in s.events if e.name == "noted"}
    skipped = [e.reason for e in s.events if e.name == "note_skipped"]
    return noted, skipped


def test_an_output_followed_by_other_messages_is_still_noted_from_a_fork_cut_after_it(tmp_path):
    """The agent commented on each output (an assistant message right after it) while an earlier note was
    still being written: each output is noted on a fork cut right after it, so the note is of that output."""
    _, s = session(tmp_path, bg_polls=3, window=4000)
    read_and_comment(s, 6)
    noted, skipped = _notes_of(s)
    outputs = [k for k, m in enumerate(s.transcript) if m.get("role") == "tool"]
    for k in noted:   # each note copies its own output's line, never a later one's
        i = outputs.index(k)
        assert noted[k] == [f"max_pool_size = {40 + i}"], (k, noted[k])
    taker = s._maker.notes
    pending = len(taker._waiting) + taker.writing
    assert len(noted) + skipped.count("superseded") + pending == len(outputs), (noted, skipped, pending)
    assert len(noted) >= 4 and "moved_on" not in skipped
    s.close()


def test_without_prefix_forks_an_output_no_longer_newest_is_skipped_by_name(tmp_path):
    eng, s = session(tmp_path, bg_polls=6, window=4000)   # a note outlasts the next step: its output moved on
    eng.can_fork_prefix = False   # a recurrent model
    read_and_comment(s, 4)
    noted, skipped = _notes_of(s)
    assert "moved_on" in skipped and s.chat("still fine?", max_tokens=8)["choices"]
    assert all(len(v) == 1 and v[0].startswith("max_pool_size") for v in noted.values())
    s.close()


def test_every_output_is_accounted_for_when_a_swap_cancels_the_note_being_written(tmp_path):
    """Review: a swap that cancelled the running note (no_room) also dropped the outputs waiting behind it,
    with no event."""
    eng = FakeEngine(n_ctx=3100, bg_polls=12)
    s = pk.Session(eng, system="You are an agent.", history_dir=tmp_path, session_id="slow",
                   policy=pk.Policy(mode="background", window=1600, compact_tool=False, history_tool=False,
                                    summary_max_tokens=160))
    s.chat("Audit the pool sizes.", max_tokens=8)
    for i in range(16):
        s.add([call(i, "read_file", path=f"services/s{i}/config.toml"), out(i, config(i)),
               {"role": "assistant", "content": f"Read s{i}."}])
        if i % 2:
            s.chat(f"next {i}", max_tokens=8)
    noted, skipped = _notes_of(s)
    outputs = [k for k, m in enumerate(s.transcript) if m.get("role") == "tool"]
    taker = s._maker.notes
    pending = len(taker._waiting) + taker.writing
    assert len(noted) + len(skipped) + pending == len(outputs), (noted, skipped, pending)
    s.close()


def test_heads_of_aligned_columns_and_whole_lines_map_back_to_their_line():
    out = ("NAME                      READY   STATUS             RESTARTS   AGE\n"
           "db-0                      0/1     CrashLoopBackOff   42         3d\n"
           "db-1                      1/1     Running            0          3d")
    offered = N.heads(N.choices(out))
    assert all(not h.endswith(" ") for h in offered)   # (the model's lines are read stripped)
    db0 = next(h for h, line in offered.items() if line.startswith("db-0"))
    assert N.noted_lines(db0 + "   \n", offered) == [offered[db0]]
    whole = offered[db0]   # a backend that ignores the grammar copies the whole line
    assert N.noted_lines(whole, offered) == [whole]
