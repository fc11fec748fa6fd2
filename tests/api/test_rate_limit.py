"""Per-group ``max_per_second`` over HTTP: pull and push groups delivered at their rate, an
unlimited group on the same backlog unaffected, bad values refused, throttled time shown."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from consumer_sdk import Client, Producer, QueueResult
from tests.conftest import ServerFactory
from tests.push_receiver import Receiver
from tests.support import RunningServer, wait_until

WINDOW_S = 10.0


def backlog(url: str, count: int) -> None:
    with Producer(url) as producer:
        producer.create_topic("t", 4)
        for start in range(0, count, 1000):
            producer.send_batch(
                "t", [{"key": f"k{n % 997}", "body": {"n": n}} for n in range(start, start + 1000)]
            )


def consume(url: str, group: str, until: float, times: list[float]) -> None:
    """Pull and ack until ``until`` (monotonic); one arrival time per delivered message."""
    results: list[QueueResult] = []
    with Client(url) as client:
        while time.monotonic() < until:
            pulled = client.pull(group, max_messages=100, wait_ms=200, results=results)
            now = time.monotonic()
            times.extend([now] * len(pulled.messages))
            by_queue: dict[tuple[str, int], list[int]] = {}
            for m in pulled.messages:
                by_queue.setdefault((m.topic, m.qid), []).append(m.offset)
            results = [QueueResult(t, q, tuple(o)) for (t, q), o in by_queue.items()]


@pytest.mark.slow
def test_a_limited_pull_group_keeps_its_rate_and_an_unlimited_one_is_not_slowed(
    server: RunningServer,
) -> None:
    backlog(server.url, 30_000)
    with Client(server.url) as client:
        client.put_group("limited", {"topics": {"t": {}}, "max_per_second": 500})
        client.put_group("free", {"topics": {"t": {}}})
    limited: list[float] = []
    free: list[float] = []
    start = time.monotonic()
    until = start + WINDOW_S
    threads = [
        threading.Thread(target=consume, args=(server.url, "limited", until, limited)),
        threading.Thread(target=consume, args=(server.url, "free", until, free)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WINDOW_S + 30)
    rate = len(limited) / WINDOW_S
    assert 500 * 0.85 <= rate <= 500 * 1.15, f"limited group at {rate:.0f}/s"
    # The unlimited group drains the same backlog far faster than the limit.
    free_rate = len(free) / (free[-1] - start)
    assert free_rate >= 3 * 500, f"unlimited group at {free_rate:.0f}/s"
    with Client(server.url) as client:
        stats = client.get_group("limited")["stats"]
        assert stats["throttled_ms"] > 1000
        assert client.get_group("free")["stats"]["throttled_ms"] == 0
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    throttled = {
        s.labels["group"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "cproxy_throttled_seconds_total"
    }
    assert throttled["limited"] > 1 and throttled["free"] == 0


@pytest.mark.slow
def test_a_limited_push_group_is_pushed_at_its_rate(server_factory: ServerFactory) -> None:
    receiver = Receiver().start()
    try:
        # On loopback: pushing there takes the operator's listing.
        server = server_factory(push_allowed_urls=(receiver.url,))
        backlog(server.url, 4_000)
        with Client(server.url) as client:
            push = {"url": receiver.url}
            client.put_group("pushed", {"topics": {"t": {"push": push}}, "max_per_second": 200})
        wait_until(lambda: receiver.requests, 10, message="a first push")
        first = receiver.requests[0].at
        time.sleep(WINDOW_S + 0.5)  # the measured interval itself
        arrived = sum(len(r.messages) for r in list(receiver.requests) if r.at < first + WINDOW_S)
        rate = arrived / WINDOW_S
        assert 200 * 0.85 <= rate <= 200 * 1.15, f"push group at {rate:.0f}/s"
    finally:
        receiver.stop()


@pytest.mark.parametrize("value", [0, -1, 1_000_001, 2.5, "10", True])
def test_bad_max_per_second_is_422_invalid_config(server: RunningServer, value: Any) -> None:
    with Client(server.url) as client:
        client.create_topic("t", 1)
    answer = httpx.put(
        f"{server.url}/v1/groups/g", json={"topics": {"t": {}}, "max_per_second": value}
    )
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_config"
    assert error["message"] == f"max_per_second must be an integer in 1..1000000, got {value!r}"


def test_max_per_second_is_shown_and_null_clears_it(server: RunningServer) -> None:
    with Client(server.url) as client:
        client.create_topic("t", 1)
        shown = client.put_group("g", {"topics": {"t": {}}, "max_per_second": 1_000_000})
        assert shown["max_per_second"] == 1_000_000
        cleared = client.put_group("g", {"topics": {"t": {}}, "max_per_second": None})
        assert cleared["max_per_second"] is None
        assert client.get_group("g")["stats"]["throttled_ms"] == 0
