import os

import pytest

from pykvcompact.session.history_file import HistoryFile, check_session_id


def test_append_is_verbatim_and_ordered(tmp_path):
    h = HistoryFile(tmp_path / "hist", "s1")
    msgs = [{"role": "user", "content": "line 1\n```code```\n### not a header"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c9", "name": "f", "content": "ünïcode ✓"}]
    h.append(msgs[:2], indices=[1, 2], reason="compaction (hard)")
    h.append(msgs[2:], indices=[3], summaries=[7])
    text = h.read()
    assert text.startswith("# Conversation history — session s1")
    assert text.index(msgs[0]["content"]) < text.index("c9") < text.index("ünïcode ✓")
    assert "\"arguments\": \"{\\\"a\\\": 1}\"" in text
    assert "summary [7]" in text and text.count("## Offload") == 2
    assert h.path == tmp_path / "hist" / "s1.md"


def test_append_fsyncs_before_returning(tmp_path, monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    h = HistoryFile(tmp_path, "s2")
    h.append([{"role": "user", "content": "x"}])
    assert calls  # the file (and the new directory entry) were synced


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".", "..", "x" * 200, "a b"])
def test_bad_session_ids(bad):
    with pytest.raises(ValueError):
        check_session_id(bad)
