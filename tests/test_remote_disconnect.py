"""A RemoteEngine request whose connection the server closes before the answer is complete: the error says
so, and says whether the server still answers (a crash, or a worker that died), instead of "cannot reach
the server"."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import pykvcompact as pk
from pykvcompact.remote import RemoteConnectionError, RemoteDisconnectedError
from pykvcompact.remote.http import HttpClient


class CutServer:
    """Answers ``GET /v1/models``; answers ``POST /v1/completions`` with a Content-Length it does not keep:
    the connection is closed after the first bytes.  ``crash``: the server stops listening first (what a
    crashed process looks like to the client)."""

    def __init__(self, crash: bool):
        self.crash = crash
        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.srv.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/v1"
        threading.Thread(target=self.srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()

    def _handler(server):
        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                data = json.dumps({"data": [{"id": "stub"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if server.crash:
                    server.close()   # no one listens any more when the client checks
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "4000")
                self.end_headers()
                self.wfile.write(b'{"choices": [{"text": "par')
                self.wfile.flush()
                self.close_connection = True
        return H


@pytest.mark.parametrize("use_httpx", [True, False], ids=["httpx", "urllib"])
def test_a_crashed_server_is_named_as_such(use_httpx):
    srv = CutServer(crash=True)
    try:
        http = HttpClient(srv.url, use_httpx=use_httpx, timeout=5, connect_timeout=2)
        with pytest.raises(RemoteDisconnectedError) as ei:
            http.post("/v1/completions", {"prompt": "x", "max_tokens": 4})
        msg = str(ei.value)
        assert ei.value.alive is False
        assert "closed the connection" in msg and "may have crashed" in msg and "see its log" in msg
        assert "cannot reach" not in msg and srv.url.rsplit("/v1", 1)[0] in msg
        # still a connection error and an engine error: callers that catch those keep working
        assert isinstance(ei.value, RemoteConnectionError) and isinstance(ei.value, pk.EngineError)
    finally:
        srv.close()


@pytest.mark.parametrize("use_httpx", [True, False], ids=["httpx", "urllib"])
def test_a_server_that_still_answers_is_not_called_crashed(use_httpx):
    srv = CutServer(crash=False)
    try:
        http = HttpClient(srv.url, use_httpx=use_httpx, timeout=5, connect_timeout=2)
        with pytest.raises(RemoteDisconnectedError) as ei:
            http.post("/v1/completions", {"prompt": "x", "max_tokens": 4})
        assert ei.value.alive is True
        assert "still answers" in str(ei.value) and "may have crashed" not in str(ei.value)
        assert http.get("/v1/models")["data"][0]["id"] == "stub"   # the client is still usable
    finally:
        srv.close()


def test_a_server_that_never_answered_is_still_unreachable():
    srv = CutServer(crash=False)
    url = srv.url
    srv.close()
    http = HttpClient(url, timeout=5, connect_timeout=2)
    with pytest.raises(RemoteConnectionError) as ei:
        http.post("/v1/completions", {"prompt": "x"})
    assert not isinstance(ei.value, RemoteDisconnectedError) and "cannot reach the server" in str(ei.value)
