"""Acceptance with real proxy subprocesses on one real PostgreSQL (issue 11).

Each test gets a fresh database on the session's server; proxies run with 100 ms heartbeats
and 600 ms leases (``proxies.CLUSTER_TOML``) so hand-overs and takeovers are quick.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.cluster.proxies import ACK_TIMEOUT_MS, Proxy, Puller, Record
from tests.support import wait_until

QUEUES = 4
KEYS = 24

ProxyFactory = Callable[[str], Proxy]


@pytest.fixture
def proxies(pg_dsn: str, tmp_path: Path) -> Iterator[ProxyFactory]:
    started: list[Proxy] = []

    def start(node_id: str) -> Proxy:
        proxy = Proxy(tmp_path, pg_dsn, node_id).start()
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


def setup(via: Proxy, group_via: Proxy) -> None:
    httpx.post(f"{via.url}/v1/topics", json={"name": "rides", "queues": QUEUES}).raise_for_status()
    httpx.put(
        f"{group_via.url}/v1/groups/billing",
        json={"topics": {"rides": {"order_by": "key"}}, "ack_timeout_ms": ACK_TIMEOUT_MS},
    ).raise_for_status()


def spread(members: list[Proxy]) -> dict[str, set[int]]:
    """Wait until every queue has exactly one owner among ``members``, each owning some."""

    def settled() -> dict[str, set[int]] | None:
        owned = {p.node_id: p.owned() for p in members}
        qids = [q for qs in owned.values() for q in qs]
        if sorted(qids) == list(range(QUEUES)) and all(owned.values()):
            return owned
        return None

    return wait_until(settled, 20, 0.05, "queues spread over the proxies")


class Producer:
    """Produces keyed messages round robin over proxies; remembers every accepted one."""

    def __init__(self) -> None:
        self.sent: dict[tuple[int, int], str] = {}
        self._n = itertools.count()

    def send(self, targets: list[Proxy], count: int, batch: int = 20) -> None:
        urls = itertools.cycle([p.url for p in targets])
        for _ in range(0, count, batch):
            msgs = []
            for _ in range(batch):
                n = next(self._n)
                msgs.append({"key": f"k{n % KEYS}", "body": {"n": n}})
            answer = httpx.post(f"{next(urls)}/v1/topics/rides/messages", json={"messages": msgs})
            answer.raise_for_status()
            for m, r in zip(msgs, answer.json()["results"], strict=True):
                self.sent[r["qid"], r["offset"]] = str(m["key"])


def all_acked(record: Record, producer: Producer) -> bool:
    with record.lock:
        return set(producer.sent) <= set(record.acked)


def start_pullers(
    targets: list[Proxy], count: int, record: Record, stop: threading.Event, hold_s: float = 0
) -> list[Puller]:
    pullers = [
        Puller(targets[i % len(targets)].url, "billing", record, stop, hold_s) for i in range(count)
    ]
    for p in pullers:
        p.start()
    return pullers


def finish(pullers: list[Puller], stop: threading.Event) -> None:
    stop.set()
    for p in pullers:
        p.join(30)


def test_three_proxies_eight_pullers_deliver_everything_in_key_order(
    proxies: ProxyFactory,
) -> None:
    members = [proxies(f"p{i}") for i in range(3)]
    setup(members[0], members[1])
    spread(members)
    record, stop, producer = Record(), threading.Event(), Producer()
    pullers = start_pullers(members, 8, record, stop)
    producer.send(members, 600)
    wait_until(lambda: all_acked(record, producer), 60, 0.05, "every message acked")
    finish(pullers, stop)
    assert record.order_violations() == []
    assert record.duplicates() == {}
    assert {ref: record.keys[ref] for ref in producer.sent} == producer.sent
    # Every proxy served some of the messages.
    served = {url for ds in record.deliveries.values() for _, _, url in ds}
    assert served == {p.url for p in members}
