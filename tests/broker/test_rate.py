"""The token bucket behind ``max_per_second`` (cproxy.broker.rate), on a hand-driven clock."""

from __future__ import annotations

import pytest

from cproxy.broker import rate as rate_module
from cproxy.broker.rate import Rate


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
