"""A lean keep-alive HTTP/1.1 connection pool: what :class:`~consumer_sdk.AsyncClient` sends
through when no HTTPX transport is given (and no proxy variable applies).

Why: in the load generator HTTPX and httpcore (request models, URL merging, the connection
pool's bookkeeping, h11 events, anyio checkpoints) took about half of the client's CPU per
message (old journal, issue 13). The client needs far less: one origin, a few fixed
headers, bodies that are already bytes and answers read whole. So this is an asyncio
``Protocol`` per connection that parses with ``httptools`` (llhttp; ~20x cheaper than h11 on a
pull answer), Content-Length and chunked answers alike.

Why not aiohttp's client (already a dependency, for push): measured with the SDK's producer
and consumer against one server (``python -m benchmarks.sdk_transport``, interleaved A/B), it
cost 1.25-1.36x this pool's client CPU per message at 50 messages per produce call (1.17x at
500): about 0.1 ms more per call, in its request objects, a task per request body and extra
event-loop passes. The target was 1.2x.

Portable: reuse checks a socket with ``select.select`` (sockets only, as on Windows). Failures
are the SDK's errors (:mod:`consumer_sdk.errors`), translated here, once, naming the call;
HTTPX's (the ``transport=`` path) are translated by ``BaseClient._translate``.
"""

from __future__ import annotations

import asyncio
import base64
import select
import socket
import ssl
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, cast
from urllib.parse import unquote, urlencode, urlsplit

import httptools
import httpx

from consumer_sdk._tls import certificate_error, certificate_failure
from consumer_sdk.errors import ClientError, ConnectError, RequestTimeout, TransportError

#: An idle connection older than this is closed rather than reused: under uvicorn's 5 s
#: keep-alive timeout, so a reuse does not race the server closing the connection.
KEEPALIVE_EXPIRY_S: Final = 4.0
_NO_RESPONSE: Final = "server disconnected without sending a response"
CLOSED: Final = "Cannot send a request, as the client has been closed."
#: Methods for which HTTPX sends ``content-length: 0`` when there is no body.
_BODY_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})


class _Broken(Exception):
    """The exchange failed on its connection: closed, reset, or a malformed answer."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole HTTP answer: what ``BaseClient._decode`` reads (as it does ``httpx.Response``)."""

    status_code: int
    reason_phrase: str
    #: Lower-case names; a repeated header's values joined with ", " (as ``httpx.Headers``).
    headers: dict[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one exchange at a time (the pool hands it to one caller)."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Answer] | None = None
        self._reason = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._headers_done = False
        #: Whether the current request went out, and how many bytes of its answer came.
        self.sent = False
        self.received = 0
        #: False once the peer closed, the connection failed, or an answer said not to reuse it.
        self.usable = True
        #: True once an exchange completed on it: a failure before any answer byte may then be
        #: the server having closed it while it sat idle.
        self.reused = False
        self.idle_since = 0.0

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not asyncio.Transport subclasses, hence no check).
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(_Broken(f"malformed answer: {exc}"))

    def eof_received(self) -> bool:
        self._fail(self._closed_early())
        return False  # let asyncio close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        self._fail(self._closed_early() if exc is None else _Broken(f"connection lost: {exc}"))

    # -- httptools callbacks -----------------------------------------------------------------
    def on_status(self, status: bytes) -> None:
        self._reason += status  # may arrive in pieces

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        seen = self._headers.get(key)
        self._headers[key] = text if seen is None else f"{seen}, {text}"

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        waiter = self._waiter
        if not self._parser.should_keep_alive():
            self.usable = False
        if waiter is None or waiter.done():
            self.usable = False  # an answer nobody asked for: the stream is out of step
            return
        content = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        answer = Answer(
            self._parser.get_status_code(),
            self._reason.decode("latin-1"),
            self._headers,
            content,
        )
        self._waiter = None
        waiter.set_result(answer)

    # -- the client side ---------------------------------------------------------------------
    async def exchange(self, data: bytes) -> Answer:
        """Send one request (head and body, already bytes) and wait for its whole answer."""
        transport = self._transport
        self.sent = False
        if transport is None or transport.is_closing() or not self.usable:
            self.usable = False
            raise _Broken(_NO_RESPONSE)
        self._reason, self._headers, self._body = b"", {}, []
        self._headers_done = False
        self.received = 0
        waiter: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        self.sent = True
        transport.write(data)
        try:
            return await waiter
        except BaseException:
            # Timeout, cancellation or a failure mid-answer: the rest of the answer may still
            # come, so the connection cannot carry another request.
            self.close()
            raise

    def readable(self) -> bool:
        """Whether the idle socket has bytes (or the EOF) the loop has not read yet.

        The peer's close may sit unread while the loop was busy or blocked (a server stopped
        from the same process, a long synchronous handler), so reuse checks the socket
        itself, as httpcore does.
        """
        sock = self._transport.get_extra_info("socket") if self._transport else None
        fd = sock.fileno() if sock is not None else -1
        if fd < 0:
            return True
        # select() rather than poll(): Windows has only select, for sockets.
        readable, _, _ = select.select([fd], [], [], 0)
        return bool(readable)

    def close(self) -> None:
        self.usable = False
        if self._transport is not None:
            self._transport.abort()

    def _closed_early(self) -> _Broken:
        self.usable = False
        if not self.received:
            return _Broken(_NO_RESPONSE)
        if self._headers_done and not self._framed():
            # No Content-Length, not chunked: the body runs to the end of the connection.
            self.on_message_complete()
        return _Broken(self._incomplete())

    def _framed(self) -> bool:
        return "content-length" in self._headers or "transfer-encoding" in self._headers

    def _incomplete(self) -> str:
        got = sum(len(b) for b in self._body)
        expected = self._headers.get("content-length")
        detail = f"received {got} bytes, expected {expected}" if expected else "incomplete read"
        return f"peer closed connection without sending complete message body ({detail})"

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


