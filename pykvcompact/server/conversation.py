"""One client conversation: the messages the client has seen, the live ``Session`` that holds its KV
(or none, while offloaded), and the events of every session it has had."""
from __future__ import annotations

import json
import os
import threading
import time
from typing import List, Optional


class Conversation:
    def __init__(self, conversation_id: str, *, explicit: bool):
        self.id = conversation_id
        self.explicit = explicit            # named by the client (X-Session-Id / user), not by prefix
        self.session = None                 # pykvcompact.Session while live
        self.seen: List[dict] = []          # what the client has seen: its messages and our replies
        self.keys: List[tuple] = []         # message keys of ``seen`` (prefix matching)
        self.lock = threading.Lock()        # held for the whole of a request on this conversation
        self.last_used = time.monotonic()
        self.reserved = False               # a session is being created for it
        self.past_events: List[dict] = []   # events of the sessions it had before this one
        self.offload_path: Optional[str] = None
        self.snapshot_path: Optional[str] = None  # Session.save of the offloaded session (its KV state)
        self.history_path: Optional[str] = None
        self.generated_tokens = 0
        self.generating_s = 0.0

    @property
    def live(self) -> bool:
        return self.session is not None

    def events(self) -> List[dict]:
        current = [e.to_dict() for e in self.session.events] if self.session is not None else []
        return self.past_events + current

    def remember(self, messages: List[dict], keys: List[tuple]) -> None:
        self.seen, self.keys = messages, keys

    def forget(self) -> None:
        """The client's view is unknown (a stream was cut): the next request rebuilds the session."""
        self.seen, self.keys = [], []

    def retire(self, reason: str, save_dir: Optional[str] = None) -> None:
        """Close the live session, keeping its events; with ``save_dir``, its transcript and a snapshot
        (``Session.save``) are written there first (an offload: the conversation comes back from the
        snapshot, or re-prefills from ``seen`` when the snapshot cannot be used)."""
        s = self.session
        if s is None:
            return
        self.past_events.extend(e.to_dict() for e in s.events)
        event = {"event": "session_closed", "reason": reason, "t": time.time(), "messages": len(self.seen)}
        if save_dir is not None:
            os.makedirs(save_dir, exist_ok=True)
            path = os.path.join(save_dir, f"{self.id}.transcript.json")
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"id": self.id, "transcript": s.transcript, "seen": self.seen}, f, ensure_ascii=False)
            os.replace(tmp, path)
            self.offload_path = path
            event.update(event="session_offloaded", path=path)
            try:
                snap = os.path.join(save_dir, f"{self.id}.pkv")
                s.save(snap)
                self.snapshot_path = event["snapshot"] = snap
            except Exception as e:  # noqa: BLE001 - without a snapshot it comes back by re-prefilling
                self.snapshot_path, event["snapshot_error"] = None, f"{type(e).__name__}: {e}"
        else:
            self.snapshot_path = None
        self.past_events.append(event)
        self.session = None
        s.close()

    def info(self) -> dict:
        s = self.session
        try:
            return self._info(s)
        except Exception:  # noqa: BLE001 - closed by an offload while we read it: report it as offloaded
            return self._info(None)

    def _info(self, s) -> dict:
        return {
            "id": self.id,
            "object": "session",
            "live": s is not None,
            "fill": round(s.fill, 4) if s is not None else None,
            "window": s.window if s is not None else None,
            "tokens": s.n_tokens if s is not None else None,
            "messages": len(self.seen),
            "history_path": s.history_path if s is not None else self.history_path,
            "offload_path": self.offload_path,
            "generated_tokens": self.generated_tokens,
            "tokens_per_s": round(self.generated_tokens / self.generating_s, 2) if self.generating_s else None,
            "events": self.events(),
        }
