"""What the broker hands out about groups, besides the engine's own snapshots."""

from __future__ import annotations

from dataclasses import dataclass

from cproxy.engine.group_config import GroupConfig
from cproxy.engine.snapshots import GroupStats

from .activity import ConsumerSeen
from .push import PushStats


@dataclass(frozen=True, slots=True)
class GroupSummary:
    name: str
    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GroupView:
    """A group's effective config and state; ``dead_lettered`` counts stored + pending."""

    name: str
    config: GroupConfig
    stats: GroupStats
    dead_lettered: int
    #: Age of the oldest message not yet acked or dead-lettered (ms); None if none.
    oldest_unfinished_age_ms: int | None = None
    #: One entry per topic whose messages are pushed (cproxy.broker.push).
    push: tuple[PushStats, ...] = ()
    #: Consumers that pulled in the last five minutes (``activity.ConsumerSeen``).
    consumers: tuple[ConsumerSeen, ...] = ()
    #: Since anyone last pulled from this proxy (ms); None: nobody since it started.
    last_pull_ms_ago: int | None = None
    #: Deliveries and acks per second over the last minute.
    delivered_per_s: float = 0.0
    acked_per_s: float = 0.0
    #: Time ``max_per_second`` held ready messages back, summed (cproxy.broker.rate).
    throttled_ms: int = 0
