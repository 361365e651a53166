"""A small HTTP client for the OpenAI-compatible API: JSON requests and server-sent-event streams.

It uses ``httpx`` when it is installed (a pooled client, shared by the threads of background jobs) and
``urllib`` otherwise (a connection per request); both raise the errors of :mod:`.errors`, which name the
URL and, for an HTTP error, the status and the body.  A stream can be closed from another thread
(``close()``): that is how a background job is cancelled.
"""
from __future__ import annotations

import json
import socket
import sys
import threading
from typing import Callable, Iterator, Optional

from .errors import (RemoteConnectionError, RemoteDisconnectedError, RemoteHTTPError, RemoteProtocolError,
                     RemoteTimeoutError)

ALIVE_CHECK_TIMEOUT = 3.0   # seconds for the check that follows a connection lost mid-response



def _httpx():
    """The httpx module, or None when it is not installed (imported on first use, not with the package)."""
    try:
        import httpx
        return httpx
    except ImportError:  # pragma: no cover - depends on the environment
        return None


def server_root(base_url: str) -> str:
    """``http://host:port`` from ``http://host:port`` or ``http://host:port/v1`` (OpenAI clients' form)."""
    u = base_url.rstrip("/")
    return u[:-3] if u.endswith("/v1") else u


class Stream:
    """An open server-sent-event stream: iterate for the ``data:`` payloads (parsed JSON; ``[DONE]`` ends
    it); ``close()`` from any thread aborts the request."""

    def __init__(self, url: str, lines: Iterator[bytes], closer, timeout: Optional[float],
                 answers: Optional[Callable[[], bool]] = None):
        self.url, self._lines, self._closer, self.timeout = url, lines, closer, timeout
        self._answers = answers
        self.closed = False
        self._lock = threading.Lock()

    def __iter__(self):
        try:
            for raw in self._lines:
                if self.closed:
                    return
                line = raw.decode("utf-8", errors="replace").strip() if isinstance(raw, bytes) else raw.strip()
                if not line.startswith("data:"):
                    continue  # comments (pings), event names, blank separators
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                try:
                    yield json.loads(data)
                except ValueError:
                    raise RemoteProtocolError(f"{self.url} sent an event that is not JSON: {data[:200]!r}",
                                              url=self.url) from None
        except (socket.timeout, TimeoutError) as e:
            if self.closed:
                return
            raise RemoteTimeoutError(self.url, self.timeout, "next chunk of the stream") from e
        except Exception as e:  # noqa: BLE001 - the transport's own errors, mapped below
            if self.closed:
                return  # closed from another thread: the read fails, that is the cancel
            raise _map_error(e, self.url, self.timeout, self._answers) from e
        finally:
            self.close()

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        try:
            self._closer()
        except Exception:  # noqa: BLE001 - closing a dead connection
            pass


def _lost_mid_response(e: BaseException) -> bool:
    """The connection was open and the request sent, then the server closed it before the answer was
    complete (a crash, a killed worker): not a server that could not be reached."""
    import http.client

    httpx = sys.modules.get("httpx")
    if httpx is not None and isinstance(e, (httpx.RemoteProtocolError, httpx.ReadError)):
        return True
    reason = getattr(e, "reason", None)
    return isinstance(e, (http.client.RemoteDisconnected, http.client.IncompleteRead, ConnectionResetError,
                          BrokenPipeError)) or isinstance(reason, (http.client.RemoteDisconnected, ConnectionResetError))


def _map_error(e: BaseException, url: str, timeout: Optional[float],
               answers: Optional[Callable[[], bool]] = None) -> BaseException:
    """The transport's exception ``e`` as one of ours.  ``answers``: checks whether the server still answers,
    asked when the connection was lost mid-response, so the message can say the server may have crashed."""
    if isinstance(e, (RemoteConnectionError, RemoteHTTPError, RemoteTimeoutError, RemoteProtocolError)):
        return e
    if answers is not None and _lost_mid_response(e):
        try:
            alive = bool(answers())
        except Exception:  # noqa: BLE001 - the check itself failed: the server does not answer
            alive = False
        return RemoteDisconnectedError(url, f"{type(e).__name__}: {e}", alive)
    httpx = sys.modules.get("httpx")
    if httpx is not None:
        if isinstance(e, httpx.TimeoutException):
            return RemoteTimeoutError(url, timeout)
        if isinstance(e, (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError,
                          httpx.NetworkError)):
            return RemoteConnectionError(url, f"{type(e).__name__}: {e}")
    if isinstance(e, (socket.timeout, TimeoutError)):
        return RemoteTimeoutError(url, timeout)
    if isinstance(e, OSError):
        reason = getattr(e, "reason", None) or e
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return RemoteTimeoutError(url, timeout)
        return RemoteConnectionError(url, f"{type(reason).__name__}: {reason}")
    return RemoteConnectionError(url, f"{type(e).__name__}: {e}")


