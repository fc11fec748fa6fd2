"""Producers: append messages to topics, with retries that never store a message twice
when it carries an id.

A producer *has* a client (:class:`~consumer_sdk.Client` / ``AsyncClient``) rather than being
one: it offers ``send``/``send_batch`` plus ``create_topic`` (the usual first step of a
program that produces), and ``producer.client`` gives the full API when a program needs more.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import httpx

from consumer_sdk._base import AsyncClosing, Closing
from consumer_sdk._cluster import ProxyChoice, adiscover, discover, discovered, unique_urls
from consumer_sdk._consumer_base import server_list
from consumer_sdk._tls import Verify
from consumer_sdk.client import DEFAULT_TIMEOUT_MS, AsyncClient, Client
from consumer_sdk.config import RetryPolicy
from consumer_sdk.errors import ClientError, ConnectError, ServiceUnavailable
from consumer_sdk.models import OutgoingMessage, SendResult, TopicInfo

log = logging.getLogger("consumer_sdk.producer")

#: Errors that prove a proxy stored nothing: the call moves on to the next proxy.
_DOWN = (ConnectError, ServiceUnavailable)


def _one(
    body: Any,
    key: str | None,
    headers: Mapping[str, str] | None,
    id: str | None,  # the wire name, as in send_batch
    qid: int | None,
    delay_ms: int | None = None,
    deliver_at_ms: int | None = None,
) -> dict[str, Any]:
    return {
        "body": body,
        "key": key,
        "headers": headers,
        "id": id,
        "qid": qid,
        "delay_ms": delay_ms,
        "deliver_at_ms": deliver_at_ms,
    }


class Producer(Closing):
    """Sends messages to one server, or to any of several. Thread-safe; close it (or use
    ``with``) when done.

    Arguments are those of :class:`~consumer_sdk.Client`: ``url`` (or a list of proxies of one
    cluster, see docs/scaling.md), and keyword-only ``token``,
    ``timeout_ms`` (10000, per HTTP call), ``retry`` (a :class:`RetryPolicy`, default 5 tries),
    ``transport`` (replaces the HTTPX transport, e.g. in tests) and ``verify`` (how an https://
    server's certificate is checked: True, a CA bundle path, an ``ssl.SSLContext``); plus
    ``discover`` (False), below.

    Delivery: a returned :class:`SendResult` means the message is durably stored and will reach
    every group subscribed to the topic. Connection failures and 503 are retried with backoff
    because they prove nothing was stored. A timeout or a reset after sending is retried only
    when every message of the call has an ``id``: the server's dedup then answers the repeat
    with ``duplicate=True`` instead of storing it again. Without ids such an error is raised,
    and the message may or may not have been stored.

    Queue choice: an explicit ``qid``; else a stable hash of ``key`` (Kafka's murmur2); else
    round robin. Messages with one key keep their order.

    Several URLs: the producer starts at a random one (so many producers spread over the
    proxies) and sends every call there until it cannot be reached (connection refused after
    its retries) or answers 503; the call is then sent to the next proxy (nothing was stored by
    the first), which serves the following calls too. Only when every proxy failed is the
    error raised. Which proxy appends does not matter for order: the store numbers each queue's
    messages, so a key's messages keep the order of this producer's calls as long as they are
    made one after another (concurrent calls from several threads have no order between them).

    ``discover=True``: at the first call (``send``, ``send_batch``, ``create_topic``) the
    producer asks ``GET /v1/cluster`` of the given URLs (the first that answers, one try each)
    and sends to the live proxies it lists, keeping the given URLs as fall-backs after them. A
    404 (a single proxy on SQLite) or no answer at all: the given URLs alone. Asked once; the
    token needs the ``read_topics`` right (producer, consumer and admin roles have it).
    """

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        token: str | None = None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
        verify: Verify = True,
        discover: bool = False,
    ) -> None:
        def make(u: str) -> Client:
            return Client(
                u, token=token, timeout_ms=timeout_ms, retry=retry, transport=transport,
                verify=verify,
            )  # fmt: skip

        self._make = make
        self._proxies = ProxyChoice([make(u) for u in unique_urls(server_list(url))])
        self._discover = discover
        self._lock = threading.Lock()

    @property
    def client(self) -> Client:
        """The client the producer sends through now; use it for the rest of the API."""
        return self._proxies.client

    @property
    def url(self) -> str:
        """The base URL of the server in use (without a trailing slash)."""
        return self.client.url

    @property
    def urls(self) -> list[str]:
        """Every proxy the producer may send to, in fail-over order of the list (after
        discovery: the discovered ones, then the given ones)."""
        return [c.url for c in self._proxies.clients]

    def __repr__(self) -> str:
        return f"Producer({self.url!r})"

    def _ready(self) -> ProxyChoice[Client]:
        """The proxies, discovered first if asked for (once, under the lock)."""
        if self._discover:
            with self._lock:
                if self._discover:
                    given = self._proxies.clients
                    try:
                        members = discover(given)
                    except ClientError as exc:
                        if not exc.retryable:
                            raise
                        members = None  # logged; the given URLs serve
                    self._proxies = discovered(given, members, self._make)
                    self._discover = False
        return self._proxies

    def _produce(self, topic: str, messages: list[OutgoingMessage]) -> list[SendResult]:
        """Produce through the current proxy; on to the next when it is down (nothing was
        stored: a refused connection or a 503)."""
        proxies = self._ready()
        for client, last in proxies.attempts():
            try:
                results = client.produce(topic, messages)
            except _DOWN as exc:
                if last:
                    raise
                log.warning("producing to %s failed (%s): trying the next proxy", client.url, exc)
                continue
            proxies.answered(client)
            return results
        raise AssertionError("unreachable")  # pragma: no cover

    def create_topic(self, name: str, queues: int) -> TopicInfo:
        """Create the topic to produce to; a no-op when it exists with ``queues`` queues
        (:class:`~consumer_sdk.ResourceConflict` when the queue count differs)."""
        return self._ready().client.create_topic(name, queues)

    def send(
        self,
        topic: str,
        body: Any,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        id: str | None = None,
        qid: int | None = None,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
    ) -> SendResult:
        """Send one message; ``body`` is any JSON-serialisable value.

        ``delay_ms`` (from when the server stores it) or ``deliver_at_ms`` (ms since the
        epoch; a past time means no delay), not both: the message is not delivered before
        then, and later messages of its order value wait behind it. The server refuses
        delays over its ``limits.max_delay_ms`` (7 days by default) with a 422.
        """
        message = _one(body, key, headers, id, qid, delay_ms, deliver_at_ms)
        return self._produce(topic, [message])[0]

    def send_batch(self, topic: str, messages: Iterable[OutgoingMessage]) -> list[SendResult]:
        """Send messages atomically (all stored or none); results are in input order.

        Each message is a mapping with ``body`` and optionally ``key``, ``headers``, ``id``,
        ``qid``, ``delay_ms`` or ``deliver_at_ms``. The server limits a call (by default 1000
        messages and 8 MiB): split larger batches yourself, since splitting gives up atomicity.
        """
        return self._produce(topic, list(messages))

    def close(self) -> None:
        """Close the connection pools; idempotent."""
        for client in self._proxies.clients:
            client.close()


class AsyncProducer(AsyncClosing):
    """The ``async`` twin of :class:`Producer`; same arguments (a URL or a list, ``discover``),
    delivery, retry and fail-over semantics (``transport`` is an ``httpx.AsyncBaseTransport``;
    ``producer.client`` an ``AsyncClient``). ``max_connections`` (100) bounds the connection
    pool of each proxy's client.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        token: str | None = None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        max_connections: int = 100,
        verify: Verify = True,
        discover: bool = False,
    ) -> None:
        def make(u: str) -> AsyncClient:
            return AsyncClient(
                u, token=token, timeout_ms=timeout_ms, retry=retry, transport=transport,
                max_connections=max_connections, verify=verify,
            )  # fmt: skip

        self._make = make
        self._proxies = ProxyChoice([make(u) for u in unique_urls(server_list(url))])
        self._discover = discover
        self._lock = asyncio.Lock()

    @property
    def client(self) -> AsyncClient:
        """The client the producer sends through now; use it for the rest of the API."""
        return self._proxies.client

    @property
    def url(self) -> str:
        """The base URL of the server in use (without a trailing slash)."""
        return self.client.url

    @property
    def urls(self) -> list[str]:
        """Every proxy the producer may send to (see :attr:`Producer.urls`)."""
        return [c.url for c in self._proxies.clients]

    def __repr__(self) -> str:
        return f"AsyncProducer({self.url!r})"

    async def _ready(self) -> ProxyChoice[AsyncClient]:
        """The proxies, discovered first if asked for (once, under the lock)."""
        if self._discover:
            async with self._lock:
                if self._discover:
                    given = self._proxies.clients
                    try:
                        members = await adiscover(given)
                    except ClientError as exc:
                        if not exc.retryable:
                            raise
                        members = None  # logged; the given URLs serve
                    self._proxies = discovered(given, members, self._make)
                    self._discover = False
        return self._proxies

    async def _produce(self, topic: str, messages: list[OutgoingMessage]) -> list[SendResult]:
        """See :meth:`Producer._produce`."""
        proxies = await self._ready()
        for client, last in proxies.attempts():
            try:
                results = await client.produce(topic, messages)
            except _DOWN as exc:
                if last:
                    raise
                log.warning("producing to %s failed (%s): trying the next proxy", client.url, exc)
                continue
            proxies.answered(client)
            return results
        raise AssertionError("unreachable")  # pragma: no cover

    async def create_topic(self, name: str, queues: int) -> TopicInfo:
        """Create the topic to produce to (see :meth:`Producer.create_topic`)."""
        return await (await self._ready()).client.create_topic(name, queues)

    async def send(
        self,
        topic: str,
        body: Any,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        id: str | None = None,
        qid: int | None = None,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
    ) -> SendResult:
        """Send one message (see :meth:`Producer.send`, including delays)."""
        message = _one(body, key, headers, id, qid, delay_ms, deliver_at_ms)
        return (await self._produce(topic, [message]))[0]

    async def send_batch(self, topic: str, messages: Iterable[OutgoingMessage]) -> list[SendResult]:
        """Send messages atomically (all stored or none); results are in input order."""
        return await self._produce(topic, list(messages))

    async def aclose(self) -> None:
        """Close the connection pools; idempotent."""
        await asyncio.gather(*(c.aclose() for c in self._proxies.clients))
