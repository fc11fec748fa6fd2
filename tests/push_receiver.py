"""A push endpoint for tests and benchmarks: a tiny ASGI app under uvicorn on a loopback port.

The test decides what each request gets with ``decide(messages, headers) -> Reply``: a status
code (optionally with a delay before answering), or ``STALL``: the request is held unanswered
until ``unstall()``, or until the receiver stops and drops it. Every request is recorded
(``requests``); ``overlaps`` counts requests that arrived while another request for the same
key was still open (per-key order would be broken). The receiver can be stopped (the endpoint
goes away: connections are refused) and started again on the same port.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import orjson
import uvicorn

from tests.support import wait_until

STALL = -1
#: A status, or (status, seconds to wait before answering), or ``STALL``.
Reply = int | tuple[int, float]
Decide = Callable[[list[dict[str, Any]], dict[str, str]], Reply]


def always_ok(messages: list[dict[str, Any]], headers: dict[str, str]) -> int:
    return 200


@dataclass
class Request:
    """One request as the receiver saw it."""

    at: float  # time.monotonic() on arrival
    messages: list[dict[str, Any]]
    headers: dict[str, str]
    body: bytes
    status: int = 0  # what it answered; 0 while open or when it never answered
    answered_at: float = 0.0


@dataclass
class Receiver:
    decide: Decide = always_ok
    port: int = 0
    requests: list[Request] = field(default_factory=list)
    overlaps: int = 0
    max_open: int = 0
    #: False: keep no ``requests`` (benchmarks: ``decide`` counts what it needs).
    record: bool = True

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._open_keys: dict[str | None, int] = {}
        self._open = 0
        self._unstall = threading.Event()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/push"

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> Receiver:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        self._sock = sock
        self._unstall.clear()
        config = uvicorn.Config(
            self._app,
            log_config=None,
            access_log=False,
            lifespan="off",
            interface="asgi3",
            timeout_graceful_shutdown=1,
            backlog=2048,
        )
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        wait_until(lambda: server.started, 20, message="receiver start")
        return self

    def stop(self) -> None:
        """Go away: open requests are dropped unanswered, new connections are refused."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(10)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None

    def unstall(self) -> None:
        self._unstall.set()

    # -- views -----------------------------------------------------------------------------
    def answered(self, status: int = 200) -> list[Request]:
        return [r for r in list(self.requests) if r.status == status]

    def acked_messages(self) -> list[dict[str, Any]]:
        """Messages of requests answered 2xx, in answer order."""
        done = sorted((r for r in list(self.requests) if 200 <= r.status < 300), key=_answered)
        return [m for r in done for m in r.messages]

    # -- the app ---------------------------------------------------------------------------
    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            event = await receive()
            chunks.append(event.get("body", b""))
            if not event.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            messages = orjson.loads(body)["messages"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return  # the sender went away mid-request (killed): nothing to record
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        request = Request(time.monotonic(), messages, headers, body)
        keys = {m["key"] for m in messages}
        with self._lock:
            if self.record:
                self.requests.append(request)
            for key in keys:
                if self._open_keys.get(key, 0):
                    self.overlaps += 1
                self._open_keys[key] = self._open_keys.get(key, 0) + 1
            self._open += 1
            self.max_open = max(self.max_open, self._open)
        reply = self.decide(messages, headers)
        status, delay_s = reply if isinstance(reply, tuple) else (reply, 0.0)
        if delay_s > 0:
            await anyio.sleep(delay_s)
        with self._lock:  # closed before answering: the proxy may send the next one at once
            for key in keys:
                self._open_keys[key] -= 1
            self._open -= 1
        if status == STALL:
            # Never answered: the proxy times out, or the connection drops with the server.
            while not self._unstall.is_set():
                await anyio.sleep(0.02)
            return
        request.status = status
        request.answered_at = time.monotonic()
        # A redirect names the receiver itself: followed, it would arrive here once more.
        headers = [(b"location", self.url.encode())] if 300 <= status < 400 else []
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


def _answered(r: Request) -> float:
    return r.answered_at