class HttpClient:
    """``post(path, body)`` and ``get(path)`` return parsed JSON; ``stream(path, body)`` an open
    :class:`Stream`.  ``timeout``: seconds for an answer (for a stream: for each next chunk, so a long
    prefill before the first token must fit in it); ``connect_timeout``: for the connection."""

    def __init__(self, base_url: str, api_key: Optional[str] = None, *, timeout: float = 120.0,
                 connect_timeout: float = 5.0, use_httpx: Optional[bool] = None):
        self.root = server_root(base_url)
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        httpx = _httpx() if use_httpx is not False else None
        self.backend = "httpx" if httpx is not None else "urllib"
        self._hx = httpx
        self._client = None
        if httpx is not None:
            self._client = httpx.Client(headers=self.headers, timeout=httpx.Timeout(timeout, connect=connect_timeout),
                                        limits=httpx.Limits(max_connections=32, max_keepalive_connections=8))

    def url(self, path: str) -> str:
        return self.root + path

    def answers(self, timeout: float = ALIVE_CHECK_TIMEOUT) -> bool:
        """Does the server answer at all (any HTTP status counts)?  A fresh connection, outside the pool,
        so a broken pooled connection cannot make a live server look dead."""
        import urllib.error
        import urllib.request

        req = urllib.request.Request(self.url("/v1/models"), headers=self.headers, method="GET")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - the user's server URL
                resp.read(1)
            return True
        except urllib.error.HTTPError:
            return True
        except Exception:  # noqa: BLE001 - refused, reset, timed out: it does not answer
            return False

    # ------------------------------------------------------------------ requests
    def post(self, path: str, body: dict, timeout: Optional[float] = None) -> dict:
        return self._json("POST", path, body, timeout)

    def get(self, path: str, timeout: Optional[float] = None) -> dict:
        return self._json("GET", path, None, timeout)

    def _json(self, method: str, path: str, body: Optional[dict], timeout: Optional[float]) -> dict:
        url, t = self.url(path), self.timeout if timeout is None else timeout
        if self._client is not None:
            try:
                r = self._client.request(method, url, json=body, timeout=self._hx.Timeout(t, connect=self.connect_timeout))
            except Exception as e:  # noqa: BLE001
                raise _map_error(e, url, t, self.answers) from e
            if r.status_code >= 400:
                raise RemoteHTTPError(url, r.status_code, r.text)
            text = r.text
        else:
            resp = self._urlopen(method, url, body, t)
            try:
                text = resp.read().decode("utf-8", errors="replace")
            except Exception as e:  # noqa: BLE001
                raise _map_error(e, url, t, self.answers) from e
            finally:
                resp.close()
        try:
            return json.loads(text)
        except ValueError:
            raise RemoteProtocolError(f"{url} answered with something that is not JSON: {text[:200]!r}", url=url) from None

    def stream(self, path: str, body: dict, timeout: Optional[float] = None) -> Stream:
        url, t = self.url(path), self.timeout if timeout is None else timeout
        if self._client is not None:
            req = self._client.build_request("POST", url, json=body, timeout=self._hx.Timeout(t, connect=self.connect_timeout))
            try:
                r = self._client.send(req, stream=True)
            except Exception as e:  # noqa: BLE001
                raise _map_error(e, url, t, self.answers) from e
            if r.status_code >= 400:
                try:
                    text = r.read().decode("utf-8", errors="replace")
                finally:
                    r.close()
                raise RemoteHTTPError(url, r.status_code, text)
            return Stream(url, r.iter_lines(), r.close, t, self.answers)
        resp = self._urlopen("POST", url, body, t)
        return Stream(url, iter(resp.readline, b""), resp.close, t, self.answers)

    def _urlopen(self, method: str, url: str, body: Optional[dict], timeout: float):
        import urllib.error
        import urllib.request
        data = json.dumps(body).encode("utf-8") if body is not None else None
        req = urllib.request.Request(url, data=data, headers=self.headers, method=method)
        try:
            return urllib.request.urlopen(req, timeout=timeout)  # noqa: S310 - the user's server URL
        except urllib.error.HTTPError as e:
            try:
                text = e.read().decode("utf-8", errors="replace")
            except Exception:  # noqa: BLE001
                text = ""
            raise RemoteHTTPError(url, e.code, text) from None
        except Exception as e:  # noqa: BLE001
            raise _map_error(e, url, timeout, self.answers) from e

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001
                pass


__all__ = ["HttpClient", "Stream", "server_root"]
