"""Shared test helpers: a real server in a thread, and polling with deadlines."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import httpx
import uvicorn

from consumer_sdk import Client
from cproxy.api.app import create_app
from cproxy.api.lean_http import protocol_for
from cproxy.config import Settings
from tests.openapi_check import Recorder

T = TypeVar("T")

#: Servers started by the current test (the OpenAPI check empties it after each test).
RUNNING: list[RunningServer] = []


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float = 10.0,
    interval_s: float = 0.01,
    message: str = "condition",
) -> T:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {message}")
        time.sleep(interval_s)


class RunningServer:
    """A real cproxy server (uvicorn, SQLite store) on a free loopback port, in a thread."""

    def __init__(self, settings: Settings, *, lean_http: bool = True) -> None:
        """``lean_http=False``: every call through ASGI (uvicorn's own httptools protocol);
        else as ``cproxy serve`` chooses (``CPROXY_LEAN_HTTP=0``: through ASGI too)."""
        self.settings = settings
        self.data_dir = settings.data_dir
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", settings.port))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(settings)
        #: Every response, for the OpenAPI check after each test (tests/openapi_check.py).
        self.recorder = Recorder(self.app)
        RUNNING.append(self)
        config = uvicorn.Config(
            self.recorder,
            # As ``cproxy serve`` does: the endpoints answered by the lean protocol.
            http=protocol_for(self.app, observe=self.recorder.observe)
            if lean_http
            else "httptools",
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()
        wait_until(
            lambda: self._server.started or not self._thread.is_alive(), 20, message="server start"
        )
        if not self._server.started:
            raise RuntimeError("server failed to start")

    def client(self, **kwargs: Any) -> httpx.Client:
        """A raw HTTP client, for tests that check the wire (or send malformed input)."""
        return httpx.Client(base_url=self.url, timeout=kwargs.pop("timeout", 40), **kwargs)

    def sdk(self, token: str | None = None) -> Client:
        """The SDK client for this server: what tests should use for ordinary calls."""
        return Client(self.url, token=token, timeout_ms=40_000)

    def connections(self) -> list[Any]:
        """The HTTP protocol instances of the open connections (uvicorn's)."""
        return list(self._server.server_state.connections)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Graceful stop (like SIGTERM): progress is persisted."""
        if self._thread.is_alive():
            self.app.state.broker.begin_shutdown()
            self._server.should_exit = True
            self._thread.join(30)
        self._sock.close()


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    return replace(Settings(), host="127.0.0.1", port=0, data_dir=data_dir, **overrides)
