"""The session's write-ahead log: one JSON line per change, appended and fsynced before the change is
acknowledged, next to the history file (``{history_dir}/{session_id}.log.jsonl``).

What it records is enough to rebuild the session after the process dies at any point (SIGKILL mid
prefill, mid summary, mid swap): every message of the transcript (``msg``), each swap that replaced live
messages by a summary or dropped them (``swap``), pins (``pin``), the tool header (``tools``), and a
message logged and then refused by the context (``undo``).  A
session's records start at its ``open`` record (the policy, the tools); a new session with the same id
starts a new ``open`` and replay (``replay.py``) reads the last one.  A line cut short by a crash is
ignored: the change it described was never acknowledged, and the next write cuts it off (so that no record
is appended to it).

Each write takes an exclusive ``flock`` on the log and checks that the file still ends where this session
left it.  Two live sessions with one id (a copy loaded while the original runs, a restart beside a stuck
process) may then both go on: a session that finds records of another after its own writes its whole
section again (an ``open`` and every record since, checked against a CRC) before its new record, so the
log always replays to exactly one of them, the last to write, never to a mixture (a ``RuntimeWarning``
says so).  A log removed, replaced or edited under a session refuses its writes (:class:`LogTakenError`).
A record of a change already made (a generated reply, a swap, an undo) that cannot be written is kept and
written before the next record, so the log never parts ways with the transcript.
"""
from __future__ import annotations

import dataclasses
import json
import os
import warnings
import zlib
from pathlib import Path
from typing import List, Optional, Tuple

from ..errors import InvalidStateError
from .replay import FORMAT, Replayed

try:
    import fcntl
except ImportError:  # pragma: no cover - no flock (Windows): one writer per log is then the caller's care
    fcntl = None

_CHUNK = 1 << 16


def log_path(history_dir, session_id: str) -> Path:
    return Path(history_dir) / f"{session_id}.log.jsonl"


class LogTakenError(InvalidStateError):
    """The log was removed, replaced or edited since this session last wrote or loaded it."""


