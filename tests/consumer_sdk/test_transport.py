"""The default transport of ``AsyncClient`` (its HTTP/1.1 pool, no ``transport=``), against
real servers: a small ASGI app under uvicorn on a free loopback port, and raw asyncio servers for
the misbehaviours uvicorn never shows (resetting connections, closing a reused connection
without an answer, a server restarted mid-call). Failures are the SDK's errors."""

from __future__ import annotations

import asyncio
import base64
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn

from consumer_sdk import AsyncClient, ConnectError, RequestTimeout, Throttled, TransportError
from consumer_sdk.config import NO_RETRY, RetryPolicy
from tests.consumer_sdk.serve_proc import ServeProcess, free_port
from tests.support import wait_until

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]


class App:
    """Answers by path; records the client port of every request (one port: one connection)."""

    def __init__(self) -> None:
        self.ports: list[int] = []
        self.open = 0
        self.most_open = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        self.ports.append(scope["client"][1])
        body = b""
        while True:
            event = await receive()
            body += event.get("body", b"")
            if not event.get("more_body"):
                break
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            await self._answer(scope, body, send)
        finally:
            self.open -= 1

    async def _answer(self, scope: Scope, body: bytes, send: Send) -> None:
        path = scope["path"]
        json = [(b"content-type", b"application/json")]
        if path == "/healthz":
            await _whole(send, 200, b'{"status":"ok"}', json)
        elif path == "/v1/groups/g/dead-letters":  # no content-length, in pieces: chunked
            await send({"type": "http.response.start", "status": 200, "headers": json})
            query = scope["query_string"]
            for piece in (b'{"dead_letters": [{"q": "', query, b'", "pad": "', b"x" * 70_000):
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b'"}]}'})
        elif path == "/readyz":  # slow
            await asyncio.sleep(1.0)
            await _whole(send, 200, b"{}", json)
        elif path == "/v1/groups/g/dead-letters/redrive":
            await _whole(send, 200, b'{"redriven": 1}', json)
        elif path == "/v1/topics" and scope["method"] == "POST":  # echoes the body's name
            name = orjson.loads(body)["name"]
            await _whole(send, 200, orjson.dumps({"name": name, "queues": 1}), json)
        else:
            error = b'{"error": {"code": "slow_down", "message": "later"}}'
            await _whole(send, 429, error, [*json, (b"retry-after", b"2")])


