"""Membership by heartbeat: who is in the cluster, timed by the database clock only.

Each proxy upserts its row every ``heartbeat_interval_ms``; the row's ``lease_until`` is the
database's ``clock_timestamp()`` plus ``lease_ms``. A member is live while its ``lease_until``
is in the database's future, so proxies with skewed clocks still agree on who is alive.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from cproxy.store._pg_base import Conn

_HEARTBEAT = (
    "INSERT INTO cluster_members (node_id, advertise_url, heartbeat_at, lease_until)"
    " VALUES ($1, $2, clock_timestamp(), clock_timestamp() + $3 * interval '1 millisecond')"
    " ON CONFLICT (node_id) DO UPDATE SET advertise_url = excluded.advertise_url,"
    " heartbeat_at = excluded.heartbeat_at, lease_until = excluded.lease_until"
    " RETURNING heartbeat_at"
)

_LIVE = (
    "SELECT node_id, advertise_url, heartbeat_at, lease_until,"
    " (extract(epoch FROM clock_timestamp() - heartbeat_at) * 1000)::bigint"
    " FROM cluster_members"
    " WHERE lease_until > clock_timestamp() ORDER BY node_id"
)


@dataclass(frozen=True, slots=True)
class Member:
    """A live member as the database last heard of it."""

    node_id: str
    advertise_url: str
    heartbeat_at: datetime
    lease_until: datetime
    #: How long ago (ms, database clock) the last heartbeat was.
    heartbeat_ms_ago: int


async def heartbeat(conn: Conn, node_id: str, advertise_url: str, lease_ms: int) -> datetime:
    """Renew this member's lease; returns the database time of the heartbeat."""
    at: datetime = await conn.fetchval(_HEARTBEAT, node_id, advertise_url, lease_ms)
    return at


async def live_members(conn: Conn) -> list[Member]:
    """Members whose lease has not run out, by node id."""
    return [Member(*row) for row in await conn.fetch(_LIVE)]


async def leave(conn: Conn, node_id: str) -> None:
    """Remove this member (a graceful shutdown, after its queues were handed over)."""
    await conn.execute("DELETE FROM cluster_members WHERE node_id = $1", node_id)