class Http11Pool:
    """Keep-alive connections to one origin, at most ``max_connections`` at a time."""

    def __init__(
        self,
        url: str,
        *,
        headers: dict[str, str],
        verify: bool | ssl.SSLContext,
        max_connections: int,
    ) -> None:
        parts = urlsplit(url)
        https = parts.scheme == "https"
        if parts.hostname is None:
            raise ValueError(f"no host in server URL {url!r}")
        self._host = parts.hostname
        self._port = parts.port or (443 if https else 80)
        # The same context HTTPX builds from the same ``verify`` (certifi when True).
        self._ssl = httpx.create_ssl_context(verify=verify) if https else None
        self._base_path = parts.path.rstrip("/")
        netloc = parts.netloc.rpartition("@")[2]
        self._url = url.rstrip("/")
        fixed = {"host": netloc, "user-agent": "consumer-sdk", **headers}
        if parts.username is not None and "authorization" not in headers:
            # Credentials in the URL are sent (Basic), as HTTPX does; never in the request line.
            user = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            fixed["authorization"] = "Basic " + base64.b64encode(user.encode()).decode("ascii")
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in fixed.items()).encode("latin-1")
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        # Every connection is either in use (holding a slot) or idle, and one is only opened
        # when none is idle, so at most ``max_connections`` are ever open.
        self._slots = asyncio.Semaphore(max_connections)
        self._closed = False

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None,
        content: bytes | None,
        timeout_s: float,
        replay: bool,
    ) -> Answer:
        """One exchange, bounded as a whole (waiting for a connection, connecting, sending
        and reading) by ``timeout_s``.

        ``replay``: the request may be sent again on a fresh connection when a reused one
        failed before any byte of the answer came (the server closed it while it was idle, in
        the moment the request went out). httpcore never does this: it only drops idle
        connections that turned readable, and fails the call on that race.
        """
        if self._closed:
            raise RuntimeError(CLOSED)
        target = self._base_path + path
        if params:
            target += "?" + urlencode(params)
        head = f"{method} {target} HTTP/1.1\r\n".encode() + self._fixed
        if content is not None:
            data = b"".join((head, b"content-length: %d\r\n\r\n" % len(content), content))
        elif method in _BODY_METHODS:
            data = head + b"content-length: 0\r\n\r\n"
        else:
            data = head + b"\r\n"
        stage = "pool"
        deadline = asyncio.timeout(timeout_s)
        try:
            async with deadline:
                await self._slots.acquire()
                try:
                    while True:
                        conn = self._take_idle()
                        if conn is None:
                            stage = "connect"
                            conn = await self._connect(method, path)
                        stage = "read"
                        try:
                            answer = await conn.exchange(data)
                        except _Broken as exc:
                            self._open.discard(conn)
                            if conn.reused and not conn.sent:
                                continue  # found closed before the request went out
                            if replay and conn.reused and not conn.received:
                                replay = False  # once
                                continue
                            where = f"{method} {self._url}{path}"
                            raise TransportError(f"{where}: {exc}") from exc
                        except BaseException:
                            self._open.discard(conn)
                            raise
                        self._put_idle(conn)
                        return answer
                finally:
                    self._slots.release()
        except TimeoutError as exc:
            if not deadline.expired():
                raise  # not our deadline (e.g. an OSError with ETIMEDOUT, already mapped)
            where = f"{method} {self._url}{path}"
            if stage in ("pool", "connect"):  # nothing was sent: safe to retry
                raise ConnectError(
                    f"{where}: cannot connect: no connection within {timeout_s:g} s"
                ) from exc
            raise RequestTimeout(f"{where}: no answer in time ({timeout_s:g} s)") from exc

    def _take_idle(self) -> _Connection | None:
        now = asyncio.get_running_loop().time()
        while self._idle:
            conn = self._idle.pop()  # the most recently used: the least likely to be closed
            if conn.usable and now - conn.idle_since < KEEPALIVE_EXPIRY_S and not conn.readable():
                return conn
            conn.close()
            self._open.discard(conn)
        return None

    def _put_idle(self, conn: _Connection) -> None:
        if not conn.usable or self._closed:
            conn.close()
            self._open.discard(conn)
            return
        conn.reused = True
        conn.idle_since = asyncio.get_running_loop().time()
        self._idle.append(conn)

    async def _connect(self, method: str, path: str) -> _Connection:
        loop = asyncio.get_running_loop()
        where = f"{method} {self._url}{path}"
        try:
            _, conn = await loop.create_connection(
                _Connection,
                self._host,
                self._port,
                ssl=self._ssl,
                server_hostname=self._host if self._ssl is not None else None,
            )
        except (ssl.SSLError, socket.gaierror, OSError) as exc:
            raise _connect_error(where, exc) from exc
        self._open.add(conn)
        return conn

    async def aclose(self) -> None:
        """Close every connection; later requests raise ``RuntimeError``. Idempotent."""
        self._closed = True
        self._idle.clear()
        for conn in self._open:
            conn.close()
        self._open.clear()


