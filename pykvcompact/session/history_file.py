"""Offloaded history: summarizing is not forgetting, it is storing elsewhere.

Before any swap the replaced messages are appended to ``{history_dir}/{session_id}.md`` — append, flush,
fsync — so the file is on disk before the live context forgets them.  Each message is written verbatim
(its content exactly as in the transcript, tool calls as JSON).  Earlier summaries are not offloaded again
as history: a one-line marker points back at the block where their messages were written.
"""
from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path
from typing import List, Optional, Sequence

_SAFE_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def check_session_id(session_id: str) -> str:
    if not isinstance(session_id, str) or not _SAFE_ID.match(session_id) or session_id in (".", ".."):
        raise ValueError(f"session_id must be 1-128 characters of [A-Za-z0-9._-], got {session_id!r}")
    return session_id


def format_message(m: dict, index: Optional[int] = None) -> str:
    role = m.get("role", "?")
    head = f"### [{index}] {role}" if index is not None else f"### {role}"
    if m.get("name"):
        head += f" ({m['name']})"
    if m.get("tool_call_id"):
        head += f" tool_call_id={m['tool_call_id']}"
    parts = [head, ""]
    content = m.get("content")
    if content:
        parts.append(content if isinstance(content, str) else json.dumps(content, ensure_ascii=False))
    if m.get("tool_calls"):
        parts.append("```json tool_calls")
        parts.append(json.dumps(m["tool_calls"], ensure_ascii=False, indent=1))
        parts.append("```")
    parts.append("")
    return "\n".join(parts) + "\n"


class HistoryFile:
    """Append-only markdown file holding every message that left the live context."""

    def __init__(self, history_dir, session_id: str):
        self.session_id = check_session_id(session_id)
        self.dir = Path(os.path.abspath(history_dir))  # a later chdir must not move it away from the log
        self.path = self.dir / f"{session_id}.md"
        self.blocks = 0

    def check_writable(self) -> None:
        """Fail now, not at the first compaction, when the history cannot be written (the swap refuses
        to forget messages it could not store)."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.close(fd)
            if self.path.stat().st_size == 0:
                self.path.unlink()  # created only to test: the first offload writes the header
        except OSError as e:
            raise ValueError(f"history_dir {str(self.dir)!r} is not writable ({e.strerror or e}): the session "
                             "stores every compacted message there before forgetting it; pass a writable "
                             "history_dir") from None

    def append(self, messages: Sequence[dict], *, indices: Optional[Sequence[int]] = None,
               reason: str = "compaction", summaries: Sequence[int] = ()) -> int:
        """Append ``messages`` (durably). ``indices`` are their transcript indices; ``summaries`` the
        transcript indices of earlier summaries that were replaced too (marked, not copied). Returns the
        number of bytes written."""
        self.dir.mkdir(parents=True, exist_ok=True)
        new_file = not self.path.exists() or self.path.stat().st_size == 0
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        out: List[str] = []
        if new_file:
            out.append(f"# Conversation history — session {self.session_id}\n\n"
                       "Messages removed from the live context, verbatim, oldest first.\n\n")
        rng = ""
        if indices:
            rng = f" (transcript messages {min(indices)}..{max(indices)})"
        out.append(f"## Offload {now} — {reason}, {len(messages)} messages{rng}\n\n")
        for s in summaries:
            out.append(f"_(summary [{s}] of earlier messages replaced; those messages are above in this file)_\n\n")
        for k, m in enumerate(messages):
            out.append(format_message(m, indices[k] if indices else None))
        data = "".join(out).encode("utf-8")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise type(e)(e.errno, f"cannot write the history file {str(self.path)!r} ({e.strerror or e})") from None
        try:
            size = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError as e:
                try:  # a half block would be followed by the whole block again when the swap is retried
                    os.ftruncate(fd, size)
                except OSError:
                    pass
                raise type(e)(e.errno, f"cannot write the history file {str(self.path)!r} ({e.strerror or e}): "
                                       "the messages stay in the live context") from None
        finally:
            os.close(fd)
        self.blocks += 1
        if new_file:  # make the new directory entry durable too
            try:
                dfd = os.open(self.dir, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
            except OSError:
                pass
        return len(data)

    def read(self) -> str:
        return self.path.read_text(encoding="utf-8") if self.path.exists() else ""


__all__ = ["HistoryFile", "format_message", "check_session_id"]