class Journal:
    """Append-only, fsynced JSON lines.  A write that fails raises (the caller does not acknowledge)."""

    def __init__(self, path: Path):
        self.path = Path(os.path.abspath(path))  # a later chdir must not move the log
        self.records = 0          # records of this session written so far (since its ``open``)
        self.session_id = self.path.name.split(".log.jsonl")[0]
        self._sec = 0                          # where this session's section (its ``open``) starts
        self._end: Optional[int] = None        # where its last record ends (None: nothing written yet)
        self._crc = 0                          # CRC-32 of the section's bytes
        self._file: Optional[Tuple[int, int]] = None  # (st_dev, st_ino) of the log
        self._backlog: List[bytes] = []        # records of changes already made, not yet written

    def resume(self, r: Replayed) -> None:
        """Continue the log ``r`` was read from, right after its last complete record."""
        self.session_id, self.records = r.session_id, r.records
        self._sec, self._end, self._crc, self._file = r.start, r.end, r.crc, r.file

    # ------------------------------------------------------------------ writing
    def write(self, rec: dict, *, defer: bool = False) -> None:
        """Append ``rec`` (after any kept records).  ``defer``: the change it records is made already; if
        the write fails it is kept for the next write (the ``OSError`` says so)."""
        line = (json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        try:
            self._append(self._backlog + [line])
        except OSError as e:
            if defer:
                self._backlog.append(line)
                raise self._error(e, "the change is made in the session but not in its log yet; it is written "
                                     "before the next record (free space or fix the directory; a crash before "
                                     "then loses it)") from None
            raise self._error(e, "nothing was changed; free space or fix the directory and retry") from None
        self.records += len(self._backlog) + 1
        self._backlog.clear()

    def flush(self) -> None:
        """Write the kept records now, and make the log this session's (written again after another
        same-id session's records; ``LogTakenError`` when it was removed): a snapshot describes the log, so it
        must hold every change of this session and end with them.  Raises ``OSError`` if it cannot."""
        try:
            self._append(self._backlog)
        except OSError as e:
            raise self._error(e, f"{len(self._backlog)} changes made in the session are not in it yet; "
                                 "free space or fix the directory and retry") from None
        self.records += len(self._backlog)
        self._backlog.clear()

    def _error(self, e: OSError, what: str) -> OSError:
        return type(e)(e.errno, f"cannot write the session log {str(self.path)!r} ({e.strerror or e}): {what}")

    def _append(self, lines: List[bytes]) -> None:
        flags = os.O_RDWR | os.O_APPEND | (os.O_CREAT if self._end is None else 0)
        if self._end is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, flags, 0o644)
        except FileNotFoundError:
            raise self._taken("was removed") from None
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)  # one writer at a time; released by close
            start, again = self._start(fd)
            data = again + b"".join(lines)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError:
                _cut(fd, start)  # no partial line may stay: the next record would be glued to it
                raise
            if again or self._end is None:  # a new section starts here
                self._sec, self._crc = start, 0
                fsync_dir(self.path.parent)  # the log may be a new file: make its name durable too
            self._end, self._crc = start + len(data), zlib.crc32(data, self._crc)
        finally:
            os.close(fd)

    def _start(self, fd: int) -> Tuple[int, bytes]:
        """Where the next record goes (the lock is held), and this session's section when it must be
        written again first (another session wrote after it).  A torn last line is cut off."""
        st = os.fstat(fd)
        if self._end is None:  # a new session: after the last complete line of whatever is there
            self._file = (st.st_dev, st.st_ino)
            return self._cut_tail(fd, st.st_size), b""
        if (st.st_dev, st.st_ino) != self._file or st.st_size < self._end:
            raise self._taken("was replaced or cut")
        if not _has_newline(fd, self._end, st.st_size):
            return self._cut_tail(fd, st.st_size), b""
        mine = os.pread(fd, self._end - self._sec, self._sec)
        if zlib.crc32(mine) != self._crc:
            raise self._taken("was edited")
        warnings.warn(f"session {self.session_id!r}: another open Session with this id wrote its log "
                      f"{str(self.path)!r} since this one did; this Session's records are written again after "
                      "the other's, so the log now replays to this Session (close one of them)", RuntimeWarning,
                      stacklevel=5)
        return self._cut_tail(fd, st.st_size), mine

    def _cut_tail(self, fd: int, size: int) -> int:
        end = _last_line_end(fd, size)
        if size > end:
            _cut(fd, end)  # a line cut short by a crash: never acknowledged
        return end

    def _taken(self, what: str) -> LogTakenError:
        return LogTakenError(
            f"session {self.session_id!r}: its log {str(self.path)!r} {what} since this Session last wrote or "
            "loaded it; this Session records nothing more: close it, then Session.load(engine, "
            f"{str(self.path)!r}) to continue from what the log holds, or use another session_id")

    # ------------------------------------------------------------------ records
    def open(self, *, session_id: str, history_dir: str, policy, tools, cur_tools) -> None:
        self.records, self.session_id = 0, session_id
        # the log's own directory, absolute: a relative history_dir means nothing to another process
        self.write({"op": "open", "format": FORMAT, "session_id": session_id, "history_dir": str(self.path.parent),
                    "policy": dataclasses.asdict(policy), "tools": tools, "cur_tools": cur_tools})

    def message(self, index: int, msg: dict, view: Optional[dict], live: bool, *, defer: bool = False) -> None:
        rec = {"op": "msg", "i": index, "msg": msg, "live": live}
        if view is not None:
            rec["view"] = view
        self.write(rec, defer=defer)

    def swap(self, removed: List[int], summary: Optional[int], meta: Optional[dict]) -> None:
        self.write({"op": "swap", "removed": removed, "summary": summary, "meta": meta}, defer=True)

    def undo(self, index: int) -> None:
        self.write({"op": "undo", "i": index}, defer=True)

    def pin(self, index: int) -> None:
        self.write({"op": "pin", "i": index})

    def note(self, index: int, lines: List[str]) -> None:
        """The model's note of the tool result at ``index`` (compaction/summary/notes.py): kept across save/load."""
        self.write({"op": "note", "i": index, "lines": list(lines)})

    def tools(self, cur_tools) -> None:
        self.write({"op": "tools", "cur_tools": cur_tools})


def fsync_dir(path) -> None:
    """Make a new or renamed directory entry durable (best effort: not every file system can)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _cut(fd: int, size: int) -> None:
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    except OSError:  # pragma: no cover - the write error is the one to report
        pass


def _has_newline(fd: int, start: int, stop: int) -> bool:
    while start < stop:
        chunk = os.pread(fd, min(_CHUNK, stop - start), start)
        if not chunk:
            return False
        if b"\n" in chunk:
            return True
        start += len(chunk)
    return False


def _last_line_end(fd: int, size: int) -> int:
    """The offset just after the file's last newline (0 if it has none)."""
    stop = size
    while stop > 0:
        start = max(0, stop - _CHUNK)
        k = os.pread(fd, stop - start, start).rfind(b"\n")
        if k >= 0:
            return start + k + 1
        stop = start
    return 0


__all__ = ["Journal", "LogTakenError", "log_path", "fsync_dir"]
