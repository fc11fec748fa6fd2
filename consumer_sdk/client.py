"""Typed HTTP clients for one cproxy server: :class:`Client` and its async twin.

They are *the* client of the HTTP contract (docs/api.md): the producers, the consumer loops, the
Spark sink and the ``cproxy`` CLI all go through them. Both share everything but I/O with
:class:`consumer_sdk._base.BaseClient`, where every call is built and every answer parsed; each
method here is one line that sends a call. Calls are retried per their :class:`RetryPolicy`
on transport errors, 429 and 503; a call that may already have been applied (timeout, reset) is
only repeated when it is idempotent (``pull``, ``redrive``, ``skip`` and ``release`` never are;
``produce`` is when every message has an id).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from consumer_sdk._base import AsyncClosing, BaseClient, BlockedHead, Call, Closing
from consumer_sdk._http11 import Http11Pool, HttpxSender, proxied
from consumer_sdk._tls import Verify
from consumer_sdk._wire import HttpAnswer
from consumer_sdk.config import NO_RETRY, RetryPolicy
from consumer_sdk.errors import ClientError, ServiceUnavailable
from consumer_sdk.models import (
    AckResult,
    ExtendResult,
    GroupInfo,
    MessageRef,
    OutgoingMessage,
    Produce,
    PullResult,
    QueueResult,
    SendResult,
    TopicInfo,
)

DEFAULT_TIMEOUT_MS = 10_000
T = TypeVar("T")

#: Seek targets: ``"earliest"``, ``"latest"``, an offset, or ``{"timestamp_ms": n}``.
SeekTarget = str | int | Mapping[str, int]


class Client(Closing, BaseClient):
    """Blocking client for one server. Thread-safe; close it (or use ``with``) when done.

    ``timeout_ms`` bounds each HTTP call (a pull adds its ``wait_ms``); ``retry`` sets how
    transient errors are retried; ``verify`` how an https:// server's certificate is checked:
    ``True`` (default) against the usual trusted CAs, a path to a PEM CA bundle for a private
    CA, an ``ssl.SSLContext``, or ``False`` (no check: tests only); a certificate that fails is
    :class:`~consumer_sdk.CertificateError`, never retried. ``transport`` lets tests or custom
    networking replace the HTTPX transport. Errors are :class:`~consumer_sdk.ClientError`
    subclasses.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
        verify: Verify = True,
    ) -> None:
        super().__init__(
            url, token=token, timeout_ms=timeout_ms, retry=retry or RetryPolicy(), verify=verify
        )
        self._http = httpx.Client(
            base_url=self.url, headers=self._headers, transport=transport, verify=self._verify
        )

    def close(self) -> None:
        """Close the connection pool; idempotent."""
        self._http.close()

    def _request(self, call: Call[Any], retry: RetryPolicy | None = None) -> Any:
        policy = retry or self.retry
        attempt = 1
        while True:
            try:
                try:
                    response = self._http.request(
                        call.method, call.path, **self._request_args(call)
                    )
                except httpx.HTTPError as exc:
                    raise self._translate(exc, call) from exc
                return self._decode(response, call)
            except ClientError as exc:
                delay_ms = self._retry_delay_ms(exc, call, attempt, policy)
                if delay_ms is None:
                    raise
            time.sleep(delay_ms / 1000)
            attempt += 1

    def _send(self, call: Call[T], retry: RetryPolicy | None = None) -> T:
        return call.parse(self._request(call, retry))

    # -- topics ------------------------------------------------------------------------------
    def create_topic(self, name: str, queues: int) -> TopicInfo:
        """Create a topic with ``queues`` queues; the same call again is a no-op (409 if the
        queue count differs)."""
        return self._send(self._create_topic(name, queues))

    def get_topic(self, name: str) -> dict[str, Any]:
        """``{"name", "queues", "queue_stats": [{"qid", "min_offset", "next_offset"}]}``."""
        return self._send(self._get_topic(name))

    def list_topics(self) -> list[TopicInfo]:
        """Every topic the token may read."""
        return self._send(self._list_topics())

    def produce(self, topic: str, messages: Iterable[OutgoingMessage]) -> list[SendResult]:
        """Append messages atomically; results are in input order. See :class:`Producer`."""
        return self._send(self._produce(topic, messages))

    def produce_encoded(
        self,
        topic: str,
        encoded: Sequence[bytes],
        *,
        with_ids: bool = False,
        retry: RetryPolicy | None = None,
    ) -> list[SendResult]:
        """Like :meth:`produce` for messages already encoded as JSON objects (bytes).

        They are spliced into the request as they are, so a retry re-sends identical bytes.
        ``with_ids``: the caller vouches that every message has an ``id``, which makes the
        call safe to repeat after a timeout (the server's dedup absorbs the repeat).
        """
        return self._send(self._produce_encoded(topic, encoded, with_ids), retry)

    # -- groups ------------------------------------------------------------------------------
    def list_groups(self) -> list[GroupInfo]:
        """Every group the token may use (``GET /v1/groups``, an extension of the contract)."""
        return self._send(self._list_groups())

    def put_group(self, group: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """Create or update a group; returns the effective config with defaults filled in."""
        return self._send(self._group("PUT", group, body=dict(config)))

    def get_group(self, group: str) -> dict[str, Any]:
        """The group's config and stats (``in_flight``, ``ready``, per-queue ``lag``...)."""
        return self._send(self._group("GET", group))

    def delete_group(self, group: str) -> None:
        """Delete the group and its progress."""
        self._send(self._group("DELETE", group))

    def pull(
        self,
        group: str,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        topics: Sequence[str] | None = None,
        results: Sequence[QueueResult] = (),
        retry: RetryPolicy | None = None,
        max_per_key: int = 1,
        consumer: str | None = None,
    ) -> PullResult:
        """Apply ``results``, then take up to ``max_messages`` messages, waiting up to
        ``wait_ms`` for one. Every message returned is in flight until acked or failed.

        ``max_per_key`` > 1 lets the answer carry same-key runs (``Message.run``): handle a
        run in order; after a fail, send no result for the rest of its run. ``consumer``
        names the puller in the group's stats (default: its address)."""
        call = self._pull(group, max_messages, wait_ms, topics, results, max_per_key, consumer)
        return self._send(call, retry)

    def ack(
        self,
        group: str,
        results: Sequence[QueueResult],
        retry: RetryPolicy | None = None,
        produce: Sequence[Produce] | None = None,
    ) -> AckResult:
        """Send acks/fails without pulling (``POST /v1/groups/{group}/ack``).

        With ``produce``, the results (each fenced by its attempt) and those output messages
        are stored in one transaction (``AckResult.produced`` says where); if any result is
        not a current delivery, nothing is: ``ResourceConflict`` with code
        ``stale_results``."""
        return self._send(self._ack(group, results, produce), retry)

    def extend(
        self,
        group: str,
        refs: Iterable[MessageRef],
        ack_timeout_ms: int,
        retry: RetryPolicy | None = None,
        attempts: Mapping[MessageRef, int] | None = None,
    ) -> ExtendResult:
        """Move the ack deadline of in-flight messages to now + ``ack_timeout_ms``;
        ``attempts`` fences each extend to the delivery it names."""
        return self._send(self._extend(group, refs, ack_timeout_ms, attempts), retry)

    # -- operations --------------------------------------------------------------------------
    def seek(
        self, group: str, topic: str, to: SeekTarget, qid: int | None = None
    ) -> dict[str, Any]:
        """Move the group to ``"earliest"``, ``"latest"``, an offset or ``{"timestamp_ms": n}``
        on one queue (``qid``) or all; returns ``{"topic", "offsets": [{"qid", "offset"}]}``."""
        return self._send(self._seek(group, topic, to, qid))

    def replay(
        self, group: str, topic: str, order_value: str, start: SeekTarget = "earliest"
    ) -> dict[str, Any]:
        """Deliver one order value's finished messages again, from ``start`` (``"earliest"``,
        an offset or ``{"timestamp_ms": n}``), marked ``replay``; returns ``{"replaying",
        "lost_to_retention"}``. 409 (``ClientError``) while the value still replays."""
        return self._send(self._replay(group, topic, order_value, start))

    def dead_letters(
        self, group: str, *, topic: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """The group's dead letters (server default limit: 100), oldest first."""
        return self._send(self._dead_letters(group, topic, limit))

    def redrive(
        self,
        group: str,
        topic: str | None = None,
        messages: Sequence[MessageRef] | None = None,
    ) -> int:
        """Deliver the group's dead letters (of ``topic``, or just ``messages``: (topic, qid,
        offset) refs) again, to this group only, in per-key order; returns how many."""
        return self._send(self._redrive(group, topic, messages))

    def delete_dead_letters(
        self,
        group: str,
        *,
        topic: str | None = None,
        messages: Sequence[MessageRef] | None = None,
    ) -> int:
        """Delete the named dead letters (``messages``), or all of ``topic``; returns how
        many were deleted."""
        return self._send(self._delete_dead_letters(group, topic, messages))

    def browse(
        self,
        topic: str,
        *,
        qid: int | None = None,
        start: int | None = None,
        from_ms: int | None = None,
        last: int | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """Read stored messages of one queue without any group (nothing is held or charged):
        from offset ``start``, from time ``from_ms`` or the newest ``last``; returns
        ``{"topic", "qid", "messages", "next"}``."""
        return self._send(self._browse(topic, qid, start, from_ms, last, limit))

    def blocked_keys(
        self,
        group: str,
        *,
        topic: str | None = None,
        min_blocked_ms: int | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Order values whose head is retrying or unacked (see docs/api.md)."""
        return self._send(self._blocked_keys(group, topic, min_blocked_ms, limit))

    def skip(self, group: str, topic: str, head: BlockedHead) -> MessageRef:
        """Dead-letter a blocked chain head (its order value, or ``(qid, offset)``) so its
        chain moves on; returns the skipped message."""
        return self._send(self._blocked_key_action("skip", group, topic, head))

    def release(self, group: str, topic: str, head: BlockedHead) -> MessageRef:
        """Retry a blocked chain head now, with a fresh attempt budget; returns the message."""
        return self._send(self._blocked_key_action("release", group, topic, head))

    # -- health ------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """``GET /healthz``: ``{"status": "ok"}`` while the process is alive."""
        return self._send(self._health(), NO_RETRY)

    def ready(self) -> bool:
        """``GET /readyz``: True when the server takes work, False when it answers 503.

        Tried once; raises :class:`~consumer_sdk.TransportError` when the server cannot be
        reached.
        """
        try:
            self._send(self._ready(), NO_RETRY)
        except ServiceUnavailable:
            return False
        return True


class AsyncClient(AsyncClosing, BaseClient):
    """The ``async`` twin of :class:`Client`: same methods, same semantics, awaitable. Without
    ``transport`` it sends through its own lean HTTP/1.1 pool (:mod:`consumer_sdk._http11`:
    HTTPX's layers, and aiohttp's, cost more client CPU per call); with one, or when a proxy
    variable applies to the URL, through HTTPX. Either way ``timeout_ms`` bounds each call as
    a whole, and failures are the SDK's errors."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        max_connections: int = 100,
        verify: Verify = True,
    ) -> None:
        super().__init__(
            url, token=token, timeout_ms=timeout_ms, retry=retry or RetryPolicy(), verify=verify
        )
        self._http: Http11Pool | HttpxSender
        if transport is None and not proxied(self.url):
            self._http = Http11Pool(
                self.url, headers=self._headers, verify=self._verify,
                max_connections=max_connections,
            )  # fmt: skip
        else:
            self._http = HttpxSender(
                self.url, headers=self._headers, verify=self._verify,
                max_connections=max_connections, transport=transport,
            )  # fmt: skip

    async def aclose(self) -> None:
        """Close the connection pool; idempotent."""
        await self._http.aclose()

    async def _request(self, call: Call[Any], retry: RetryPolicy | None = None) -> Any:
        policy = retry or self.retry
        attempt = 1
        while True:
            try:
                try:
                    response: HttpAnswer = await self._http.request(
                        call.method,
                        call.path,
                        params=call.params,
                        content=self._content(call),
                        timeout_s=call.timeout_s or self._timeout_s,
                        replay=call.idempotent,
                    )
                except httpx.HTTPError as exc:
                    raise self._translate(exc, call) from exc
                return self._decode(response, call)
            except ClientError as exc:
                delay_ms = self._retry_delay_ms(exc, call, attempt, policy)
                if delay_ms is None:
                    raise
            await asyncio.sleep(delay_ms / 1000)
            attempt += 1

    async def _send(self, call: Call[T], retry: RetryPolicy | None = None) -> T:
        return call.parse(await self._request(call, retry))

    async def create_topic(self, name: str, queues: int) -> TopicInfo:
        return await self._send(self._create_topic(name, queues))

    async def get_topic(self, name: str) -> dict[str, Any]:
        return await self._send(self._get_topic(name))

    async def list_topics(self) -> list[TopicInfo]:
        return await self._send(self._list_topics())

    async def produce(self, topic: str, messages: Iterable[OutgoingMessage]) -> list[SendResult]:
        return await self._send(self._produce(topic, messages))

    async def produce_encoded(
        self,
        topic: str,
        encoded: Sequence[bytes],
        *,
        with_ids: bool = False,
        retry: RetryPolicy | None = None,
    ) -> list[SendResult]:
        return await self._send(self._produce_encoded(topic, encoded, with_ids), retry)

    async def list_groups(self) -> list[GroupInfo]:
        return await self._send(self._list_groups())

    async def put_group(self, group: str, config: Mapping[str, Any]) -> dict[str, Any]:
        return await self._send(self._group("PUT", group, body=dict(config)))

    async def get_group(self, group: str) -> dict[str, Any]:
        return await self._send(self._group("GET", group))

    async def delete_group(self, group: str) -> None:
        await self._send(self._group("DELETE", group))

    async def pull(
        self,
        group: str,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        topics: Sequence[str] | None = None,
        results: Sequence[QueueResult] = (),
        retry: RetryPolicy | None = None,
        max_per_key: int = 1,
        consumer: str | None = None,
    ) -> PullResult:
        call = self._pull(group, max_messages, wait_ms, topics, results, max_per_key, consumer)
        return await self._send(call, retry)

    async def ack(
        self,
        group: str,
        results: Sequence[QueueResult],
        retry: RetryPolicy | None = None,
        produce: Sequence[Produce] | None = None,
    ) -> AckResult:
        return await self._send(self._ack(group, results, produce), retry)

    async def extend(
        self,
        group: str,
        refs: Iterable[MessageRef],
        ack_timeout_ms: int,
        retry: RetryPolicy | None = None,
        attempts: Mapping[MessageRef, int] | None = None,
    ) -> ExtendResult:
        return await self._send(self._extend(group, refs, ack_timeout_ms, attempts), retry)

    async def seek(
        self, group: str, topic: str, to: SeekTarget, qid: int | None = None
    ) -> dict[str, Any]:
        return await self._send(self._seek(group, topic, to, qid))

    async def replay(
        self, group: str, topic: str, order_value: str, start: SeekTarget = "earliest"
    ) -> dict[str, Any]:
        return await self._send(self._replay(group, topic, order_value, start))

    async def dead_letters(
        self, group: str, *, topic: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        return await self._send(self._dead_letters(group, topic, limit))

    async def redrive(
        self,
        group: str,
        topic: str | None = None,
        messages: Sequence[MessageRef] | None = None,
    ) -> int:
        return await self._send(self._redrive(group, topic, messages))

    async def delete_dead_letters(
        self,
        group: str,
        *,
        topic: str | None = None,
        messages: Sequence[MessageRef] | None = None,
    ) -> int:
        return await self._send(self._delete_dead_letters(group, topic, messages))

    async def browse(
        self,
        topic: str,
        *,
        qid: int | None = None,
        start: int | None = None,
        from_ms: int | None = None,
        last: int | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        return await self._send(self._browse(topic, qid, start, from_ms, last, limit))

    async def blocked_keys(
        self,
        group: str,
        *,
        topic: str | None = None,
        min_blocked_ms: int | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        return await self._send(self._blocked_keys(group, topic, min_blocked_ms, limit))

    async def skip(self, group: str, topic: str, head: BlockedHead) -> MessageRef:
        return await self._send(self._blocked_key_action("skip", group, topic, head))

    async def release(self, group: str, topic: str, head: BlockedHead) -> MessageRef:
        return await self._send(self._blocked_key_action("release", group, topic, head))

    async def health(self) -> dict[str, Any]:
        return await self._send(self._health(), NO_RETRY)

    async def ready(self) -> bool:
        try:
            await self._send(self._ready(), NO_RETRY)
        except ServiceUnavailable:
            return False
        return True
