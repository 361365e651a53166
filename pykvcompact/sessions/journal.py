"""The session's write-ahead log: one JSON line per change, appended and fsynced before the change is
acknowledged, next to the history file (``{history_dir}/{session_id}.log.jsonl``).

What it records is enough to rebuild the session after the process dies at any point (SIGKILL mid
prefill, mid summary, mid swap): every message of the transcript (``msg``), each swap that replaced live
messages by a summary or dropped them (``swap``), pins (``pin``), the tool header (``tools``), and a
message logged and then refused by the context (``undo``).  A
session's records start at its ``open`` record (the policy, the tools); a new session with the same id
starts a new ``open`` and replay reads the last one.  A line cut short by a crash is ignored: the change
it described was never acknowledged.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple

FORMAT = 1


def log_path(history_dir, session_id: str) -> Path:
    return Path(history_dir) / f"{session_id}.log.jsonl"


class Journal:
    """Append-only, fsynced JSON lines.  A write that fails raises (the caller does not acknowledge)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.records = 0          # records of this session written so far (since its ``open``)

    def write(self, rec: dict) -> None:
        line = (json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise type(e)(e.errno, f"cannot write the session log {str(self.path)!r} ({e.strerror or e}): "
                                   "nothing was changed; free space or fix the directory and retry") from None
        self.records += 1

    def open(self, *, session_id: str, history_dir: str, policy, tools, cur_tools) -> None:
        self.records = 0
        self.write({"op": "open", "format": FORMAT, "session_id": session_id, "history_dir": history_dir,
                    "policy": dataclasses.asdict(policy), "tools": tools, "cur_tools": cur_tools})

    def message(self, index: int, msg: dict, view: Optional[dict], live: bool) -> None:
        rec = {"op": "msg", "i": index, "msg": msg, "live": live}
        if view is not None:
            rec["view"] = view
        self.write(rec)

    def swap(self, removed: List[int], summary: Optional[int], meta: Optional[dict]) -> None:
        self.write({"op": "swap", "removed": removed, "summary": summary, "meta": meta})

    def undo(self, index: int) -> None:
        self.write({"op": "undo", "i": index})

    def pin(self, index: int) -> None:
        self.write({"op": "pin", "i": index})

    def tools(self, cur_tools) -> None:
        self.write({"op": "tools", "cur_tools": cur_tools})


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
    records: int = 0


def replay(path) -> Replayed:
    """Read a log back.  Raises ``InvalidStateError`` when it is not a session log."""
    from ..errors import InvalidStateError
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise InvalidStateError(f"cannot read the session log {str(path)!r}: {e.strerror or e}") from None
    lines = raw.split(b"\n")
    if lines and lines[-1] != b"":
        lines = lines[:-1]  # cut short by a crash: never acknowledged
    recs = []
    for k, ln in enumerate(lines):
        if not ln.strip():
            continue
        try:
            recs.append(json.loads(ln))
        except ValueError:
            raise InvalidStateError(f"{str(path)!r} line {k + 1} is not JSON: not a pykvcompact session log, "
                                    "or it was edited") from None
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
    r.records = len(recs) - start
    return r


def _check_msg(msg) -> None:
    """A logged message (or view) has the shape the session gives its messages."""
    from .messages import check_json, normalize_messages
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
    elif op == "tools":
        if not isinstance(rec["cur_tools"] or [], list):
            raise TypeError("'cur_tools' must be a list")
        r.cur_tools = rec["cur_tools"]


__all__ = ["Journal", "Replayed", "replay", "log_path"]
