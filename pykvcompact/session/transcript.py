"""The transcript: every message ever (``messages``), the ones that left the live context (``offloaded``),
the pins; it writes the history file and the write-ahead log (the journal) as messages come and go.

``offload()`` is idempotent: a message is written to the history file once, however many times a swap
that replaces it is retried (a set of written transcript indices).  ``forget()`` moves messages to
``offloaded`` only once the swap that replaced them has succeeded.

The log and the transcript never part ways: a change is logged before it is made, and the record of a
change that cannot be undone (a generated reply, a swap, an undo) whose write fails is kept by the journal
and written before its next record.
"""
from __future__ import annotations

import copy
from typing import List, Optional, Sequence, Set

from .history_file import HistoryFile
from .journal import LogTakenError


class Transcript:
    def __init__(self, history: HistoryFile, journal=None):
        """``journal``: the write-ahead log (session/journal.py) each change is written to first (None: none)."""
        self.history = history
        self.messages: List[dict] = []
        self.offloaded: List[dict] = []
        self._written: Set[int] = set()      # transcript indices already in the history file
        self._marked: Set[int] = set()       # summaries already marked as replaced
        self.pinned: Set[int] = set()        # transcript indices kept verbatim in every compaction
        self.journal = journal
        self._logged: Optional[int] = None   # index of the message :meth:`log` wrote, not yet recorded

    @property
    def path(self) -> str:
        return str(self.history.path)

    def restore(self, replayed) -> None:
        """The state a replayed log describes (``replay.replay``): the transcript, what was offloaded and
        written to the history file, the summaries marked as replaced, the pins."""
        self.messages = list(replayed.transcript)
        self.offloaded = [replayed.transcript[i] for i in sorted(replayed.offloaded)]
        self._written = set(replayed.offloaded)
        self._marked = set(replayed.removed_summaries)
        self.pinned = set(replayed.pinned) | {i for i, m in enumerate(replayed.transcript) if m.get("pinned")}
        self.history.blocks = 1 if self.history.path.exists() else 0

    def log(self, msg: dict, view: Optional[dict] = None, live: bool = True) -> None:
        """Write the next message to the log (fsynced) before it changes anything.  ``live``: it goes into
        the live context (a summary goes live with its swap); ``view``: what the template sees of it, when
        that is not ``view_of(msg)``.  Raises ``OSError`` when the log cannot be written."""
        if self.journal is not None:
            self.journal.message(len(self.messages), msg, view, live and not msg.get("summary"))
        self._logged = len(self.messages)

    def unlog(self, index: int) -> None:
        """The message logged as ``index`` did not make it (the context refused it)."""
        self._logged = None
        if self.journal is not None:
            try:
                self.journal.undo(index)
            except (OSError, LogTakenError):
                pass  # kept for the next write (or the log is another session's): the refusal is the error

    def record_live(self, msg: dict, view: Optional[dict] = None) -> int:
        """Add ``msg``, already live (a generated reply), to the transcript and log it.  A failed write
        raises ``OSError`` after the message is recorded: its record is written before the next one."""
        try:
            if self.journal is not None:
                self.journal.message(len(self.messages), msg, view, True, defer=True)
        finally:
            self._logged = len(self.messages)
            self.record(msg)
        return len(self.messages) - 1

    def record(self, msg: dict, view: Optional[dict] = None, live: bool = True, log: bool = True) -> int:
        """Add ``msg`` to the transcript (logged first unless :meth:`log` just did, or ``log`` is False:
        it is live already and must be in the transcript even if the log cannot be written); returns its
        index."""
        i = len(self.messages)
        if log and self._logged != i:
            self.log(msg, view, live)
        self._logged = None
        self.messages.append(msg)
        if msg.get("pinned"):
            self.pinned.add(i)
        return i

    def pin(self, index: int) -> dict:
        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"message_index must be an int, got {type(index).__name__}")
        n = len(self.messages)
        if not -n <= index < n:
            raise IndexError(f"message_index {index} is out of range: the transcript has {n} messages")
        index %= n
        m = self.messages[index]
        if m.get("summary"):
            raise ValueError("a summary cannot be pinned; pin the message it replaced instead")
        if self.journal is not None and index not in self.pinned:
            self.journal.pin(index)
        self.pinned.add(index)
        return m

    def is_pinned(self, index: int) -> bool:
        return index in self.pinned

    def offload(self, entries: Sequence, reason: str) -> int:
        """Write the messages of ``entries`` (objects with ``msg``, ``tidx``, ``summary``) not yet written
        (durably, before the live context forgets them). Returns how many were newly written."""
        new = [e for e in entries if not e.summary and e.tidx not in self._written]
        summ = [e.tidx for e in entries if e.summary and e.tidx not in self._marked]
        if not new and not summ:
            return 0
        self.history.append([e.msg for e in new], indices=[e.tidx for e in new], reason=reason, summaries=summ)
        self._written.update(e.tidx for e in new)
        self._marked.update(summ)
        return len(new)

    def forget(self, entries: Sequence, summary=None, described: Optional[dict] = None) -> None:
        """The swap that replaced ``entries`` (by the ``summary`` entry, or by nothing) succeeded: they are
        now offloaded (and only now).  ``described``: what the summary holds, for the log."""
        try:
            if self.journal is not None:
                self.journal.swap([e.tidx for e in entries], None if summary is None else summary.tidx,
                                  described)
        except (OSError, LogTakenError):
            pass  # the swap is done: the journal keeps its record for the next write (or refuses that too)
        finally:
            self.offloaded.extend(e.msg for e in entries if not e.summary)

    def copy(self) -> List[dict]:
        return [copy.deepcopy(m) for m in self.messages]


__all__ = ["Transcript"]
