"""Prometheus metrics.

Counters and gauges of the delivery engine are read from the engines at scrape time by a
custom collector, so the hot path only bumps plain integers. The pull latency histogram is
observed once per pull call. The produce-to-ack latency, one value per acked message, is
appended to a per-group list and put into its buckets in batches (``_Latencies``): sorting a
batch and bisecting it once per bucket costs far less than ``Histogram.observe`` (a lock and
a bucket search in Python) per message.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from cproxy import __version__, _native

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


#: Pending produce-to-ack values of a group are bucketed when this many have piled up (and
#: at every scrape), so the list stays small whatever the scrape interval.
_FLUSH_AT = 1024


class _Latencies:
    """One group's produce-to-ack histogram: cumulative bucket counts, the sum, and the
    values observed since the last flush. Used from the event loop only (observers run in
    the engine, scrapes in an async route), so it needs no lock."""

    __slots__ = ("count", "cumulative", "pending", "total")

    def __init__(self) -> None:
        #: Values <= each bound of ``_LATENCY_BUCKETS``, then the count of all (+Inf).
        self.cumulative = [0] * len(_LATENCY_BUCKETS)
        self.count = 0
        self.total = 0.0
        self.pending: list[float] = []

    def observe(self, seconds: list[float]) -> None:
        """Values (s) of one batch of acks."""
        pending = self.pending
        pending += seconds
        if len(pending) >= _FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        batch, self.pending = self.pending, []
        if not batch:
            return
        batch.sort()
        for i, bound in enumerate(_LATENCY_BUCKETS):
            # Prometheus buckets are inclusive: a value equal to a bound counts in it.
            self.cumulative[i] += bisect_right(batch, bound)
        self.count += len(batch)
        self.total += sum(batch)

    def buckets(self) -> list[tuple[str, float]]:
        pairs = zip(_LATENCY_BUCKETS, self.cumulative, strict=True)
        # floatToGoString: the "le" labels Histogram itself writes ("0.001", "1.0").
        out = [(floatToGoString(b), float(n)) for b, n in pairs]  # type: ignore[no-untyped-call]
        return [*out, ("+Inf", float(self.count))]


class _LatencyCollector(Collector):
    def __init__(self, groups: dict[str, _Latencies]) -> None:
        self._groups = groups

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "cproxy_produce_to_ack_seconds", "From produce to ack of a message", labels=["group"]
        )
        for name, latencies in self._groups.items():
            latencies.flush()
            family.add_metric([name], latencies.buckets(), latencies.total)
        yield family


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
                (
                    "blocked_keys",
                    "Stuck order values: head retrying, exhausted or in flight past stuck_after_ms",
                ),
                ("in_flight_keys", "Order values whose head is in flight and not stuck"),
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
            group_gauges["in_flight_keys"].add_metric([name], stats.in_flight_keys)
            group_gauges["buffered_messages"].add_metric([name], stats.buffered)
            group_gauges["retrying_messages"].add_metric([name], stats.retrying)
            group_gauges["delayed_messages"].add_metric([name], stats.delayed)
        yield from counters.values()
        yield from gauges.values()
        yield from group_gauges.values()
        throttled = CounterMetricFamily(
            "cproxy_throttled_seconds",
            "Time the group's max_per_second held ready messages back",
            labels=["group"],
        )
        for name, seconds in self._broker.throttled_seconds():
            throttled.add_metric([name], seconds)
        yield throttled


class _BuildInfo(Collector):
    """``cproxy_build_info{version, compiled}``: 1, with whether the hot path runs compiled
    (``cproxy._native``'s one decision; "source" covers both not built and stale)."""

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "cproxy_build_info",
            "The running cproxy: version and compiled hot path",
            labels=["version", "compiled"],
        )
        compiled = "true" if _native.status() == "compiled" else "false"
        family.add_metric([__version__, compiled], 1)
        yield family


_M = TypeVar("_M", Counter, Histogram)


def _child(cache: dict[str, _M], family: _M, label: str) -> _M:
    """``family.labels(label)``, looked up once per label and kept in ``cache``."""
    child = cache.get(label)
    if child is None:
        child = cache[label] = family.labels(label)
    return child


class Metrics:
    """The service's collectors, in a registry of their own (no global state)."""

    def __init__(self) -> None:
        # The *_created series double the output and no dashboard uses them.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        # The standard process_* (CPU, memory, open files, start time) and python_info series,
        # as every Prometheus client exports them; here on the app's own registry.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.registry.register(_BuildInfo())
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
        self._ack_latencies: dict[str, _Latencies] = {}
        self.registry.register(_LatencyCollector(self._ack_latencies))
        # Each label's child, looked up once: ``labels()`` validates and locks on every call,
        # and these two run on every produce and every pull.
        self._produced: dict[str, Counter] = {}
        self._pulls: dict[str, Histogram] = {}

    def attach(self, broker: Broker) -> None:
        self.registry.register(_EngineCollector(broker))

    def on_produced(self, topic: str, count: int) -> None:
        _child(self._produced, self.produced, topic).inc(count)

    def ack_latency_observer(self, group: str) -> Callable[[list[float]], None]:
        """The produce-to-ack observer of ``group``: seconds, one call per batch of acks."""
        return self._ack_latencies.setdefault(group, _Latencies()).observe

    def observe_pull(self, group: str, seconds: float) -> None:
        _child(self._pulls, self.pull_seconds, group).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
