"""``pykvcompact chat``: an interactive chat on any model, driving a ``Session`` and nothing else.

Type a message to get a streamed reply. Commands: ``/compact [focus]``, ``/status``, ``/mode NAME``,
``/rubric NAME``, ``/save PATH``, ``/help``, ``/quit``. ``ChatApp`` takes its input as a function and
its output as a UI object, so it runs the same under a test as at a terminal."""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable, Optional

from .chat_ui import PlainUI, StatusClock, describe_event
from ..timeline.record import Timeline

HELP = ("commands: /compact [focus]  /status  /mode NAME  /rubric NAME  /save PATH  /help  /quit\n"
        "anything else is sent to the model")


class ChatApp:
    def __init__(self, engine, policy, *, system: Optional[str] = None, ui=None, read: Callable[[str], str] = input,
                 history_dir: str = "conversation_history", max_tokens: int = 512, sampling: Optional[dict] = None):
        self.engine, self.policy, self.system = engine, policy, system
        self.ui = ui or PlainUI()
        self.read = read
        self.history_dir = history_dir
        self.max_tokens = max_tokens
        self.sampling = dict(sampling or {})
        self.timeline = Timeline()
        self.session = self._new_session()
        self.commands = {"/compact": self.cmd_compact, "/status": self.cmd_status, "/mode": self.cmd_mode,
                         "/rubric": self.cmd_rubric, "/save": self.cmd_save, "/help": self.cmd_help}

    # ------------------------------------------------------------------ loop
    def run(self) -> int:
        self.ui.say(f"pykvcompact chat: {getattr(self.engine, 'model_name', 'model')}, mode {self.policy.mode}, "
                    f"window {self.session.window} tokens. /help for commands.")
        try:
            while True:
                try:
                    line = self.read("> ")
                except EOFError:
                    break
                line = line.strip()
                if not line:
                    continue
                if line in ("/quit", "/exit"):
                    break
                try:
                    self.handle(line)
                except KeyboardInterrupt:
                    self.ui.say("(interrupted)")
                except Exception as exc:  # noqa: BLE001 - one bad command must not end the chat
                    self.ui.say(f"error: {exc}")
        finally:
            self.session.close()
        return 0

    def handle(self, line: str) -> None:
        if line.startswith("/"):
            name, _, arg = line.partition(" ")
            cmd = self.commands.get(name)
            if cmd is None:
                self.ui.say(f"unknown command {name}; {HELP}")
                return
            cmd(arg.strip())
            return
        self.reply(line)

    def reply(self, text: str) -> None:
        clock = StatusClock()
        self.ui.start_reply(lambda: clock.line(self.session))
        try:
            for x in self.session.stream(text, max_tokens=self.max_tokens, **self.sampling):
                if isinstance(x, str):
                    clock.piece()
                    self.ui.piece(x)
                else:
                    self.ui.event(x)
        finally:
            self.ui.end_reply()

    # ------------------------------------------------------------------ commands
    def cmd_help(self, arg: str) -> None:
        self.ui.say(HELP)

    def cmd_compact(self, focus: str) -> None:
        e = self.session.compact(focus or None)
        self.ui.say(f"compacted: {describe_event(e)}" if e is not None else "nothing to compact yet")

    def cmd_status(self, arg: str) -> None:
        self.ui.say(json.dumps(self.status(), indent=1))

    def status(self) -> dict:
        s = self.session
        evs = [e.to_dict() for e in s.events]
        probes = [e for e in evs if e["event"] == "probe"]
        rate = self.timeline.tokens_per_s()
        return {
            "model": getattr(self.engine, "model_name", None), "mode": self.policy.mode, "rubric": self.policy.rubric,
            "fill": round(s.fill, 3), "window": s.window,
            "probes": len(probes), "probes_compress": sum(1 for e in probes if e["verdict"] == "COMPRESS"),
            "summaries": sum(1 for e in evs if e["event"] == "summary_ready"),
            "swaps": sum(1 for e in evs if e["event"] == "rebased"),
            "offload_path": s.history_path,
            "tokens_per_s": round(rate, 1) if rate else None,
        }

    def cmd_mode(self, name: str) -> None:
        self._switch(mode=name)

    def cmd_rubric(self, name: str) -> None:
        self._switch(rubric=name)

    def cmd_save(self, path: str) -> None:
        if not path:
            raise ValueError("/save needs a path")
        data = {"model": getattr(self.engine, "model_name", None), "policy": dataclasses.asdict(self.policy),
                "transcript": self.session.transcript, "events": [e.to_dict() for e in self.session.events]}
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=1)
        os.replace(tmp, path)
        self.ui.say(f"saved {len(data['transcript'])} messages to {path}")

    # ------------------------------------------------------------------ sessions
    def _new_session(self):
        import pykvcompact as pk

        s = pk.Session(self.engine, system=self.system, policy=self.policy, history_dir=self.history_dir)
        return self.timeline.attach(s)

    def _switch(self, **change) -> None:
        """A new policy: a new session carrying the live messages (summaries included) over."""
        if not next(iter(change.values())):
            raise ValueError(f"/{next(iter(change))} needs a name")
        policy = dataclasses.replace(self.policy, **change)  # validates the name
        live = [m for m in self.session.messages if m.get("role") != "system" or m.get("summary")]
        self.timeline.finish()
        self.session.close()
        self.policy = policy
        self.session = self._new_session()
        if live:
            self.session.add(live)
        self.ui.say(f"{', '.join(f'{k} {v}' for k, v in change.items())}; {len(live)} messages carried over")


def run_chat(args, ui=None, read=None) -> int:
    """The ``chat`` subcommand (``args`` from the CLI parser)."""
    import sys

    import pykvcompact as pk
    from .chat_ui import RichUI

    if ui is None:
        ui = PlainUI()
        if sys.stdout.isatty() and not args.plain:
            try:
                ui = RichUI()
            except ImportError:  # the live status line needs the 'chat' extra; plain text still works
                pass
    engine = pk.Engine(args.model, n_ctx=args.n_ctx, n_seq_max=8, n_threads=args.threads)
    try:
        policy = pk.Policy(mode=args.mode, window=args.window, rubric=args.rubric)
        sampling = {"temperature": args.temperature}
        app = ChatApp(engine, policy, system=args.system, ui=ui, read=read or input, history_dir=args.history_dir,
                      max_tokens=args.max_tokens, sampling=sampling)
        return app.run()
    finally:
        engine.close()