async def _whole(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.fixture
def served() -> Iterator[tuple[str, App]]:
    """The app under uvicorn (idle connections closed after 0.3 s); its URL and the app."""
    app = App()
    sock = _free_socket()
    config = uvicorn.Config(
        app, log_config=None, access_log=False, lifespan="off", timeout_keep_alive=0.3
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 20, message="app start")
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", app
    server.should_exit = True
    thread.join(10)
    sock.close()


async def test_keep_alive_connection_is_reused(served: tuple[str, App]) -> None:
    url, app = served
    async with AsyncClient(url) as client:
        for _ in range(5):
            assert await client.health() == {"status": "ok"}
        assert (await client.create_topic("t-ü", 1)).name == "t-ü"
    assert len(app.ports) == 6
    assert len(set(app.ports)) == 1


async def test_connection_closed_by_the_server_while_idle_is_replaced(
    served: tuple[str, App],
) -> None:
    url, app = served
    async with AsyncClient(url, retry=NO_RETRY) as client:
        await client.health()
        await asyncio.sleep(0.8)  # past the server's keep-alive timeout: it closed the connection
        assert await client.redrive("g") == 1  # not idempotent: never replayed, so not needed
    assert len(set(app.ports)) == 2


async def test_a_close_the_blocked_loop_did_not_read_is_seen_before_sending(
    served: tuple[str, App],
) -> None:
    """The server closed the idle connection while the program blocked the event loop: the
    close sits unread, yet a call that may not be repeated still goes out on a new one."""
    url, app = served
    async with AsyncClient(url, retry=NO_RETRY) as client:
        await client.health()
        time.sleep(0.8)  # noqa: ASYNC251 - the scenario: a blocked loop past keep-alive (0.3 s)
        assert await client.redrive("g") == 1
    assert len(set(app.ports)) == 2


def test_pool_runs_on_uvloop(served: tuple[str, App]) -> None:
    """The benchmarks' load generators run on uvloop, whose transports differ."""
    uvloop = pytest.importorskip("uvloop")
    url, app = served

    async def calls() -> list[Any]:
        async with AsyncClient(url) as client:
            return [await client.health() for _ in range(3)]

    assert uvloop.run(calls()) == [{"status": "ok"}] * 3
    assert len(set(app.ports)) == 1


async def test_chunked_answer_is_read_whole(served: tuple[str, App]) -> None:
    url, _ = served
    async with AsyncClient(url) as client:
        (answer,) = await client.dead_letters("g", topic="a b", limit=3)
    assert answer["q"] == "topic=a+b&limit=3"
    assert len(answer["pad"]) == 70_000


async def test_timeout_bounds_the_whole_call_and_the_pool_recovers(
    served: tuple[str, App],
) -> None:
    url, _ = served
    async with AsyncClient(url, timeout_ms=200) as client:
        with pytest.raises(RequestTimeout, match=r"GET http://.*/readyz: no answer in time"):
            await client.ready()
        assert await client.health() == {"status": "ok"}


async def test_api_error_keeps_status_code_and_retry_after(served: tuple[str, App]) -> None:
    url, _ = served
    async with AsyncClient(url, retry=NO_RETRY) as client:
        with pytest.raises(Throttled) as caught:
            await client.get_topic("anything")
    assert (caught.value.status, caught.value.code, caught.value.message) == (
        429,
        "slow_down",
        "later",
    )
    assert caught.value.retry_after_ms == 2000


async def test_max_connections_bounds_concurrent_connections(served: tuple[str, App]) -> None:
    url, app = served
    async with AsyncClient(url, max_connections=2) as client:
        await asyncio.gather(*(client.ready() for _ in range(4)))
    assert app.most_open == 2
    assert len(set(app.ports)) == 2


async def test_refused_connection_is_connect_error() -> None:
    sock = _free_socket()
    port = sock.getsockname()[1]
    sock.close()  # bound, never listening: refused
    async with AsyncClient(f"http://127.0.0.1:{port}", retry=NO_RETRY) as client:
        with pytest.raises(ConnectError, match=r"GET http://.*/healthz: cannot connect"):
            await client.health()


class ClosesSecondRequest:
    """A raw server that answers the first request on each connection (keep-alive), then
    closes the connection when the next request arrives, without answering it."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        body = b'{"status":"ok"}'
        answer = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        try:
            for n in range(2):
                head = await reader.readuntil(b"\r\n\r\n")
                length = [
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ]
                await reader.readexactly(length[0] if length else 0)
                self.requests += 1
                if n == 0:
                    writer.write(answer)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


async def test_reused_connection_closed_before_any_answer_byte_is_replayed_once() -> None:
    raw = ClosesSecondRequest()
    server = await asyncio.start_server(raw.handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server, AsyncClient(url, retry=NO_RETRY) as client:
        await client.health()
        # Idempotent: sent again on a fresh connection, which answers.
        assert await client.health() == {"status": "ok"}
        assert (raw.connections, raw.requests) == (2, 3)
        # Not idempotent: it may have been applied, so it fails.
        with pytest.raises(TransportError, match="server disconnected without sending"):
            await client.redrive("g")
        assert (raw.connections, raw.requests) == (2, 4)


def test_a_transport_or_a_proxy_variable_sends_through_httpx(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from consumer_sdk._http11 import Http11Pool, HttpxSender, proxied

    mock = httpx.MockTransport(lambda request: httpx.Response(200, json={}))
    assert isinstance(AsyncClient("http://localhost:8080", transport=mock)._http, HttpxSender)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "localhost")
    assert proxied("http://cproxy.internal:8080")
    assert not proxied("http://localhost:8080")
    assert not proxied("https://cproxy.internal:8443")  # no HTTPS_PROXY
    assert isinstance(AsyncClient("http://cproxy.internal:8080")._http, HttpxSender)
    assert isinstance(AsyncClient("http://localhost:8080")._http, Http11Pool)


async def test_timeout_means_the_whole_call_through_httpx_too() -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200, json={})

    transport = httpx.MockTransport(slow)
    async with AsyncClient("http://x", timeout_ms=200, retry=NO_RETRY, transport=transport) as c:
        started = time.monotonic()
        with pytest.raises(RequestTimeout):
            await c.get_topic("t")
        assert time.monotonic() - started < 2


async def test_credentials_in_the_url_are_sent_as_basic_auth() -> None:
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        body = b'{"status":"ok"}'
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, AsyncClient(f"http://ann:s%40cret@127.0.0.1:{port}") as client:
        assert await client.health() == {"status": "ok"}
    head = seen[0].decode().lower()
    assert head.startswith("get /healthz http/1.1")
    assert "authorization: basic " + base64.b64encode(b"ann:s@cret").decode().lower() in head


async def test_a_reset_connection_is_a_transport_error_and_an_idempotent_call_retries() -> None:
    calls = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal calls
        calls += 1
        await reader.readuntil(b"\r\n\r\n")
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST, no answer

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        async with AsyncClient(f"http://127.0.0.1:{port}", retry=NO_RETRY) as client:
            with pytest.raises(TransportError) as caught:
                await client.redrive("g")
            assert not isinstance(caught.value, ConnectError)
        policy = RetryPolicy(max_attempts=3, initial_backoff_ms=1, max_backoff_ms=1)
        async with AsyncClient(f"http://127.0.0.1:{port}", retry=policy) as client:
            calls = 0
            with pytest.raises(TransportError):
                await client.get_topic("t")  # idempotent: tried max_attempts times
            assert calls >= 3


def test_a_server_restarted_mid_call_is_survived(tmp_path: Path) -> None:
    """A real ``cproxy serve``, killed while a long poll waits and started again on the same
    port and data: the consumer's next calls reach the new server."""
    port = free_port()
    first = ServeProcess(tmp_path, port=port)
    try:

        async def main() -> None:
            async with AsyncClient(first.url, retry=NO_RETRY) as client:
                await client.create_topic("t", 1)
                await client.put_group("g", {"topics": {"t": {}}})
                waiting = asyncio.create_task(client.pull("g", wait_ms=5_000))
                await asyncio.sleep(0.3)  # the long poll is on the wire
                await asyncio.to_thread(first.stop)
                with pytest.raises(TransportError):
                    await waiting
                second = await asyncio.to_thread(ServeProcess, tmp_path, port=port)
                try:
                    sent = await client.produce("t", [{"body": 1, "id": "m1"}])
                    assert sent[0].offset == 0 or sent[0].duplicate
                    pulled = await client.pull("g", wait_ms=2_000)
                    assert [m.body for m in pulled.messages] == [1]
                finally:
                    await asyncio.to_thread(second.stop)

        asyncio.run(main())
    finally:
        first.stop()
