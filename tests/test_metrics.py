"""The produce-to-ack histogram, bucketed in batches, writes what prometheus_client's own
``Histogram`` writes for the same values (cproxy/metrics.py)."""

from __future__ import annotations

import itertools
import random

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from cproxy.metrics import _FLUSH_AT, _LATENCY_BUCKETS, Metrics


def _series(text: bytes) -> dict[str, float]:
    out = {}
    for line in text.decode().splitlines():
        if line.startswith("cproxy_produce_to_ack_seconds"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.mark.parametrize("count", [0, 7, _FLUSH_AT, 3 * _FLUSH_AT + 5])
def test_ack_latency_matches_a_plain_histogram(count: int) -> None:
    metrics = Metrics()
    observe = metrics.ack_latency_observer("g")
    metrics.ack_latency_observer("idle")
    reference = Histogram(
        "cproxy_produce_to_ack_seconds",
        "From produce to ack of a message",
        ["group"],
        buckets=_LATENCY_BUCKETS,
        registry=(registry := CollectorRegistry()),
    )
    reference.labels("g")
    reference.labels("idle")
    rng = random.Random(count)
    # Values on the bucket bounds too: buckets are inclusive ("le").
    values = [rng.choice([*_LATENCY_BUCKETS, rng.random() * 400]) for _ in range(count)]
    # In batches of varying size, one per pull that acked something.
    sizes = itertools.cycle([1, 7, 100, 3])
    done = 0
    scraped = False
    while done < count:
        batch = values[done : done + next(sizes)]
        observe(batch)
        for value in batch:
            reference.labels("g").observe(value)
        done += len(batch)
        if not scraped and done >= count // 2:
            metrics.render()  # a scrape in the middle flushes what is pending
            scraped = True
    got, expected = _series(metrics.render()), _series(generate_latest(registry))
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        if "_sum{" in key:  # summed in another order
            assert got[key] == pytest.approx(value)
        else:
            assert got[key] == value, key
    assert got['cproxy_produce_to_ack_seconds_count{group="g"}'] == count
