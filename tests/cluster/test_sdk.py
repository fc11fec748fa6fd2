"""The SDK over several proxies: a proxy that is down costs a retry elsewhere, and with
``discover=True`` producers and consumers find the proxies through ``GET /v1/cluster``."""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict

import pytest

from consumer_sdk import AsyncConsumer, AsyncProducer, Consumer, Message, Producer, RetryPolicy
from consumer_sdk.errors import ConnectError
from tests.cluster.conftest import ProxyFactory
from tests.cluster.proxies import ACK_TIMEOUT_MS, Proxy
from tests.conftest import ServerFactory
from tests.store.pg_server import free_port
from tests.support import RunningServer, wait_until

FAST = RetryPolicy(max_attempts=2, initial_backoff_ms=1, max_backoff_ms=1)


def test_a_producer_moves_on_from_a_proxy_that_is_down(server: RunningServer) -> None:
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with Producer([down, server.url], retry=FAST) as producer:
        server.client().post("/v1/topics", json={"name": "sdk-cluster", "queues": 2})
        first = producer.send("sdk-cluster", {"n": 1}, key="a")
        assert producer.url == server.url  # it stays with the proxy that answered
        rest = producer.send_batch("sdk-cluster", [{"body": {"n": n}, "key": "a"} for n in (2, 3)])
    assert [r.offset for r in (first, *rest)] == [0, 1, 2]
    assert len({r.qid for r in (first, *rest)}) == 1


def test_a_producer_raises_when_every_proxy_is_down() -> None:
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    with Producer(urls, retry=FAST) as producer, pytest.raises(ConnectError):
        producer.send("t", 1)


async def test_an_async_producer_moves_on_when_its_proxy_goes_down(
    server_factory: ServerFactory,
) -> None:
    servers = {s.url: s for s in (server_factory(), server_factory())}
    for s in servers.values():
        s.client().post("/v1/topics", json={"name": "sdk-cluster", "queues": 2})
    async with AsyncProducer(list(servers), retry=FAST) as producer:
        first = await producer.send("sdk-cluster", {"n": 1}, key="a")
        used = producer.url
        servers[used].stop()
        second = await producer.send("sdk-cluster", {"n": 2}, key="a")
        assert producer.url != used  # the other proxy took the call, and keeps the next
        third = await producer.send("sdk-cluster", {"n": 3}, key="a")
        assert producer.url != used
    # The second proxy has its own store here: its offsets start again at 0.
    assert (first.offset, second.offset, third.offset) == (0, 0, 1)


async def test_an_async_producer_raises_when_every_proxy_is_down() -> None:
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    async with AsyncProducer(urls, retry=FAST) as producer:
        with pytest.raises(ConnectError):
            await producer.send("t", 1)


async def test_discovery_on_a_single_sqlite_server_uses_the_given_url(
    server: RunningServer,
) -> None:
    """``GET /v1/cluster`` answers 404 there: producers and consumers just use the URL."""
    async with AsyncProducer(server.url, discover=True) as producer:
        await producer.create_topic("solo", 2)
        sent = [await producer.send("solo", {"n": n}, key=f"k{n % 3}") for n in range(6)]
        assert producer.urls == [server.url]
    with Producer(server.url + "/", discover=True) as sync_producer:
        sent.append(sync_producer.send("solo", {"n": 6}, key="k0"))
        assert sync_producer.urls == [server.url]
    seen: list[Message] = []
    async with AsyncConsumer(
        server.url, group="solo", topics=["solo"], ensure_group={"order_by": "key"},
        discover=True, discover_interval_ms=100, wait_ms=100,
    ) as consumer:  # fmt: skip
        assert consumer.active_servers == [server.url]
        async for msg in consumer:
            seen.append(msg)
            if len(seen) == len(sent):
                break
    assert sorted((m.qid, m.offset) for m in seen) == sorted((r.qid, r.offset) for r in sent)


# -- a real cluster ------------------------------------------------------------------------
QUEUES = 6
KEYS = 8


def owners_settle(members: list[Proxy]) -> None:
    """Wait until every queue is owned by one of ``members``, each owning some."""

    def settled() -> bool:
        owned = [p.owned() for p in members]
        qids = sorted(q for qs in owned for q in qs)
        return qids == list(range(QUEUES)) and all(owned)

    wait_until(settled, 30, 0.05, f"queues spread over {[p.node_id for p in members]}")


class Seen:
    """What the consumer's handler saw, in call order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, int, int]] = []  # (key, qid, offset)

    def handle(self, msg: Message) -> None:
        with self.lock:
            self.calls.append((msg.key or "", msg.qid, msg.offset))

    def refs(self) -> set[tuple[int, int]]:
        with self.lock:
            return {(qid, offset) for _, qid, offset in self.calls}

    def order_violations(self) -> list[str]:
        """Per key, first deliveries must come in offset order (a key lives in one queue)."""
        by_key: dict[str, list[int]] = defaultdict(list)
        with self.lock:
            for key, _, offset in self.calls:
                if offset not in by_key[key]:
                    by_key[key].append(offset)
        return [f"{k}: {offs}" for k, offs in by_key.items() if offs != sorted(offs)]


def test_a_consumer_given_one_proxy_discovers_and_follows_the_cluster(
    proxies: ProxyFactory,
) -> None:
    """One URL, ``discover=True``: the consumer pulls from every live proxy (each pull returns
    only the queues its proxy owns), starts pulling a proxy that joins, stops pulling one that
    left, and receives every message in per-key order throughout."""
    p0, p1 = proxies("p0", "p1")
    seen = Seen()
    n = itertools.count()
    sent: set[tuple[int, int]] = set()
    with Producer(p0.url, discover=True) as producer:

        def send(count: int) -> None:
            batch = [{"body": {"n": i}, "key": f"k{i % KEYS}"} for i in itertools.islice(n, count)]
            sent.update((r.qid, r.offset) for r in producer.send_batch("rides", batch))
            wait_until(lambda: sent <= seen.refs(), 20, 0.02, "every message consumed")

        producer.create_topic("rides", QUEUES)
        owners_settle([p0, p1])
        with Consumer(
            p0.url, group="billing", topics=["rides"], handler=seen.handle,
            ensure_group={"order_by": "key", "ack_timeout_ms": ACK_TIMEOUT_MS},
            discover=True, discover_interval_ms=200, wait_ms=200,
        ) as consumer:  # fmt: skip
            assert sorted(consumer.active_servers) == sorted([p0.url, p1.url])
            assert set(producer.urls) == {p0.url, p1.url}
            send(40)

            (p2,) = proxies("p2")
            owners_settle([p0, p1, p2])
            wait_until(lambda: p2.url in consumer.active_servers, 10, 0.02, "p2 discovered")
            send(40)  # some of these land in queues only p2 hands out

            p2.stop()  # SIGTERM: hands its queues over, then leaves
            owners_settle([p0, p1])
            wait_until(lambda: p2.url not in consumer.active_servers, 10, 0.02, "p2 retired")
            send(40)
    assert sent == seen.refs()
    assert not seen.order_violations()
