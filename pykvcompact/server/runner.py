"""Build the engine, the registry and the app from a :class:`ServerConfig`; run them with uvicorn, in
the foreground (``pykvcompact serve``) or in a thread (tests, embedding)."""
from __future__ import annotations

import hashlib
import os
import re
import socket
import threading
from typing import Optional

from .config import SEQUENCES_PER_SESSION, ServerConfig, policy_for
from .registry import SessionRegistry

# rough upper bounds of a session's probe and summarizer prompts, for the cell budget per session
PROBE_PROMPT_TOKENS = 256
SUMMARIZER_PROMPT_TOKENS = 512


def session_id_for(conversation_id: str) -> str:
    """The ``Session`` id (``[A-Za-z0-9._-]``, a file name) of a conversation: an id the server accepts that a
    session does not (``user:1``, ``me@example.com``, ``.``) gets its other characters replaced and a short
    hash of it appended, so that distinct conversations keep distinct files."""
    if re.fullmatch(r"[A-Za-z0-9._-]{1,128}", conversation_id) and conversation_id not in (".", ".."):
        return conversation_id
    digest = hashlib.sha256(conversation_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return re.sub(r"[^A-Za-z0-9._-]", "_", conversation_id)[:100] + "-" + digest


def session_capacity(config: ServerConfig, n_ctx: int, n_seq_max: int) -> int:
    """Live sessions that fit in the engine's cells and sequences at their worst moment."""
    from ..compaction.policy import reserve_cells
    policy = policy_for(config)
    cells = config.window + reserve_cells(policy, config.window, probe_tokens=PROBE_PROMPT_TOKENS,
                                          summarizer_tokens=SUMMARIZER_PROMPT_TOKENS)
    by_cells = n_ctx // cells
    if by_cells < 1:
        raise ValueError(f"--window {config.window} needs {cells} KV cells with its forks; --n-ctx {n_ctx} "
                         f"is too small (use a larger --n-ctx or a smaller --window)")
    cap = min(by_cells, max(1, n_seq_max // SEQUENCES_PER_SESSION))
    return min(cap, config.max_sessions) if config.max_sessions else cap


def check_sessions(config: ServerConfig, make_session) -> None:
    """Open (and close) one throwaway session, so that a window the policy cannot work in stops the server
    at startup with one line instead of refusing every chat later."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="pykvcompact-startup-") as tmp:
        try:
            make_session("startup-check", None, tmp).close()
        except ValueError as exc:
            raise ValueError(f"--mode {config.mode} --window {config.window}: no session can be opened: {exc}") \
                from None


def build(config: ServerConfig, engine=None):
    """``(app, engine, registry)``; an ``engine`` passed in is used (and not closed by the server)."""
    from ..engine import Engine
    from ..session.session import Session
    from .app import create_app

    policy_for(config)  # a bad mode/rubric fails before the model loads
    own = engine is None
    if engine is None:
        n_seq_max = min(256, SEQUENCES_PER_SESSION * max(1, config.max_sessions or 16))
        engine = Engine(config.model, n_ctx=config.n_ctx, n_seq_max=n_seq_max, n_threads=config.n_threads)

    def make_session(conversation_id: str, system: Optional[str], history_dir: str = config.history_dir):
        return Session(engine, system=system, policy=policy_for(config), session_id=session_id_for(conversation_id),
                       history_dir=history_dir)

    try:
        capacity = session_capacity(config, engine.n_ctx, engine.n_seq_max)
        check_sessions(config, make_session)
    except BaseException:
        if own:
            engine.close()
        raise

    registry = SessionRegistry(make_session, capacity, offload_dir=os.path.join(config.history_dir, "offloaded"),
                               load_session=lambda path: Session.load(engine, path))
    return create_app(engine, registry, config), engine, registry


def serve(config: ServerConfig, log_level: str = "info") -> None:
    """Run until interrupted (``pykvcompact serve``)."""
    import uvicorn

    app, engine, registry = build(config)
    try:
        uvicorn.run(app, host=config.host, port=config.port, log_level=log_level)
    finally:
        registry.close_all()
        engine.close()


class ServerThread:
    """The server on a loopback port in a background thread: ``with ServerThread(config, engine) as s:``
    then ``s.base_url``. Port 0 picks a free port."""

    def __init__(self, config: ServerConfig, engine=None, startup_timeout: float = 60.0):
        import uvicorn

        self.app, self.engine, self.registry = build(config, engine)
        self._own_engine = engine is None
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only when the listening
        # socket's proto says TCP; without it every response waits ~40 ms for the client's delayed ACK
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((config.host, config.port))
        self.host, self.port = self._sock.getsockname()[:2]
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="pykvcompact-server", daemon=True)
        self._startup_timeout = startup_timeout

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> "ServerThread":
        self._thread.start()
        done = threading.Event()
        for _ in range(int(self._startup_timeout / 0.05)):
            if self._server.started or not self._thread.is_alive():
                break
            done.wait(0.05)
        if not self._server.started:
            self.stop()
            raise RuntimeError("the server did not start")
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self.registry.close_all()
        self._sock.close()
        if self._own_engine:
            self.engine.close()

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
