"""Consumers with ``discover=True`` against fake proxies: pullers follow ``GET /v1/cluster``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from consumer_sdk import AsyncConsumer, Message

from .fake import FakeServer, async_wait_for

A, B = "http://a", "http://b"


class FakeCluster:
    """Fake proxies behind one transport, a member list for ``GET /v1/cluster``, and proxies
    that are down (connection refused)."""

    def __init__(self, *servers: FakeServer) -> None:
        self.servers = {httpx.URL(s.url).host: s for s in servers}
        self.members = [s.url for s in servers]
        self.down: set[str] = set()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if f"http://{host}" in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/v1/cluster":
            members = [{"node": u, "url": u, "heartbeat_ms_ago": 0} for u in self.members]
            return httpx.Response(200, json={"node": host, "members": members, "queues": []})
        return await self.servers[host].handle(request)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)


def fakes() -> tuple[FakeServer, FakeServer]:
    a, b = FakeServer(A), FakeServer(B)
    for fake in (a, b):
        fake.add_topic("rides")
        fake.add_group("g", topics={"rides": {"order_by": "key"}})
    return a, b


def consumer(cluster: FakeCluster, handler: Any) -> AsyncConsumer:
    return AsyncConsumer(
        A, group="g", handler=handler, transport=cluster.transport(), handle_signals=False,
        discover=True, discover_interval_ms=100, wait_ms=20, flush_timeout_ms=300,
    )  # fmt: skip


async def test_a_joining_proxy_gets_a_puller_and_one_that_comes_back_gets_one_again() -> None:
    a, b = fakes()
    cluster = FakeCluster(a, b)
    cluster.members = [A]
    seen: list[tuple[str, int]] = []

    async def handle(msg: Message) -> None:
        seen.append((msg.server, msg.offset))

    b.produce("rides", {"n": 0}, key="k")
    async with consumer(cluster, handle) as c:
        assert c.active_servers == [A]  # given only A, told only of A
        cluster.members = [A, B]
        await async_wait_for(lambda: (B, 0) in seen)
        assert c.active_servers == [A, B]

        cluster.members = [A]
        await async_wait_for(lambda: c.active_servers == [A])
        b.produce("rides", {"n": 1}, key="k")
        cluster.members = [B, A]
        await async_wait_for(lambda: (B, 1) in seen)
    assert seen == [(B, 0), (B, 1)]
    assert all(m.state == "done" for m in b.messages)


async def test_results_for_a_proxy_that_left_and_is_down_are_given_up_after_flush_timeout() -> None:
    a, b = fakes()
    cluster = FakeCluster(a, b)
    release = asyncio.Event()
    started = asyncio.Event()

    async def handle(msg: Message) -> None:
        if msg.server == B:
            started.set()
            await release.wait()

    b.produce("rides", {"n": 0}, key="k")
    c = consumer(cluster, handle)
    async with c:
        assert sorted(c.active_servers) == [A, B]
        await asyncio.wait_for(started.wait(), 10)
        cluster.members, cluster.down = [A], {B}  # B crashed and left the cluster
        await async_wait_for(lambda: c.active_servers == [A])
        release.set()  # the ack for B's message cannot be delivered any more
        await async_wait_for(lambda: c.stats().acked == 1)
        await async_wait_for(lambda: c.stats().pending_results == 0, 5)  # given up
        a.produce("rides", {"n": 1}, key="k")  # the consumer keeps working on A meanwhile
        await async_wait_for(lambda: a.messages[0].state == "done")
        before_stop = time.monotonic()
    assert time.monotonic() - before_stop < 1  # nothing left to flush at stop
    assert b.messages[0].state == "in_flight"  # B's successor redelivers it after its timeout
