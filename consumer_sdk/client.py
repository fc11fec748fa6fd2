"""Typed HTTP clients for one cproxy server: :class:`Client` and its async twin.

Both speak the JSON API of docs/api.md and share everything but I/O with
:class:`consumer_sdk._base.BaseClient`. Calls are retried per their :class:`RetryPolicy` on
transport errors and 503; a call that may already have been applied (timeout, reset) is only
repeated when it is idempotent (``pull`` never is; ``produce`` is when every message has an id).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import httpx

from consumer_sdk._base import BaseClient, Call
from consumer_sdk.config import RetryPolicy
from consumer_sdk.errors import CproxyError
from consumer_sdk.models import (
    AckResult,
    ExtendResult,
    MessageRef,
    OutgoingMessage,
    PullResult,
    QueueResult,
    SendResult,
    TopicInfo,
)

DEFAULT_TIMEOUT_MS = 10_000


class Client(BaseClient):
    """Blocking client for one server. Thread-safe; close it (or use ``with``) when done.

    ``timeout_ms`` bounds each HTTP call (a pull adds its ``wait_ms``); ``retry`` sets how
    transient errors are retried; ``transport`` lets tests or custom networking replace the
    HTTPX transport.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(url, token=token, timeout_ms=timeout_ms, retry=retry or RetryPolicy())
        self._http = httpx.Client(base_url=self.url, headers=self._headers, transport=transport)

    def close(self) -> None:
        """Close the connection pool; idempotent."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _request(self, call: Call, retry: RetryPolicy | None = None) -> Any:
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
            except CproxyError as exc:
                delay_ms = self._retry_delay_ms(exc, call, attempt, policy)
                if delay_ms is None:
                    raise
            time.sleep(delay_ms / 1000)
            attempt += 1

    # -- topics ------------------------------------------------------------------------------
    def create_topic(self, name: str, queues: int) -> TopicInfo:
        """Create a topic with ``queues`` queues; the same call again is a no-op (409 if the
        queue count differs)."""
        return self._parse_topic(self._request(self._create_topic_call(name, queues)))

    def get_topic(self, name: str) -> dict[str, Any]:
        """``{"name", "queues", "queue_stats": [{"qid", "min_offset", "next_offset"}]}``."""
        return dict(self._request(self._topic_call(name)))

    def list_topics(self) -> list[TopicInfo]:
        data = self._request(Call("GET", "/v1/topics"))
        return [self._parse_topic(t) for t in data.get("topics", [])]

    def produce(self, topic: str, messages: Iterable[OutgoingMessage]) -> list[SendResult]:
        """Append messages atomically; results are in input order. See :class:`Producer`."""
        call = self._produce_call(topic, messages)
        return self._parse_send(self._request(call), len(call.body["messages"]))

    # -- groups ------------------------------------------------------------------------------
    def put_group(self, group: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """Create or update a group; returns the effective config with defaults filled in."""
        return dict(self._request(self._group_call("PUT", group, body=dict(config))))

    def get_group(self, group: str) -> dict[str, Any]:
        """The group's config and stats (``in_flight``, ``ready``, per-queue ``lag``...)."""
        return dict(self._request(self._group_call("GET", group)))

    def delete_group(self, group: str) -> None:
        self._request(self._group_call("DELETE", group))

    def pull(
        self,
        group: str,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        topics: Sequence[str] | None = None,
        results: Sequence[QueueResult] = (),
        retry: RetryPolicy | None = None,
    ) -> PullResult:
        """Apply ``results``, then take up to ``max_messages`` messages, waiting up to
        ``wait_ms`` for one. Every message returned is in flight until acked or failed."""
        call = self._pull_call(group, max_messages, wait_ms, topics, results)
        return self._parse_pull(self._request(call, retry))

    def ack(
        self, group: str, results: Sequence[QueueResult], retry: RetryPolicy | None = None
    ) -> AckResult:
        """Send acks/fails without pulling (``POST /v1/groups/{group}/ack``)."""
        return self._parse_ack(self._request(self._ack_call(group, results), retry))

    def extend(
        self,
        group: str,
        refs: Iterable[MessageRef],
        ack_timeout_ms: int,
        retry: RetryPolicy | None = None,
    ) -> ExtendResult:
        """Move the ack deadline of in-flight messages to now + ``ack_timeout_ms``."""
        call = self._extend_call(group, refs, ack_timeout_ms)
        return self._parse_extend(self._request(call, retry))

    def seek(
        self, group: str, topic: str, to: str | int | Mapping[str, int], qid: int | None = None
    ) -> dict[str, Any]:
        """Move the group to ``"earliest"``, ``"latest"``, an offset or ``{"timestamp_ms": n}``."""
        body = {"topic": topic, "qid": qid, "to": to}
        return dict(self._request(self._group_call("POST", group, "/seek", body)) or {})

    def dead_letters(
        self, group: str, *, topic: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        params = {k: str(v) for k, v in (("topic", topic), ("limit", limit)) if v is not None}
        call = Call("GET", self._group_call("GET", group, "/dead-letters").path, params=params)
        return list(self._request(call).get("dead_letters", []))

    def redrive(self, group: str, topic: str | None = None) -> int:
        """Deliver the group's dead letters again (to this group only); returns how many."""
        body = {"topic": topic} if topic is not None else {}
        call = Call(
            "POST",
            self._group_call("POST", group, "/dead-letters/redrive").path,
            body,
            idempotent=False,
        )
        return int(self._request(call).get("redriven", 0))

    def blocked_keys(self, group: str) -> list[dict[str, Any]]:
        """Order values whose head is retrying or unacked (see docs/api.md)."""
        return list(
            self._request(self._group_call("GET", group, "/blocked-keys")).get("blocked_keys", [])
        )


class AsyncClient(BaseClient):
    """The ``async`` twin of :class:`Client`: same methods, same semantics, awaitable."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        max_connections: int = 100,
    ) -> None:
        super().__init__(url, token=token, timeout_ms=timeout_ms, retry=retry or RetryPolicy())
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=self._headers, transport=transport, limits=limits
        )

    async def aclose(self) -> None:
        """Close the connection pool; idempotent."""
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _request(self, call: Call, retry: RetryPolicy | None = None) -> Any:
        policy = retry or self.retry
        attempt = 1
        while True:
            try:
                try:
                    response = await self._http.request(
                        call.method, call.path, **self._request_args(call)
                    )
                except httpx.HTTPError as exc:
                    raise self._translate(exc, call) from exc
                return self._decode(response, call)
            except CproxyError as exc:
                delay_ms = self._retry_delay_ms(exc, call, attempt, policy)
                if delay_ms is None:
                    raise
            await asyncio.sleep(delay_ms / 1000)
            attempt += 1

    async def create_topic(self, name: str, queues: int) -> TopicInfo:
        return self._parse_topic(await self._request(self._create_topic_call(name, queues)))

    async def get_topic(self, name: str) -> dict[str, Any]:
        return dict(await self._request(self._topic_call(name)))

    async def list_topics(self) -> list[TopicInfo]:
        data = await self._request(Call("GET", "/v1/topics"))
        return [self._parse_topic(t) for t in data.get("topics", [])]

    async def produce(self, topic: str, messages: Iterable[OutgoingMessage]) -> list[SendResult]:
        call = self._produce_call(topic, messages)
        return self._parse_send(await self._request(call), len(call.body["messages"]))

    async def put_group(self, group: str, config: Mapping[str, Any]) -> dict[str, Any]:
        return dict(await self._request(self._group_call("PUT", group, body=dict(config))))

    async def get_group(self, group: str) -> dict[str, Any]:
        return dict(await self._request(self._group_call("GET", group)))

    async def delete_group(self, group: str) -> None:
        await self._request(self._group_call("DELETE", group))

    async def pull(
        self,
        group: str,
        *,
        max_messages: int = 32,
        wait_ms: int = 0,
        topics: Sequence[str] | None = None,
        results: Sequence[QueueResult] = (),
        retry: RetryPolicy | None = None,
    ) -> PullResult:
        call = self._pull_call(group, max_messages, wait_ms, topics, results)
        return self._parse_pull(await self._request(call, retry))

    async def ack(
        self, group: str, results: Sequence[QueueResult], retry: RetryPolicy | None = None
    ) -> AckResult:
        return self._parse_ack(await self._request(self._ack_call(group, results), retry))

    async def extend(
        self,
        group: str,
        refs: Iterable[MessageRef],
        ack_timeout_ms: int,
        retry: RetryPolicy | None = None,
    ) -> ExtendResult:
        call = self._extend_call(group, refs, ack_timeout_ms)
        return self._parse_extend(await self._request(call, retry))

    async def seek(
        self, group: str, topic: str, to: str | int | Mapping[str, int], qid: int | None = None
    ) -> dict[str, Any]:
        body = {"topic": topic, "qid": qid, "to": to}
        return dict(await self._request(self._group_call("POST", group, "/seek", body)) or {})

    async def dead_letters(
        self, group: str, *, topic: str | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        params = {k: str(v) for k, v in (("topic", topic), ("limit", limit)) if v is not None}
        call = Call("GET", self._group_call("GET", group, "/dead-letters").path, params=params)
        return list((await self._request(call)).get("dead_letters", []))

    async def redrive(self, group: str, topic: str | None = None) -> int:
        body = {"topic": topic} if topic is not None else {}
        call = Call(
            "POST",
            self._group_call("POST", group, "/dead-letters/redrive").path,
            body,
            idempotent=False,
        )
        return int((await self._request(call)).get("redriven", 0))

    async def blocked_keys(self, group: str) -> list[dict[str, Any]]:
        data = await self._request(self._group_call("GET", group, "/blocked-keys"))
        return list(data.get("blocked_keys", []))
