"""Handlers that return ``Produce``: the ack and the outputs in one call (docs/sdk.md),
with the sync and the async consumer against a real server."""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict

import pytest

from consumer_sdk import AsyncConsumer, Client, Consumer, Message, Produce, Producer
from consumer_sdk.errors import ResourceConflict
from consumer_sdk.models import QueueResult
from tests.pipeline import read_all
from tests.support import RunningServer, wait_until

FAST_GROUP = {"retry_backoff_ms": [10], "max_attempts": 5}


def setup_topics(url: str, messages: int, keys: int) -> None:
    with Producer(url) as producer:
        producer.create_topic("in", 2)
        producer.create_topic("out", 2)
        producer.send_batch(
            "in", [{"key": f"k{n % keys}", "body": {"n": n}} for n in range(messages)]
        )


def test_a_handler_returning_produce_stores_one_output_per_input(server: RunningServer) -> None:
    setup_topics(server.url, 200, 8)

    def handle(msg: Message) -> Produce | None:
        n = msg.body["n"]
        if msg.attempt == 1 and n % 23 == 0:
            raise ValueError("boom")
        if n % 10 == 9:
            return None  # no output: a plain ack
        return Produce("out", [{"key": msg.key, "body": {"from": n}}])

    consumer = Consumer(
        server.url,
        group="enrich",
        topics=["in"],
        handler=handle,
        concurrency=4,
        wait_ms=200,
        ensure_group={"order_by": "key", **FAST_GROUP},
    )
    expected = [n for n in range(200) if n % 10 != 9]
    with consumer:
        wait_until(lambda: consumer.stats().acked >= 200, 30, message="all inputs acked")
    outs = read_all(server.url, "out", len(expected), timeout_s=20)
    assert sorted(m.body["from"] for m in outs) == expected
    by_key: dict[str | None, list[int]] = defaultdict(list)
    for m in outs:
        by_key[m.key].append(m.body["from"])
    for key, ns in by_key.items():
        assert ns == sorted(ns), key


async def test_the_async_consumer_sends_outputs_too_in_runs(server: RunningServer) -> None:
    setup_topics(server.url, 100, 2)

    async def handle(msg: Message) -> list[Produce]:
        await asyncio.sleep(0)
        n = msg.body["n"]
        return [
            Produce("out", [{"key": msg.key, "body": {"from": n}}]),
            Produce("out", [{"key": msg.key, "body": {"from": n, "copy": True}}]),
        ]

    async with AsyncConsumer(
        server.url,
        group="aenrich",
        topics=["in"],
        handler=handle,
        max_per_key=8,
        wait_ms=200,
        ensure_group={"order_by": "key", **FAST_GROUP},
    ) as consumer:
        for _ in range(600):
            if consumer.stats().acked >= 100:
                break
            await asyncio.sleep(0.05)
        # Each run's next message was held only after the outputs before it were stored.
        assert consumer.stats().unknown_results == 0
    outs = read_all(server.url, "out", 200, timeout_s=20)
    assert len(outs) == 200
    by_key: dict[str | None, list[int]] = defaultdict(list)
    for m in outs:
        if "copy" not in m.body:
            by_key[m.key].append(m.body["from"])
    assert sorted(n for ns in by_key.values() for n in ns) == list(range(100))
    for key, ns in by_key.items():
        assert ns == sorted(ns), key


def test_the_client_raises_stale_results_and_stores_nothing(server: RunningServer) -> None:
    setup_topics(server.url, 1, 1)
    with Client(server.url) as client:
        client.put_group("g", {"topics": {"in": {"order_by": "key"}}})
        (msg,) = client.pull("g", max_messages=1, wait_ms=2000).messages
        result = QueueResult(msg.topic, msg.qid, (msg.offset,), (), ((msg.offset, msg.attempt),))
        out = [Produce("out", [{"body": 1}])]
        answer = client.ack("g", [result], produce=out)
        assert answer.applied == 1 and len(answer.produced) == 1
        with pytest.raises(ResourceConflict) as caught:
            client.ack("g", [result], produce=out)
        assert caught.value.code == "stale_results"
    assert len(read_all(server.url, "out", 1, timeout_s=20)) == 1


def test_a_late_handler_s_outputs_are_dropped_and_stored_once(server: RunningServer) -> None:
    setup_topics(server.url, 4, 4)
    late = threading.Event()

    def handle(msg: Message) -> Produce:
        if msg.body["n"] == 0 and msg.attempt == 1:
            late.wait(0.8)  # past the ack timeout, and no lease extension: redelivered
        return Produce("out", [{"key": msg.key, "body": {"from": msg.body["n"]}}])

    consumer = Consumer(
        server.url,
        group="late",
        topics=["in"],
        handler=handle,
        concurrency=4,
        wait_ms=100,
        extend_after_ms=60_000,
        ensure_group={"order_by": "key", "ack_timeout_ms": 300, "retry_backoff_ms": [10]},
    )
    with consumer:
        wait_until(lambda: consumer.stats().unknown_results >= 1, 20, message="a stale ack")
        wait_until(lambda: consumer.stats().acked >= 4, 20, message="every input acked")
    outs = read_all(server.url, "out", 4, timeout_s=20)
    assert sorted(m.body["from"] for m in outs) == [0, 1, 2, 3]
