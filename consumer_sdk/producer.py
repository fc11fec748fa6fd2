"""Producers: append messages to topics, with retries that never store a message twice
when it carries an id."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from consumer_sdk.client import AsyncClient, Client
from consumer_sdk.models import OutgoingMessage, SendResult


def _one(
    body: Any,
    key: str | None,
    headers: Mapping[str, str] | None,
    id: str | None,  # the wire name, as in send_batch
    qid: int | None,
) -> dict[str, Any]:
    return {"body": body, "key": key, "headers": headers, "id": id, "qid": qid}


class Producer(Client):
    """Sends messages to one server. Thread-safe; close it (or use ``with``) when done.

    Delivery: a returned :class:`SendResult` means the message is durably stored and will reach
    every group subscribed to the topic. Connection failures and 503 are retried with backoff
    (``retry``, default 5 tries) because they prove nothing was stored. A timeout or a reset
    after sending is retried only when every message of the call has an ``id``: the server's
    dedup then answers the repeat with ``duplicate=True`` instead of storing it again. Without
    ids such an error is raised, and the message may or may not have been stored.

    Queue choice: an explicit ``qid``; else a stable hash of ``key`` (Kafka's murmur2); else
    round robin. Messages with one key keep their order.
    """

    def send(
        self,
        topic: str,
        body: Any,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        id: str | None = None,
        qid: int | None = None,
    ) -> SendResult:
        """Send one message; ``body`` is any JSON-serialisable value."""
        return self.produce(topic, [_one(body, key, headers, id, qid)])[0]

    def send_batch(self, topic: str, messages: Iterable[OutgoingMessage]) -> list[SendResult]:
        """Send messages atomically (all stored or none); results are in input order.

        Each message is a mapping with ``body`` and optionally ``key``, ``headers``, ``id``,
        ``qid``. The server limits a call (by default 1000 messages and 8 MiB): split larger
        batches yourself, since splitting gives up atomicity.
        """
        return self.produce(topic, messages)


class AsyncProducer(AsyncClient):
    """The ``async`` twin of :class:`Producer`; same delivery and retry semantics."""

    async def send(
        self,
        topic: str,
        body: Any,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        id: str | None = None,
        qid: int | None = None,
    ) -> SendResult:
        """Send one message; ``body`` is any JSON-serialisable value."""
        return (await self.produce(topic, [_one(body, key, headers, id, qid)]))[0]

    async def send_batch(self, topic: str, messages: Iterable[OutgoingMessage]) -> list[SendResult]:
        """Send messages atomically (all stored or none); results are in input order."""
        return await self.produce(topic, messages)
