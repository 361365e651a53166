"""Saving and resuming a session.

The log (``journal.py``) is the source of truth for what was said: every message, swap and pin, fsynced
as it happened.  A snapshot (``Session.save``) adds what the log cannot give cheaply: where each live
message starts in the text and tokens, and the KV state of the live sequence.  ``load`` replays the log,
then takes the KV state from the snapshot when the snapshot is current (no record after it) and the
engine accepts it (same model, context size, library version); otherwise it prefills the live context
again.  Either way the resumed session holds the same transcript, live messages, pins and summaries, and
its history and log stay where the log is now (moved with the snapshot, or named relative to another
working directory).  A live context over the window of the engine it is loaded into is compacted to fit,
or the load is refused with a clear ``ValueError``.

Snapshot file: ``MAGIC``, an 8-byte header length, the JSON header, then the sequence state blob.
"""
from __future__ import annotations

import contextlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .. import errors
from ..compaction.policy import Policy
from .context import Entry
from .journal import Journal, fsync_dir, log_path
from .replay import replay
from ..chat.messages import view_of

MAGIC = b"PKVSESS1"


def save_session(path, ctx, journal, session_id: str, log: str) -> None:
    """Write the snapshot of the live context ``ctx`` atomically (temp file, fsync, rename): a crash leaves
    the old one or the new.  ``journal``: the session's log, flushed first (the snapshot describes it)."""
    try:
        os.fsencode(os.fspath(path))
    except UnicodeEncodeError:   # (a lone surrogate: the file system cannot name it)
        raise ValueError(f"the snapshot path {path!r} cannot be encoded for the file system; "
                         "use a path of valid characters") from None
    if ctx.partial is not None:  # pragma: no cover - a call is running (guarded by the session)
        raise errors.SequenceBusyError("a reply is being generated; save after it")
    journal.flush()  # the snapshot describes the log: it must hold every change first
    blob, kv_note = b"", ""
    try:
        blob = ctx.seq.save_state()
    except AttributeError:
        kv_note = "the engine cannot export KV state"
    except errors.PyKVCompactError as e:
        kv_note = str(e)
    header = {
        "session_id": session_id, "log": os.path.abspath(log), "records": journal.records,
        "n_prefix": ctx.n_prefix, "text": ctx.text, "n_tokens": len(ctx),
        "entries": [[e.tidx, e.start_char, e.start_tok] for e in ctx.entries],
        "kv": bool(blob), "kv_note": kv_note,
    }
    head = json.dumps(header, ensure_ascii=False).encode("utf-8")
    _write_atomically(Path(path), MAGIC + struct.pack("<Q", len(head)) + head + blob)


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except Exception:  # a failed save leaves nothing behind (a kill, BaseException, may leave the .tmp)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)  # make the rename durable


def _read_snapshot(path: Path):
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise errors.InvalidStateError(f"cannot read {str(path)!r}: {e.strerror or e}") from None
    if not raw.startswith(MAGIC):
        raise errors.InvalidStateError(f"{str(path)!r} is a session snapshot of another pykvcompact version "
                                       f"({raw[:len(MAGIC)]!r}; this one reads {MAGIC!r}): load the session from "
                                       "its log")
    if len(raw) < len(MAGIC) + 8:
        raise errors.InvalidStateError(f"{str(path)!r} is cut short: load the session from its log instead")
    (n,) = struct.unpack("<Q", raw[len(MAGIC):len(MAGIC) + 8])
    start = len(MAGIC) + 8
    if start + n > len(raw):
        raise errors.InvalidStateError(f"{str(path)!r} is cut short: load the session from its log instead")
    try:
        header = json.loads(raw[start:start + n])
    except ValueError:
        raise errors.InvalidStateError(f"{str(path)!r} has a corrupt header: load the session from its log") from None
    return header, raw[start + n:]


@dataclass
class Loaded:
    """What :func:`read_session` found: the replayed log (``record``), the log itself, the policy it holds
    and, from a snapshot, its header and KV state."""
    record: object
    journal: Journal
    policy: Policy
    header: Optional[dict]
    blob: bytes


def read_session(path, kwargs: dict) -> Loaded:
    """Read a snapshot or a log for ``Session.load`` (the arguments it may not take are refused here)."""
    for key in ("policy", "session_id", "history_dir", "tools", "system"):
        if key in kwargs:
            raise TypeError(f"Session.load takes {key} from the session's log, not as an argument; load it, then "
                            "use the session (or start a new Session with the settings you want)")
    path = Path(path)
    header, blob, log = None, b"", path
    if _is_snapshot(path):  # by content, not by name: save() accepts any name
        header, blob = _read_snapshot(path)
        if not isinstance(header, dict) or not isinstance(header.get("log"), str) or not header["log"]:
            raise errors.InvalidStateError(f"{str(path)!r} has a corrupt header (no log path): load the session "
                                           "from its log")
        log = Path(header["log"])
        if not log.exists():  # moved together with the snapshot: look next to it
            log = path.parent / log.name
    r = replay(log)
    journal = Journal(log)
    journal.resume(r)
    try:
        # a log written before search_history existed: that session did not offer it, keep it so
        stored = dict(r.policy)
        if "cue_weight" not in stored:   # an older log: its result_cue weighed a wording cue that is gone
            stored.pop("result_cue", None)
        policy = Policy(**{"history_tool": False, **stored})
    except (TypeError, ValueError) as e:
        raise errors.InvalidStateError(f"{str(log)!r} holds a policy this version cannot use ({e})") from None
    return Loaded(r, journal, policy, header, blob)