def _connect_error(where: str, exc: OSError) -> ClientError:
    failure = certificate_failure(exc)
    if failure is not None:
        return certificate_error(where, failure)
    reason = exc.strerror or str(exc) or type(exc).__name__
    return ConnectError(f"{where}: cannot connect: {reason}")


def proxied(url: str) -> bool:
    """Whether an ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY`` variable applies to ``url``
    (``NO_PROXY`` considered). HTTPX honours those and the lean pool does not, so such a
    client keeps going through HTTPX."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(parts.hostname or "")


class HttpxSender:
    """:meth:`Http11Pool.request` through HTTPX: with a given transport (the tests'
    in-process ASGI apps, custom networking), or HTTPX's own when a proxy variable applies
    (``proxied``). ``timeout_s`` bounds the call as a whole here too."""

    def __init__(
        self,
        url: str,
        *,
        headers: dict[str, str],
        verify: bool | ssl.SSLContext,
        max_connections: int,
        transport: httpx.AsyncBaseTransport | None,
    ) -> None:
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._http = httpx.AsyncClient(
            base_url=url, headers=headers, transport=transport, limits=limits, verify=verify
        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None,
        content: bytes | None,
        timeout_s: float,
        replay: bool,
    ) -> httpx.Response:
        # HTTPX's timeouts apply per phase; the whole-call bound is the client's contract.
        try:
            async with asyncio.timeout(timeout_s):
                return await self._http.request(
                    method, path, params=params, content=content, timeout=timeout_s
                )
        except TimeoutError as exc:
            raise httpx.ReadTimeout(f"no answer within {timeout_s:g} s") from exc

    async def aclose(self) -> None:
        await self._http.aclose()
