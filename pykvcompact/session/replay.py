"""Reading a session log back (:func:`replay`): the session its last ``open`` record and the records after
it describe (:class:`Replayed`), checked record by record, so that a log that was edited or is not a
session log is refused (``InvalidStateError``) instead of loaded half-way.

Apart from the writer (``journal.py``) because loading needs only this side: ``persist.read_session``
reads the log, then hands the result to a new writer (``Journal.resume``) to continue it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import zlib
from typing import Dict, List, Optional, Tuple

from ..errors import InvalidStateError

FORMAT = 1   # the log format this version writes (journal.py) and reads


@dataclasses.dataclass
class Replayed:
    """The session a log describes (as of its last complete record)."""
    session_id: str
    history_dir: str
    policy: dict
    tools: list
    cur_tools: Optional[list]
    transcript: List[dict] = dataclasses.field(default_factory=list)
    live: List[Tuple[int, Optional[dict]]] = dataclasses.field(default_factory=list)  # (index, view)
    offloaded: List[int] = dataclasses.field(default_factory=list)
    removed_summaries: List[int] = dataclasses.field(default_factory=list)
    pinned: List[int] = dataclasses.field(default_factory=list)
    metas: Dict[int, dict] = dataclasses.field(default_factory=dict)
    notes: Dict[int, List[str]] = dataclasses.field(default_factory=dict)   # the model's notes (notes.py)
    records: int = 0
    start: int = 0                                 # byte offset of the session's 'open' record
    end: int = 0                                   # byte offset where its last complete record ends
    crc: int = 0                                   # CRC-32 of the bytes in between
    file: Optional[Tuple[int, int]] = None         # (st_dev, st_ino) of the log read


def _read(path) -> Tuple[bytes, Tuple[int, int]]:
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            return f.read(), (st.st_dev, st.st_ino)
    except OSError as e:
        raise InvalidStateError(f"cannot read the session log {str(path)!r}: {e.strerror or e}") from None


def replay(path) -> Replayed:
    """Read a log back.  Raises ``InvalidStateError`` when it is not a session log."""
    raw, file = _read(path)
    end = raw.rfind(b"\n") + 1  # what follows was cut short by a crash: never acknowledged
    recs, offsets, pos = [], [], 0
    for k, ln in enumerate(raw[:end].split(b"\n")[:-1]):
        pos += len(ln) + 1
        if not ln.strip():
            continue
        try:
            recs.append(json.loads(ln))
        except ValueError:
            raise InvalidStateError(f"{str(path)!r} line {k + 1} is not JSON: not a pykvcompact session log, "
                                    "or it was edited") from None
        offsets.append(pos - len(ln) - 1)
    start = max((k for k, r in enumerate(recs) if isinstance(r, dict) and r.get("op") == "open"), default=None)
    if start is None:
        raise InvalidStateError(f"{str(path)!r} holds no session (no 'open' record): not a pykvcompact session log")
    o = recs[start]
    if o.get("format") != FORMAT:
        raise InvalidStateError(f"{str(path)!r} has log format {o.get('format')!r}; this version reads {FORMAT}")
    try:
        if not (isinstance(o["session_id"], str) and isinstance(o["history_dir"], str)
                and isinstance(o["policy"], dict) and isinstance(o.get("tools") or [], list)
                and isinstance(o.get("cur_tools") or [], list)):
            raise TypeError("its 'open' record has fields of the wrong types")
        r = Replayed(o["session_id"], o["history_dir"], o["policy"], o.get("tools") or [], o.get("cur_tools"))
        for rec in recs[start:]:
            _apply(r, rec)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise InvalidStateError(f"{str(path)!r} has an inconsistent record ({e!r}): it was edited or is "
                                "not a pykvcompact session log") from None
    r.records, r.start, r.end, r.file = len(recs) - start, offsets[start], end, file
    r.crc = zlib.crc32(raw[r.start:end])
    return r


def _check_msg(msg) -> None:
    """A logged message (or view) has the shape the session gives its messages."""
    from ..chat.messages import check_json, normalize_messages
    if not isinstance(msg, dict):
        raise TypeError(f"a logged message must be an object, got {type(msg).__name__}")
    check_json(msg, "a logged message")
    normalize_messages([{k: v for k, v in msg.items() if k not in ("summary", "pinned", "partial")}])


def _index(r: Replayed, i) -> int:
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(r.transcript):
        raise IndexError(f"message index {i!r} is not in the transcript")
    return i


def _apply(r: Replayed, rec: dict) -> None:
    op = rec["op"]
    if op == "msg":
        if rec["i"] != len(r.transcript):
            raise ValueError(f"message index {rec['i']} where {len(r.transcript)} was expected")
        _check_msg(rec["msg"])
        if rec.get("view") is not None:
            _check_msg(rec["view"])
        if not isinstance(rec.get("live", True), bool):
            raise TypeError("a message record's 'live' must be true or false")
        r.transcript.append(rec["msg"])
        if rec.get("live", True):
            r.live.append((rec["i"], rec.get("view")))
    elif op == "swap":
        removed = {_index(r, i) for i in rec["removed"]}
        if rec.get("summary") is not None and not r.transcript[_index(r, rec["summary"])].get("summary"):
            raise ValueError(f"swap to message {rec['summary']}, which is not a summary")
        if rec.get("meta") is not None and not isinstance(rec["meta"], dict):
            raise TypeError("a swap's meta must be an object")
        at = next((k for k, (i, _) in enumerate(r.live) if i in removed), len(r.live))
        for i, _ in r.live:
            if i in removed:
                (r.removed_summaries if r.transcript[i].get("summary") else r.offloaded).append(i)
        r.live = [x for x in r.live if x[0] not in removed]
        if rec.get("summary") is not None:
            r.live.insert(at, (rec["summary"], None))
            if rec.get("meta") is not None:
                r.metas[rec["summary"]] = rec["meta"]
    elif op == "undo":  # the last message was logged, then refused by the context
        if rec["i"] != len(r.transcript) - 1:
            raise ValueError(f"undo of message {rec['i']}, the last one is {len(r.transcript) - 1}")
        r.transcript.pop()
        r.live = [x for x in r.live if x[0] != rec["i"]]
    elif op == "pin":
        r.pinned.append(_index(r, rec["i"]))
    elif op == "note":
        lines = rec.get("lines")
        if not isinstance(lines, list) or not all(isinstance(x, str) for x in lines):
            raise TypeError("a note's 'lines' must be a list of strings")
        r.notes[_index(r, rec["i"])] = lines
    elif op == "tools":
        if not isinstance(rec["cur_tools"] or [], list):
            raise TypeError("'cur_tools' must be a list")
        r.cur_tools = rec["cur_tools"]


__all__ = ["FORMAT", "Replayed", "replay"]
