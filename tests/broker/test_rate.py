"""The token bucket behind ``max_per_second`` (cproxy.broker.rate), on a hand-driven clock,
and a cluster proxy's share of it."""

from __future__ import annotations

import time

import anyio
import pytest

from cproxy.broker import rate as rate_module
from cproxy.broker.rate import Rate
from cproxy.model import NewMessage
from cproxy.store.memory import MemoryStore
from tests.broker.test_broker import config, running


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [100.0]
    monkeypatch.setattr(rate_module, "monotonic_s", lambda: now[0])
    return now


def test_burst_is_a_tenth_of_the_rate_and_refills_at_the_rate(clock: list[float]) -> None:
    rate = Rate(500)
    assert rate.allowance(1_000, clock[0]) == 50  # burst max(1, 500/10)
    rate.spend(50, clock[0])
    assert rate.allowance(1_000, clock[0]) == 0
    assert rate.held_back(clock[0]) == pytest.approx(1 / 500)
    clock[0] += 0.0625  # exact in binary: 31.25 tokens
    assert rate.allowance(1_000, clock[0]) == 31
    clock[0] += 10
    assert rate.allowance(1_000, clock[0]) == 50  # never more than the burst


def test_a_slow_rate_has_a_burst_of_one(clock: list[float]) -> None:
    rate = Rate(2)
    assert rate.allowance(10, clock[0]) == 1
    rate.spend(1, clock[0])
    assert rate.held_back(clock[0]) == pytest.approx(0.5)


def test_throttled_time_spans_held_back_until_a_delivery(clock: list[float]) -> None:
    rate = Rate(10)
    rate.spend(1, clock[0])
    assert rate.throttled_seconds(clock[0]) == 0
    rate.held_back(clock[0])
    clock[0] += 0.3
    rate.held_back(clock[0])  # still the same stretch
    assert rate.throttled_seconds(clock[0]) == pytest.approx(0.3)
    clock[0] += 0.2
    rate.spend(1, clock[0])
    clock[0] += 5
    assert rate.throttled_seconds(clock[0]) == pytest.approx(0.5)


def test_a_cluster_share_scales_rate_and_burst(clock: list[float]) -> None:
    rate = Rate(1000, share=0.25)
    assert (rate.rate, rate.burst) == (250, 25)
    rate.set_share(0)  # serves no queue: nothing to deliver, the limit stays whole
    assert rate.rate == 1000


async def test_a_cluster_proxy_takes_its_share_of_the_rate_by_owned_queues() -> None:
    """max_per_second 40 over 4 queues: owning one, a proxy's burst is max(1, 10/10) = 1; owning
    all four, max(1, 40/10) = 4 (a pull never gets more than the burst at once)."""
    store = MemoryStore()
    async with running(store, cluster=True) as broker:
        await broker.create_topic("t", 4)
        await broker.serve_queue("t", 0)
        await broker.put_group("g", config(max_per_second=40))
        await broker.produce("t", [NewMessage(f"k{n}", b"1") for n in range(400)])
        sizes = [len((await broker.pull("g", 100, 300, None, [])).deliveries) for _ in range(5)]
        assert max(sizes) == 1 and sum(sizes) >= 1
        for qid in (1, 2, 3):
            await broker.serve_queue("t", qid)
        largest = 0
        deadline = time.monotonic() + 10
        while largest < 4 and time.monotonic() < deadline:
            result = await broker.pull("g", 100, 300, None, [])
            largest = max(largest, len(result.deliveries))
            assert len(result.deliveries) <= 4
            await anyio.sleep(0.15)  # let the bucket fill: a whole burst needs 0.1 s at 40/s
        assert largest == 4
