"""Test doubles and helpers for the Spark sink tests (a uniquely named module, importable
from test files without the ambiguity of ``import conftest``)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from consumer_sdk import Client, Message, QueueResult


@dataclass
class Stored:
    qid: int
    offset: int
    key: str | None
    body: Any
    id: str | None
    headers: dict[str, str] | None


@dataclass
class FakeCproxy:
    """Produce endpoint with the contract's dedup and atomicity, in memory."""

    queues: int = 4
    messages: list[Stored] = field(default_factory=list)
    by_id: dict[str, Stored] = field(default_factory=dict)
    calls: list[int] = field(default_factory=list)
    #: Statuses to answer with before handling calls; popped one per call.
    fail_next: list[int] = field(default_factory=list)
    #: Like ``fail_next`` but the batch is stored first (a lost response).
    store_then_fail: list[int] = field(default_factory=list)
    requests: list[httpx.Request] = field(default_factory=list)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.method == "GET" and request.url.path.startswith("/v1/topics/"):
            return httpx.Response(200, json={"name": "t", "queues": self.queues})
        if self.fail_next:
            return _error(self.fail_next.pop(0))
        payload = orjson.loads(request.content)["messages"]
        self.calls.append(len(payload))
        results = [self._append(m) for m in payload]
        if self.store_then_fail:
            return _error(self.store_then_fail.pop(0))
        return httpx.Response(200, json={"results": results})

    def _append(self, message: dict[str, Any]) -> dict[str, Any]:
        existing = self.by_id.get(message["id"]) if message.get("id") else None
        if existing is not None:
            return {"qid": existing.qid, "offset": existing.offset, "duplicate": True}
        key = message.get("key")
        qid = sum(key.encode()) % self.queues if key is not None else 0
        offset = sum(1 for m in self.messages if m.qid == qid)
        stored = Stored(
            qid, offset, key, message["body"], message.get("id"), message.get("headers")
        )
        self.messages.append(stored)
        if stored.id:
            self.by_id[stored.id] = stored
        return {"qid": qid, "offset": offset, "duplicate": False}

    def bodies_by_key(self) -> dict[str | None, list[Any]]:
        grouped: dict[str | None, list[Any]] = {}
        for m in self.messages:
            grouped.setdefault(m.key, []).append(m.body)
        return grouped


def _error(status: int) -> httpx.Response:
    return httpx.Response(
        status, json={"error": {"code": "injected", "message": f"injected {status}"}}
    )


class ServerIO:
    """Small helpers over the HTTP API of a real server (through the SDK client), for the
    Spark tests."""

    def __init__(self, url: str) -> None:
        self.url = url

    def new_topic(self, queues: int = 4) -> str:
        """A topic with a unique name, so tests never see each other's messages."""
        name = f"spark-{uuid.uuid4().hex[:12]}"
        with Client(self.url) as client:
            client.create_topic(name, queues)
        return name

    def total(self, topic: str) -> int:
        """Messages stored in ``topic`` according to its queue stats."""
        with Client(self.url) as client:
            stats = client.get_topic(topic)["queue_stats"]
        return sum(q["next_offset"] - q["min_offset"] for q in stats)

    def read(self, topic: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Every stored message of ``topic`` sorted by (qid, offset), via a fresh group.

        The group orders by nothing so every message is ready at once; it pulls (acking on
        the next pull) until as many messages arrived as the queue stats report.
        """
        expected = self.total(topic)
        group = f"reader-{uuid.uuid4().hex[:12]}"
        seen: dict[tuple[int, int], Message] = {}
        with Client(self.url) as client:
            client.put_group(group, {"topics": {topic: {"order_by": "none"}}})
            acks: list[QueueResult] = []
            deadline = time.monotonic() + timeout_s
            while len(seen) < expected:
                assert time.monotonic() < deadline, f"read {len(seen)} of {expected} messages"
                pulled = client.pull(group, max_messages=500, wait_ms=200, results=acks)
                by_queue: dict[int, list[int]] = {}
                for message in pulled.messages:
                    seen[(message.qid, message.offset)] = message
                    by_queue.setdefault(message.qid, []).append(message.offset)
                acks = [QueueResult(topic, q, acks=tuple(o)) for q, o in by_queue.items()]
            client.delete_group(group)
        return [seen[ref].to_dict() for ref in sorted(seen)]

    def bodies_by_key(self, topic: str) -> dict[str | None, list[Any]]:
        """Bodies per key in stored order (a key lives in one queue, so offsets order it)."""
        grouped: dict[str | None, list[Any]] = {}
        for message in self.read(topic):
            grouped.setdefault(message["key"], []).append(message["body"])
        return grouped
