"""Session persistence on the fake engine: the write-ahead log, resuming from it or from a snapshot, bad
files.  (The KV state round trip and the kill test use real engines: test_session_resume.py.)"""
from __future__ import annotations

import json

import pytest

import pykvcompact as pk
from pykvcompact import errors

from fake_engine import FakeEngine
from test_session_logic import check_invariants, make, user_msg


def same_state(a, b):
    assert b.transcript == a.transcript
    assert b.messages == a.messages
    assert b.offloaded == a.offloaded
    assert b._transcript.pinned == a._transcript.pinned
    assert b.tokens == a.tokens
    check_invariants(b)


@pytest.mark.parametrize("mode", ["hard", "background", "none"])
def test_a_session_resumes_from_its_log_alone(mode, tmp_path):
    eng, s = make(mode, tmp_path=tmp_path, keep_user_tokens=64)
    s.chat("Standing rule: never modify billing.py. " + user_msg(0), max_tokens=16)
    for i in range(1, 14):
        s.chat(user_msg(i), max_tokens=16)
    s.pin(3)
    assert any(e.name in ("rebased", "dropped") for e in s.events)
    s2 = pk.Session.load(eng, s.log_path)
    assert s2.resumed["kv"] is False and "log" in s2.resumed["reason"]
    same_state(s, s2)
    # the resumed session keeps working and keeps carrying the user's first message through compactions
    for i in range(14, 30):
        s2.chat(user_msg(i), max_tokens=16)
        check_invariants(s2)
    if mode != "none":
        assert "never modify billing.py" in s2.render()
    s.close()
    s2.close()


def test_a_snapshot_without_kv_state_resumes_by_prefilling(tmp_path):
    eng, s = make("hard", tmp_path=tmp_path)
    for i in range(10):
        s.chat(user_msg(i), max_tokens=16)
    snap = tmp_path / "s.pkv"
    s.save(snap)
    s2 = pk.Session.load(eng, snap)
    assert s2.resumed["kv"] is False and "KV" in s2.resumed["reason"]
    same_state(s, s2)
    s.close()
    s2.close()


def test_records_after_the_snapshot_are_replayed(tmp_path):
    eng, s = make("hard", tmp_path=tmp_path)
    s.chat(user_msg(0), max_tokens=16)
    snap = tmp_path / "s.pkv"
    s.save(snap)
    for i in range(1, 12):  # compactions after the snapshot
        s.chat(user_msg(i), max_tokens=16)
    s2 = pk.Session.load(eng, snap)
    assert "after the snapshot" in s2.resumed["reason"]
    same_state(s, s2)
    s.close()
    s2.close()


def test_a_line_cut_short_by_a_crash_is_ignored(tmp_path):
    eng, s = make("hard", tmp_path=tmp_path)
    for i in range(3):
        s.chat(user_msg(i), max_tokens=16)
    with open(s.log_path, "ab") as f:
        f.write(b'{"op":"msg","i":99,"msg":{"role":"user","con')  # killed mid-write
    s2 = pk.Session.load(eng, s.log_path)
    same_state(s, s2)
    assert len(s2.transcript) == len(s.transcript) == 7  # system + 3 exchanges; the torn line is not one
    s.close()
    s2.close()


def test_a_new_session_with_the_same_id_starts_a_new_log_section(tmp_path):
    eng, s = make("hard", tmp_path=tmp_path)
    s.chat(user_msg(0), max_tokens=16)
    s.close()
    _, s2 = make("hard", tmp_path=tmp_path)  # same session_id
    s2.chat("fresh start", max_tokens=8)
    s3 = pk.Session.load(FakeEngine(), s2.log_path)
    assert [m["content"] for m in s3.transcript if m["role"] == "user"] == ["fresh start"]
    s2.close()
    s3.close()


def test_bad_files_raise_a_clear_error(tmp_path):
    eng = FakeEngine()
    for name, data in [("x.jsonl", b"not json\n"), ("y.jsonl", b'{"op":"msg","i":0,"msg":{}}\n'),
                       ("z.pkv", b"garbage"), ("w.pkv", b"PKVSESS1" + (10 ** 6).to_bytes(8, "little") + b"{}")]:
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(errors.InvalidStateError) as ei:
            pk.Session.load(eng, p)
        assert str(p) in str(ei.value)
    with pytest.raises(errors.InvalidStateError):
        pk.Session.load(eng, tmp_path / "missing.jsonl")
    assert eng.used_cells() == 0


def test_an_edited_log_is_refused_not_half_loaded(tmp_path):
    eng, s = make("hard", tmp_path=tmp_path)
    for i in range(3):
        s.chat(user_msg(i), max_tokens=16)
    lines = open(s.log_path, encoding="utf-8").read().splitlines()
    rec = json.loads(lines[2])
    rec["i"] = 7
    lines[2] = json.dumps(rec)
    bad = tmp_path / "bad.log.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    used = eng.used_cells()
    with pytest.raises(errors.InvalidStateError):
        pk.Session.load(eng, bad)
    assert eng.used_cells() == used
    s.close()


def test_a_path_the_file_system_cannot_name_is_a_clear_error(tmp_path):
    # hypothesis (tests/test_fuzz_session.py) found save() raising UnicodeEncodeError from deep inside
    _, s = make("hard", window=600, tmp_path=tmp_path)
    s.add(user_msg("hello there"))
    with pytest.raises(ValueError, match="cannot be encoded"):
        s.save(tmp_path / "\ud800")
    s.save(tmp_path / "ok.snap")   # the session is untouched and saves as usual
    s.close()
