"""How :class:`~consumer_sdk.AsyncClient` sends its calls: aiohttp's client by default,
HTTPX when the caller hands in an HTTPX transport (in-process ASGI apps, custom networking).

:class:`AiohttpSender` is the default: one ``aiohttp.ClientSession`` per client (keep-alive
connections to one origin, llhttp parsing, at most ``max_connections`` open), honouring the
proxy variables (``HTTP_PROXY``/``HTTPS_PROXY``/``NO_PROXY``, read when the client is made)
and credentials in the URL.
``timeout_s`` bounds each call as a whole (waiting for a connection, connecting, sending and
reading), whichever way it is sent. aiohttp's exceptions are translated here, once, into the
:mod:`consumer_sdk.errors` hierarchy, naming the call; :class:`HttpxSender` leaves HTTPX's to
``BaseClient._translate``.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote, urlsplit

import aiohttp
import httpx
from yarl import URL

from consumer_sdk._tls import certificate_failure
from consumer_sdk.errors import (
    CertificateError,
    ClientError,
    ConnectError,
    RequestTimeout,
    TransportError,
)

#: An idle connection older than this is closed rather than reused: under uvicorn's 5 s
#: keep-alive timeout, so a reuse does not race the server closing the connection.
KEEPALIVE_EXPIRY_S: Final = 4.0
#: Of a call's time budget, what getting a connection (from the pool or a new one) may use:
#: a call that timed out there provably sent nothing (``ConnectError``, safe to retry).
_CONNECT_SHARE: Final = 0.9
CLOSED: Final = "Cannot send a request, as the client has been closed."
#: A sender idle longer than this lets the loop read pending events before it sends.
_IDLE_S: Final = 0.05


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole HTTP answer: what ``BaseClient._decode`` reads (as it does ``httpx.Response``)."""

    status_code: int
    reason_phrase: str
    #: Case-insensitive names (aiohttp's header mapping).
    headers: Mapping[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


def certificate_error(where: str, failure: ssl.SSLCertVerificationError) -> CertificateError:
    return CertificateError(
        f"{where}: the server's TLS certificate failed verification "
        f"({failure.verify_message or failure.reason}); for a private CA pass its "
        "bundle as verify=/ca_file (CLI: --ca-file or CPROXY_CA_FILE)"
    )


class AiohttpSender:
    """Keep-alive connections to one server through aiohttp."""

    def __init__(
        self,
        url: str,
        *,
        headers: dict[str, str],
        verify: bool | ssl.SSLContext,
        max_connections: int,
    ) -> None:
        parts = urlsplit(url)
        if parts.hostname is None:
            raise ValueError(f"no host in server URL {url!r}")
        if parts.username is not None and "authorization" not in headers:
            # Credentials in the URL are sent (Basic), as HTTPX does; never in the request line.
            user = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            basic = base64.b64encode(user.encode()).decode("ascii")
            headers = {**headers, "authorization": f"Basic {basic}"}
        netloc = parts.netloc.rpartition("@")[2]
        self._base = f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}"
        self._url = url.rstrip("/")
        self._ssl: ssl.SSLContext | bool = False
        if parts.scheme == "https":
            # The same context HTTPX builds from the same ``verify`` (certifi when True).
            self._ssl = httpx.create_ssl_context(verify=verify) if verify else False
        self._settings = (headers, max_connections)
        self._proxy = _proxy_for(url)
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        self._targets: dict[str, URL] = {}
        self._closed = False
        self._last_done = 0.0  # loop time the last call ended

    def _open(self) -> aiohttp.ClientSession:
        """The session, made on first use: inside the event loop that will run it."""
        headers, limit = self._settings
        connector = aiohttp.TCPConnector(
            limit=limit, keepalive_timeout=KEEPALIVE_EXPIRY_S, ssl=self._ssl
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=headers,
            # The proxy variables are read once (``_proxy_for``): aiohttp's trust_env would
            # look them (and ~/.netrc) up in a thread on every request.
            trust_env=False,
            cookie_jar=aiohttp.DummyCookieJar(),  # the API sets no cookies
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding",),
        )
        return self._session

    def _timeout(self, timeout_s: float) -> aiohttp.ClientTimeout:
        timeout = self._timeouts.get(timeout_s)
        if timeout is None:
            timeout = aiohttp.ClientTimeout(total=timeout_s, connect=timeout_s * _CONNECT_SHARE)
            if len(self._timeouts) < 64:  # a few distinct budgets (pulls add their wait_ms)
                self._timeouts[timeout_s] = timeout
        return timeout

    def _target(self, path: str) -> URL:
        target = self._targets.get(path)
        if target is None:
            target = URL(self._base + path, encoded=False)
            if len(self._targets) < 1024:
                self._targets[path] = target
        return target

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
        """One exchange, bounded as a whole by ``timeout_s``.

        ``replay``: the call is idempotent, so when the server closed the connection without
        answering (typically a kept-alive one, closed in the moment the request went out) it
        is sent once more on a fresh connection before the error counts.
        """
        if self._closed:
            raise RuntimeError(CLOSED)
        session = self._session or self._open()
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_done > _IDLE_S:
            # After a pause the loop may not have read a close the server sent meanwhile (the
            # program blocked it, or the server stopped while nothing was waiting on it): let
            # it read pending events, so the pool replaces a closed connection instead of
            # sending on it a request that would then fail without an answer.
            await asyncio.sleep(0)  # our turn comes before the I/O callbacks of this pass
            await asyncio.sleep(0)
        try:
            return await self._exchange(session, method, path, params, content, timeout_s, replay)
        finally:
            self._last_done = loop.time()

    async def _exchange(
        self,
        session: aiohttp.ClientSession,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        content: bytes | None,
        timeout_s: float,
        replay: bool,
    ) -> Answer:
        while True:
            try:
                async with session.request(
                    method,
                    self._target(path),
                    params=params,
                    data=content,
                    timeout=self._timeout(timeout_s),
                    proxy=self._proxy,
                ) as answer:
                    body = await answer.read()
                    return Answer(answer.status, answer.reason or "", answer.headers, body)
            except aiohttp.ServerDisconnectedError as exc:
                if replay:
                    replay = False
                    continue
                raise self._error(exc, method, path, timeout_s) from exc
            except (aiohttp.ClientError, TimeoutError, ssl.SSLError) as exc:
                raise self._error(exc, method, path, timeout_s) from exc

    def _error(self, exc: BaseException, method: str, path: str, timeout_s: float) -> ClientError:
        where = f"{method} {self._url}{path}"
        # aiohttp's certificate error is an ssl.CertificateError itself; the ssl module's
        # verification error (with its message) is the one it wraps.
        cause = (
            exc.certificate_error
            if isinstance(exc, aiohttp.ClientConnectorCertificateError)
            else exc
        )
        failure = certificate_failure(cause)
        if failure is not None:
            return certificate_error(where, failure)
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            return ConnectError(f"{where}: cannot connect: no connection within {timeout_s:g} s")
        if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ClientProxyConnectionError):
            return ConnectError(f"{where}: cannot connect: {exc.os_error or exc}")
        if isinstance(exc, TimeoutError):
            return RequestTimeout(f"{where}: no answer in time ({timeout_s:g} s)")
        if isinstance(exc, aiohttp.ServerDisconnectedError):
            return TransportError(f"{where}: server disconnected without sending a response")
        if isinstance(exc, aiohttp.ClientPayloadError):
            return TransportError(f"{where}: incomplete answer: {exc}")
        return TransportError(f"{where}: {type(exc).__name__}: {exc}".rstrip(": "))

    async def aclose(self) -> None:
        """Close every connection; later requests raise ``RuntimeError``. Idempotent."""
        self._closed = True
        if self._session is not None:
            await self._session.close()


def _proxy_for(url: str) -> str | None:
    """The proxy an ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY`` variable names for ``url``
    (``NO_PROXY`` considered), as HTTPX reads them; None: direct."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy


class HttpxSender:
    """:meth:`AiohttpSender.request` through HTTPX, with a given transport (the tests'
    in-process ASGI apps, custom networking). ``timeout_s`` bounds the call as a whole here
    too."""

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
