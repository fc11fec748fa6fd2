"""The uvicorn hook (``cproxy.api.lean_http``), on raw sockets: uvicorn's connection handling
kept (keep-alive, pipelining, ``Expect: 100-continue``, HTTP/1.0, chunked bodies), and its
start-up self-check falling back to uvicorn's own protocol. (What every route answers is the
same either way by construction, one request path; the suite runs both ways: .ci/run.)"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import replace

import orjson
import pytest

from cproxy.api import lean_http
from cproxy.api.lean_http import LeanCycle, LeanHttpProtocol
from cproxy.config import Limits
from cproxy.tokens import Token
from tests.conftest import ServerFactory
from tests.support import RunningServer, wait_until

ADMIN, PRODUCER, CONSUMER = "admin-secret", "producer-secret", "consumer-secret"
TOKENS = (
    Token(ADMIN, "admin"),
    Token(PRODUCER, "producer", topics=frozenset({"t"})),
    Token(CONSUMER, "consumer", topics=frozenset({"t"}), groups=frozenset({"g"})),
)


def request(path: str, body: bytes, *headers: str, version: str = "1.1") -> bytes:
    lines = [f"POST {path} HTTP/{version}", "Host: x", *headers]
    if not any(h.lower().startswith(("content-length", "transfer-encoding")) for h in headers):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def json_request(path: str, payload: object, *headers: str, version: str = "1.1") -> bytes:
    return request(
        path, orjson.dumps(payload), "Content-Type: application/json", *headers, version=version
    )


class Conn:
    """One client connection; reads answers one at a time (status, headers, body)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.settimeout(10)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        assert chunk, "the server closed the connection"
        self.buffer += chunk

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers["content-length"])
        while len(self.buffer) < length:
            self._fill()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split()[1]), headers, body

    def closed(self) -> bool:
        """True once the server closed its side (nothing more to read)."""
        try:
            return self.sock.recv(1) == b""
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


LEAN_OFF = os.environ.get("CPROXY_LEAN_HTTP") == "0"


def test_the_hook_is_on_unless_turned_off_and_falls_back_when_uvicorn_differs(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert lean_http.incompatibility() is None  # the installed uvicorn is the tested one
    chosen = lean_http.protocol_for(server.app)
    if LEAN_OFF:
        assert chosen == "auto"
    else:
        assert isinstance(chosen, type) and issubclass(chosen, LeanHttpProtocol)
    # A uvicorn whose protocol reads a cycle attribute LeanCycle lacks: one WARNING, and
    # uvicorn's own protocol.
    monkeypatch.delenv("CPROXY_LEAN_HTTP", raising=False)
    monkeypatch.setattr(lean_http, "_CYCLE_USE", lean_http._CYCLE_USE - {"more_body"})
    caplog.set_level(logging.INFO, logger="cproxy.api.lean_http")
    assert lean_http.protocol_for(server.app) == "auto"
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and "more_body" in record.getMessage()
    monkeypatch.setenv("CPROXY_LEAN_HTTP", "0")
    monkeypatch.setattr(lean_http, "_CYCLE_USE", lean_http._CYCLE_USE | {"more_body"})
    assert lean_http.protocol_for(server.app) == "auto"


def test_pipelined_calls_are_answered_in_order_and_other_routes_share_the_connection(
    server: RunningServer,
) -> None:
    with server.sdk() as sdk:
        sdk.create_topic("t", 2)
        sdk.put_group("g", {"topics": {"t": {"order_by": "key"}}})
    conn = Conn(server.port)
    messages = [{"key": f"k{i}", "body": {"i": i}} for i in range(5)]
    get_topic = b"GET /v1/topics/t HTTP/1.1\r\nHost: x\r\n\r\n"
    conn.send(
        json_request("/v1/topics/t/messages", {"messages": messages})
        + get_topic
        + json_request("/v1/groups/g/pull", {"max_messages": 10, "wait_ms": 2000})
    )
    status, _, body = conn.answer()
    assert status == 200 and len(orjson.loads(body)["results"]) == 5
    status, _, body = conn.answer()
    assert status == 200 and orjson.loads(body)["name"] == "t"
    status, _, body = conn.answer()
    assert status == 200
    assert sorted(m["body"]["i"] for m in orjson.loads(body)["messages"]) == [0, 1, 2, 3, 4]
    # Served below ASGI: the connection's last cycle (the pull) is the lean protocol's.
    (protocol,) = server.connections()
    if not LEAN_OFF:
        assert isinstance(protocol, LeanHttpProtocol) and isinstance(protocol.cycle, LeanCycle)
    conn.close()


def test_expect_100_continue_is_answered_before_the_body_is_sent(server: RunningServer) -> None:
    with server.sdk() as sdk:
        sdk.create_topic("t", 1)
    body = orjson.dumps({"messages": [{"key": "k", "body": "x" * 2000}]})
    head = request(
        "/v1/topics/t/messages",
        b"",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Expect: 100-continue",
    )
    conn = Conn(server.port)
    conn.send(head)
    while b"\r\n\r\n" not in conn.buffer:
        conn._fill()
    interim, _, conn.buffer = conn.buffer.partition(b"\r\n\r\n")
    assert interim == b"HTTP/1.1 100 Continue"
    conn.send(body)
    status, _, answer = conn.answer()
    assert status == 200 and orjson.loads(answer)["results"][0]["offset"] == 0
    conn.close()


def test_http_1_0_gets_connection_close_and_the_connection_ends(server: RunningServer) -> None:
    with server.sdk() as sdk:
        sdk.create_topic("t", 1)
    conn = Conn(server.port)
    conn.send(json_request("/v1/topics/t/messages", {"messages": [{"body": 1}]}, version="1.0"))
    status, headers, _ = conn.answer()
    assert status == 200 and headers["connection"] == "close"
    assert wait_until(conn.closed, 5, message="the server closing the connection")
    conn.close()


def test_a_body_over_the_limit_in_chunks_is_refused(server_factory: ServerFactory) -> None:
    running = server_factory(limits=replace(Limits(), max_request_bytes=200_000))
    with running.sdk() as sdk:
        sdk.create_topic("t", 1)
    limit = running.settings.limits.max_request_bytes
    chunk = b"x" * 65536
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(limit // len(chunk) + 2))
    conn = Conn(running.port)
    conn.send(
        request(
            "/v1/topics/t/messages",
            b"",
            "Content-Type: application/json",
            "Transfer-Encoding: chunked",
        )
    )
    conn.sock.sendall(chunks + b"0\r\n\r\n")
    status, _, body = conn.answer()
    assert status == 413 and orjson.loads(body)["error"]["code"] == "too_large"
    conn.close()