def _is_snapshot(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC) - 1) == MAGIC[:-1]  # any version of the magic: a snapshot
    except OSError as e:
        raise errors.InvalidStateError(f"cannot read {str(path)!r}: {e.strerror or e}") from None


def restore_context(ctx, room, engine, window: int, session_id: str, r, header: Optional[dict],
                    blob: bytes) -> dict:
    """The live context ``ctx``: from the snapshot's KV state when it describes this log, else prefilled;
    then fitted to ``window`` (``room`` compacts).  Returns what ``Session.resumed`` reports."""
    live = [(i, v if v is not None else view_of(r.transcript[i])) for i, v in r.live]
    n_prefix = 1 if live and r.transcript[live[0][0]].get("role") == "system" else 0
    why = _kv_usable(header, r, live) or _load_kv(ctx, engine, r, live, header, blob, n_prefix)
    if why:
        try:
            for i, v in live:  # prefill again, message by message (as they were added)
                ctx.add(r.transcript[i], v, i, summary=bool(r.transcript[i].get("summary")))
        except errors.ContextFullError as e:  # more than this engine's whole pool
            raise ValueError(f"session {session_id!r}: its live context does not fit in this engine (n_ctx "
                             f"{engine.n_ctx}: {e}): load it into an engine with a larger n_ctx (e.g. the one "
                             "that saved it), compact() and save() it there, then load it here") from None
        ctx.n_prefix = n_prefix
    _fit(ctx, room, engine, window, session_id)
    ctx.prefilled = 0
    return {"kv": not why, "reason": why, "tokens": len(ctx)}


def _load_kv(ctx, engine, r, live, header: dict, blob: bytes, n_prefix: int) -> str:
    """Take the snapshot's KV state as the live sequence; why it could not be used ("" when it was)."""
    try:
        seq = engine.load_sequence(blob)
    except (errors.PyKVCompactError, AttributeError) as e:
        return f"the KV state was not loaded ({e})"
    ctx.entries = [Entry(r.transcript[i], v, i, bool(r.transcript[i].get("summary")), c, t)
                   for (i, v), (_, c, t) in zip(live, header["entries"])]
    ctx.text, ctx.n_prefix = header["text"], n_prefix
    ctx.replace_sequence(seq)
    render = ctx.render()
    # a generated reply keeps the tokens the model chose, which may spell the text differently from a
    # fresh tokenization: the state is right when its tokens spell exactly the rendered messages
    if seq.tokens == ctx.tok(render) or ctx.detok(seq.tokens) == render:
        return ""
    ctx.entries, ctx.text = [], ""
    ctx.replace_sequence(engine.sequence())
    return "the loaded KV state does not match the rendered messages"


def _fit(ctx, room, engine, window: int, session_id: str) -> None:
    """A live context over the window here (a smaller engine; replies re-tokenized a little longer) is
    compacted to fit, as a call would do; when it cannot be, the load is refused clearly."""
    if len(ctx) <= window:
        return
    n, cause = len(ctx), ""
    try:
        room.make(lambda: len(ctx))
    except (errors.PyKVCompactError, ValueError) as e:  # no room for the summary, no cut point...
        cause = f" ({e})"
    if len(ctx) <= window and not cause:
        return
    raise ValueError(
        f"session {session_id!r}: its live context ({n} tokens) is larger than its window on this engine "
        f"({window} tokens, n_ctx {engine.n_ctx}) and could not be compacted to fit{cause}: load it into "
        "an engine with a larger n_ctx (e.g. the one that saved it), compact() and save() it there, then load "
        "it here")


def _kv_usable(header: Optional[dict], r, live) -> str:
    """Why the snapshot's KV state cannot be used ("" when it can)."""
    if header is None:
        return "loaded from the log (no snapshot)"
    entries = header.get("entries")
    if not (isinstance(header.get("text"), str) and isinstance(entries, list)
            and all(isinstance(e, list) and len(e) == 3 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                 for x in e) for e in entries)):
        return "the snapshot's header is corrupt"
    if header.get("records") != r.records:
        return "the log has records after the snapshot"
    if not header.get("kv"):
        return f"the snapshot has no KV state ({header.get('kv_note') or 'not saved'})"
    if [e[0] for e in header.get("entries", [])] != [i for i, _ in live]:
        return "the snapshot's live messages differ from the log's"
    return ""


__all__ = ["save_session", "read_session", "restore_context", "Loaded", "MAGIC", "log_path"]
