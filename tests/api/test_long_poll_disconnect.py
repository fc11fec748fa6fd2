"""A long poll whose client disconnects leaves the group's line at once (real server)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.support import RunningServer, make_settings, wait_until


@pytest.fixture(params=[True, False], ids=["lean-protocol", "asgi"])
def any_path_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningServer]:
    """Hot calls answered below ASGI (the protocol sees the connection lost), or through
    ASGI (a task waits for ``http.disconnect``)."""
    running = RunningServer(make_settings(tmp_path), lean_http=request.param)
    yield running
    running.stop()


def _send_pull(server: RunningServer, wait_ms: int) -> socket.socket:
    body = orjson.dumps({"max_messages": 10, "wait_ms": wait_ms})
    sock = socket.create_connection(("127.0.0.1", server.port))
    head = (
        f"POST /v1/groups/g/pull HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    return sock


def _answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """The status line and headers, and the body (read to its Content-Length)."""
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "connection closed without an answer"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-answer"
        body += chunk
    return head, body


def test_a_disconnected_long_poll_leaves_the_line_and_takes_no_message(
    any_path_server: RunningServer,
) -> None:
    server = any_path_server
    with server.client() as client:
        assert client.post("/v1/topics", json={"name": "t", "queues": 2}).status_code == 201
        group = {"topics": {"t": {"order_by": "key"}}}
        assert client.put("/v1/groups/g", json=group).status_code == 200
        runner = server.app.state.broker.groups["g"]
        gone = _send_pull(server, 30_000)
        wait_until(lambda: runner.waiting_pulls == 1, message="the pull waits")
        gone.close()
        wait_until(lambda: runner.waiting_pulls == 0, 5, message="the gone pull leaves")
        stays = _send_pull(server, 30_000)
        try:
            wait_until(lambda: runner.waiting_pulls == 1, message="the second pull waits")
            produced = client.post("/v1/topics/t/messages", json={"messages": [{"key": "a"}]})
            assert produced.status_code == 200
            head, body = _answer(stays)
        finally:
            stays.close()
        assert head.startswith(b"HTTP/1.1 200")
        messages = orjson.loads(body)["messages"]
        assert [(m["key"], m["attempt"]) for m in messages] == [("a", 1)]
