"""Producers: append messages to topics, with retries that never store a message twice
when it carries an id.

A producer *has* a client (:class:`~consumer_sdk.Client` / ``AsyncClient``) rather than being
one: it offers ``send``/``send_batch`` plus ``create_topic`` (the usual first step of a
program that produces), and ``producer.client`` gives the full API when a program needs more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import orjson

from consumer_sdk._base import AsyncClosing, Closing
from consumer_sdk._batching import (
    DEFAULT_BATCH_MAX_BYTES,
    DEFAULT_BATCH_MAX_MESSAGES,
    DEFAULT_LINGER_MS,
    BatchSettings,
    Lanes,
    Pending,
    adeliver,
    deliver,
)
from consumer_sdk._cluster import ProxyChoice, adiscover, discover, discovered, unique_urls
from consumer_sdk._consumer_base import server_list
from consumer_sdk._tls import Verify
from consumer_sdk._trace import inject
from consumer_sdk._wire import outgoing_to_wire
from consumer_sdk.client import DEFAULT_TIMEOUT_MS, AsyncClient, Client
from consumer_sdk.config import RetryPolicy
from consumer_sdk.errors import ClientError, ConnectError, ServiceUnavailable
from consumer_sdk.models import OutgoingMessage, SendResult, TopicInfo

log = logging.getLogger("consumer_sdk.producer")

#: Errors that prove a proxy stored nothing: the call moves on to the next proxy.
_DOWN = (ConnectError, ServiceUnavailable)
#: How many submitted messages may wait unsent before ``Producer.submit`` blocks.
DEFAULT_MAX_PENDING_MESSAGES = 100_000
#: Threads sending batches of different topics at once (one batch per topic at a time).
_SENDERS = 4


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
        "headers": inject(headers),
        "id": id,
        "qid": qid,
        "delay_ms": delay_ms,
        "deliver_at_ms": deliver_at_ms,
    }


def _encoded(message: dict[str, Any]) -> bytes:
    """A submitted message as the JSON object it is sent as: encoded once, at submit (so a
    body that is not JSON fails there, and a retried batch re-sends identical bytes)."""
    return orjson.dumps(outgoing_to_wire(message))


def _settle_sync(
    item: Pending[Future[SendResult]], result: SendResult | None, exc: BaseException | None
) -> None:
    if exc is not None:
        item.future.set_exception(exc)
    else:
        item.future.set_result(result)  # type: ignore[arg-type]


def _settle_async(
    item: Pending[asyncio.Future[SendResult]],
    result: SendResult | None,
    exc: BaseException | None,
) -> None:
    if item.future.done():  # cancelled by its caller while on the wire
        return
    if exc is not None:
        item.future.set_exception(exc)
    else:
        item.future.set_result(result)  # type: ignore[arg-type]


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

    Background batching (:meth:`submit`): ``batch_max_messages`` (500) and ``batch_max_bytes``
    (4 MiB) bound one produce call, ``linger_ms`` (5) is how long a message waits for others
    to share its call, and ``max_pending_messages`` (100000) how many may wait unsent before
    ``submit`` blocks (back-pressure instead of unbounded memory).
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
        batch_max_messages: int = DEFAULT_BATCH_MAX_MESSAGES,
        linger_ms: int = DEFAULT_LINGER_MS,
        batch_max_bytes: int = DEFAULT_BATCH_MAX_BYTES,
        max_pending_messages: int = DEFAULT_MAX_PENDING_MESSAGES,
    ) -> None:
        if max_pending_messages < 1:
            raise ValueError("max_pending_messages must be >= 1")

        def make(u: str) -> Client:
            return Client(
                u, token=token, timeout_ms=timeout_ms, retry=retry, transport=transport,
                verify=verify,
            )  # fmt: skip

        self._make = make
        self._proxies = ProxyChoice([make(u) for u in unique_urls(server_list(url))])
        self._discover = discover
        self._lock = threading.Lock()
        # Background batching, started by the first submit().
        self._lanes: Lanes[Future[SendResult]] = Lanes(
            BatchSettings(batch_max_messages, linger_ms, batch_max_bytes)
        )
        self._max_pending = max_pending_messages
        self._guard = threading.Lock()
        self._wake = threading.Condition(self._guard)  # the dispatcher: a lane may be due
        self._settled = threading.Condition(self._guard)  # flush, close, a blocked submit
        self._dispatcher: threading.Thread | None = None
        self._senders: ThreadPoolExecutor | None = None
        self._closing = False

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
        return self._fail_over(lambda client: client.produce(topic, messages))

    def _produce_encoded(self, topic: str, encoded: list[bytes], ids: bool) -> list[SendResult]:
        return self._fail_over(lambda client: client.produce_encoded(topic, encoded, with_ids=ids))

    def _fail_over(self, produce: Callable[[Client], list[SendResult]]) -> list[SendResult]:
        """Produce through the current proxy; on to the next when it is down (nothing was
        stored: a refused connection or a 503)."""
        proxies = self._ready()
        for client, last in proxies.attempts():
            try:
                results = produce(client)
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

    # -- background batching ---------------------------------------------------------------
    def submit(
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
    ) -> Future[SendResult]:
        """Queue one message for a background batch and return its future at once.

        The future's result is the :class:`SendResult` (same delivery guarantee as
        :meth:`send`); a message that finally fails (after the client's retries) resolves it
        with the SDK's error. Messages of one topic are sent in batches of up to
        ``batch_max_messages``, one batch at a time, so a key's messages are stored in the
        order of their ``submit`` calls, also when a batch is retried (concurrent calls from
        several threads have no order between them). A batch the server refuses as a whole
        (400, 413, 422) is sent again message by message, so only the bad messages fail.
        Blocks while ``max_pending_messages`` are unsent. Thread-safe.
        """
        encoded = _encoded(_one(body, key, headers, id, qid, delay_ms, deliver_at_ms))
        future: Future[SendResult] = Future()
        item = Pending(encoded, id is not None, future)
        with self._guard:
            if self._closing:
                raise RuntimeError("the producer is closed")
            if self._dispatcher is None:
                self._start()
            while self._lanes.outstanding >= self._max_pending and not self._closing:
                self._settled.wait()
            if self._closing:  # closed while this call waited for room: nobody would send it
                raise RuntimeError("the producer is closed")
            if self._lanes.add(topic, item, time.monotonic()):
                self._wake.notify()
        return future

    def flush(self, timeout_s: float | None = None) -> int:
        """Send everything submitted without lingering and wait until each future is
        resolved (or ``timeout_s`` passed); returns how many are still unresolved (0)."""
        with self._guard:
            lanes = self._lanes
            lanes.flushing += 1
            self._wake.notify()
            try:
                self._settled.wait_for(lambda: lanes.outstanding == 0, timeout_s)
            finally:
                lanes.flushing -= 1
            return lanes.outstanding

    def _start(self) -> None:
        self._senders = ThreadPoolExecutor(_SENDERS, thread_name_prefix="cproxy-producer-send")
        self._dispatcher = threading.Thread(
            target=self._dispatch, name="cproxy-producer", daemon=True
        )
        self._dispatcher.start()

    def _dispatch(self) -> None:
        """Hand due batches to the senders until closed with nothing outstanding."""
        lanes, senders = self._lanes, self._senders
        assert senders is not None
        with self._guard:
            while True:
                now = time.monotonic()
                for topic, batch in lanes.take(now):
                    senders.submit(self._send_batch, topic, batch)
                if self._closing and lanes.outstanding == 0:
                    return
                self._wake.wait(lanes.wait_s(now))

    def _send_batch(self, topic: str, batch: list[Pending[Future[SendResult]]]) -> None:
        try:
            live = [p for p in batch if p.future.set_running_or_notify_cancel()]
            if live:
                deliver(live, lambda enc, ids: self._produce_encoded(topic, enc, ids), _settle_sync)
        finally:
            with self._guard:
                self._lanes.done(topic, len(batch))
                self._wake.notify()
                self._settled.notify_all()

    def close(self) -> None:
        """Send what was submitted (waiting for it), then close the connection pools;
        idempotent."""
        with self._guard:
            self._closing = True
            self._lanes.flushing += 1
            self._wake.notify()
            self._settled.notify_all()
            dispatcher = self._dispatcher
        if dispatcher is not None:
            dispatcher.join()
        if self._senders is not None:
            self._senders.shutdown(wait=True)
        for client in self._proxies.clients:
            client.close()


class AsyncProducer(AsyncClosing):
    """The ``async`` twin of :class:`Producer`; same arguments (a URL or a list, ``discover``),
    delivery, retry and fail-over semantics (``transport`` is an ``httpx.AsyncBaseTransport``;
    ``producer.client`` an ``AsyncClient``). ``max_connections`` (100) bounds the connection
    pool of each proxy's client. ``batch_max_messages``, ``linger_ms`` and ``batch_max_bytes``
    are those of :meth:`Producer.submit` (an ``async`` program bounds what it submits by
    awaiting the futures or :meth:`flush`).
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
        batch_max_messages: int = DEFAULT_BATCH_MAX_MESSAGES,
        linger_ms: int = DEFAULT_LINGER_MS,
        batch_max_bytes: int = DEFAULT_BATCH_MAX_BYTES,
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
        self._lanes: Lanes[asyncio.Future[SendResult]] = Lanes(
            BatchSettings(batch_max_messages, linger_ms, batch_max_bytes)
        )
        # Created by the first submit(), in its loop.
        self._dispatcher: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._settled: asyncio.Event | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self._closing = False

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
        return await self._fail_over(lambda client: client.produce(topic, messages))

    async def _produce_encoded(
        self, topic: str, encoded: list[bytes], ids: bool
    ) -> list[SendResult]:
        return await self._fail_over(
            lambda client: client.produce_encoded(topic, encoded, with_ids=ids)
        )

    async def _fail_over(
        self, produce: Callable[[AsyncClient], Awaitable[list[SendResult]]]
    ) -> list[SendResult]:
        """See :meth:`Producer._fail_over`."""
        proxies = await self._ready()
        for client, last in proxies.attempts():
            try:
                results = await produce(client)
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

    # -- background batching ---------------------------------------------------------------
    def submit(
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
    ) -> asyncio.Future[SendResult]:
        """Queue one message for a background batch (see :meth:`Producer.submit`); returns
        an awaitable future of its :class:`SendResult` at once. Call it inside the event
        loop the producer is used in."""
        encoded = _encoded(_one(body, key, headers, id, qid, delay_ms, deliver_at_ms))
        if self._closing:
            raise RuntimeError("the producer is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[SendResult] = loop.create_future()
        if self._dispatcher is None:
            self._wake, self._settled = asyncio.Event(), asyncio.Event()
            self._dispatcher = loop.create_task(self._dispatch(), name="cproxy-producer")
        if self._lanes.add(topic, Pending(encoded, id is not None, future), time.monotonic()):
            assert self._wake is not None
            self._wake.set()
        return future

    async def flush(self) -> None:
        """Send everything submitted without lingering and wait until each future is
        resolved."""
        if self._dispatcher is None:
            return
        assert self._wake is not None and self._settled is not None
        lanes = self._lanes
        lanes.flushing += 1
        try:
            while lanes.outstanding:
                self._settled.clear()
                self._wake.set()
                await self._settled.wait()
        finally:
            lanes.flushing -= 1

    async def _dispatch(self) -> None:
        lanes, wake = self._lanes, self._wake
        assert wake is not None
        while True:
            now = time.monotonic()
            for topic, batch in lanes.take(now):
                task = asyncio.create_task(self._send_batch(topic, batch))
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)
            if self._closing and lanes.outstanding == 0:
                return
            wake.clear()
            delay = lanes.wait_s(now)
            if delay is None:
                await wake.wait()
            elif delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), delay)

    async def _send_batch(
        self, topic: str, batch: list[Pending[asyncio.Future[SendResult]]]
    ) -> None:
        try:
            live = [p for p in batch if not p.future.done()]
            if live:
                await adeliver(
                    live, lambda enc, ids: self._produce_encoded(topic, enc, ids), _settle_async
                )
        finally:
            self._lanes.done(topic, len(batch))
            assert self._wake is not None and self._settled is not None
            self._wake.set()
            self._settled.set()

    async def aclose(self) -> None:
        """Send what was submitted (waiting for it), then close the connection pools;
        idempotent."""
        self._closing = True
        if self._dispatcher is not None:
            await self.flush()
            assert self._wake is not None
            self._wake.set()
            await self._dispatcher
        await asyncio.gather(*(c.aclose() for c in self._proxies.clients))
