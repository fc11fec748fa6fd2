"""Who consumes a group and how fast: the consumers seen pulling, and delivery and ack rates.

Cheap by design, since pulls are the hot path: a pull sets one dict entry (its consumer's
last-pull time), never anything per message. Rates come from the engine's running totals,
sampled once a second by the group's timer task into a ring of per-second samples; a rate
is the difference across the ring divided by the seconds it spans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: A consumer is listed while its last pull is at most this old.
CONSUMER_WINDOW_MS: Final = 300_000
#: Rates are averaged over (at most) this many seconds.
RATE_WINDOW_S: Final = 60


@dataclass(frozen=True, slots=True)
class ConsumerSeen:
    """One consumer of a group: its id (or its address when it sent none)."""

    consumer: str
    last_pull_ms_ago: int
    #: Messages delivered to it that are not finished yet.
    in_flight: int


class Activity:
    """One group's consumers and rates (``GroupRunner`` owns one)."""

    __slots__ = ("_ring", "_seen", "last_pull_ms")

    def __init__(self) -> None:
        #: Consumer id -> when it last pulled (ms).
        self._seen: dict[str, int] = {}
        #: When anyone last pulled (ms); None: nobody since the group started here.
        self.last_pull_ms: int | None = None
        #: Per-second samples ``(second, delivered, acked)``, indexed by second modulo size.
        self._ring: list[tuple[int, int, int] | None] = [None] * (RATE_WINDOW_S + 1)

    def pulled(self, consumer: str, now_ms: int) -> None:
        self._seen[consumer] = now_ms
        self.last_pull_ms = now_ms

    def consumers(self, now_ms: int, in_flight: dict[str | None, int]) -> list[ConsumerSeen]:
        """Consumers seen in the last ``CONSUMER_WINDOW_MS`` (older ones are forgotten)."""
        self._forget(now_ms)
        return [
            ConsumerSeen(c, max(0, now_ms - at), in_flight.get(c, 0))
            for c, at in sorted(self._seen.items())
        ]

    def sample(self, now_ms: int, delivered: int, acked: int) -> None:
        """Record the running totals at ``now_ms`` (the last sample of a second wins)."""
        second = now_ms // 1000
        self._ring[second % len(self._ring)] = (second, delivered, acked)
        if second % 60 == 0:  # also when nobody reads the stats: memory stays bounded
            self._forget(now_ms)

    def _forget(self, now_ms: int) -> None:
        cutoff = now_ms - CONSUMER_WINDOW_MS
        for gone in [c for c, at in self._seen.items() if at < cutoff]:
            del self._seen[gone]

    def rates(self, now_ms: int) -> tuple[float, float]:
        """``(delivered_per_s, acked_per_s)`` over the last ``RATE_WINDOW_S`` seconds."""
        second = now_ms // 1000
        live = [s for s in self._ring if s is not None and second - s[0] <= RATE_WINDOW_S]
        if len(live) < 2:
            return 0.0, 0.0
        first, latest = min(live), max(live)
        span = latest[0] - first[0]
        return (latest[1] - first[1]) / span, (latest[2] - first[2]) / span
