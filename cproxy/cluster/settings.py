"""Settings of one proxy in a cluster, validated when built (units in the field names)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from cproxy.errors import ConfigError

_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$")


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """How one proxy takes part in a cluster.

    - ``node_id``: this proxy's name among its peers (letters, digits, ``._:-``; at most 100).
    - ``advertise_url``: where clients reach this proxy (listed by ``GET /v1/cluster``).
    - ``heartbeat_interval_ms`` (default 1000): how often membership and leases are renewed and
      the assignment is recomputed.
    - ``lease_ms`` (default 5000): how long a heartbeat keeps a member alive and its queues
      owned, timed by the database clock. Must be at least 3 heartbeats, so one late heartbeat
      never loses a lease.
    - ``handover_timeout_ms`` (default None: the group's longest ack timeout): how long a
      releasing queue waits for its in-flight messages before it is handed over anyway.
    """

    node_id: str
    advertise_url: str
    heartbeat_interval_ms: int = 1000
    lease_ms: int = 5000
    handover_timeout_ms: int | None = None

    def __post_init__(self) -> None:
        if not _NODE_ID.match(self.node_id):
            raise ConfigError(
                f"node_id must be 1-100 letters, digits or ._:- (starting with a letter or "
                f"digit), got {self.node_id!r}"
            )
        if not self.advertise_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"advertise_url must be an http:// or https:// URL, got {self.advertise_url!r}"
            )
        if not 10 <= self.heartbeat_interval_ms <= 600_000:
            raise ConfigError(
                f"heartbeat_interval_ms must be in 10..600000, got {self.heartbeat_interval_ms}"
            )
        if not 3 * self.heartbeat_interval_ms <= self.lease_ms <= 3_600_000:
            raise ConfigError(
                f"lease_ms must be at least 3 x heartbeat_interval_ms "
                f"({3 * self.heartbeat_interval_ms}) and at most 3600000, got {self.lease_ms}"
            )
        if self.handover_timeout_ms is not None and not 0 <= self.handover_timeout_ms <= 86_400_000:
            raise ConfigError(
                f"handover_timeout_ms must be in 0..86400000, got {self.handover_timeout_ms}"
            )
