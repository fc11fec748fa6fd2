"""Prometheus metrics.

Counters and gauges of the delivery engine are read from the engines at scrape time by a
custom collector, so the hot path only bumps plain integers. Only the two histograms
(pull latency, produce-to-ack latency) are observed as events happen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from cproxy.broker import Broker

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
)

_COUNTERS = (
    "delivered",
    "acked",
    "failed",
    "timed_out",
    "retried",
    "dead_lettered",
    "lost_to_retention",
    "filtered",
)


class _EngineCollector(Collector):
    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    def collect(self) -> Iterator[Metric]:
        labels = ["group", "topic"]
        counters = {
            name: CounterMetricFamily(f"cproxy_{name}_messages", f"Messages {name}", labels=labels)
            for name in _COUNTERS
        }
        gauges = {
            name: GaugeMetricFamily(f"cproxy_{name}_messages", f"Messages {text}", labels=labels)
            for name, text in (
                ("ready", "ready to hand out"),
                ("in_flight", "in flight"),
                ("lag", "not yet finished (next offset - committed)"),
            )
        }
        group_gauges = {
            name: GaugeMetricFamily(f"cproxy_{name}", text, labels=["group"])
            for name, text in (
                ("waiting_messages", "Messages waiting behind their chain head"),
                ("blocked_keys", "Order values whose head is not acked"),
                ("buffered_messages", "Messages held in memory"),
                ("retrying_messages", "Messages waiting for a retry"),
                ("delayed_messages", "Delayed messages not due yet"),
            )
        }
        for name, stats in self._broker.group_stats():
            for t in stats.topics:
                for counter in _COUNTERS:
                    counters[counter].add_metric([name, t.topic], getattr(t, counter))
                gauges["ready"].add_metric([name, t.topic], t.ready)
                gauges["in_flight"].add_metric([name, t.topic], t.in_flight)
                gauges["lag"].add_metric([name, t.topic], t.lag)
            group_gauges["waiting_messages"].add_metric([name], stats.waiting)
            group_gauges["blocked_keys"].add_metric([name], stats.blocked_keys)
            group_gauges["buffered_messages"].add_metric([name], stats.buffered)
            group_gauges["retrying_messages"].add_metric([name], stats.retrying)
            group_gauges["delayed_messages"].add_metric([name], stats.delayed)
        yield from counters.values()
        yield from gauges.values()
        yield from group_gauges.values()


class Metrics:
    """The service's collectors, in a registry of their own (no global state)."""

    def __init__(self) -> None:
        # The *_created series double the output and no dashboard uses them.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        self.produced = Counter(
            "cproxy_produced_messages",
            "Messages stored by produce calls",
            ["topic"],
            registry=self.registry,
        )
        self.pull_seconds = Histogram(
            "cproxy_pull_duration_seconds",
            "Time to answer a pull, long-poll wait included",
            ["group"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ack_seconds = Histogram(
            "cproxy_produce_to_ack_seconds",
            "From produce to ack of a message",
            ["group"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )

    def attach(self, broker: Broker) -> None:
        self.registry.register(_EngineCollector(broker))

    def on_produced(self, topic: str, count: int) -> None:
        self.produced.labels(topic).inc(count)

    def ack_latency_observer(self, group: str) -> Callable[[float], None]:
        return self.ack_seconds.labels(group).observe

    def observe_pull(self, group: str, seconds: float) -> None:
        self.pull_seconds.labels(group).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
