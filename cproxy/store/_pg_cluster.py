"""The PostgreSQL store's cluster tables: membership, queue ownership and the fence.

Kept beside (not inside) the store's versioned schema: created with ``IF NOT EXISTS`` under a
transaction-level advisory lock by the first proxy that joins a cluster; a single proxy
(SQLite, or PostgreSQL without a cluster) never has them.

- ``cluster_members (node_id, advertise_url, started_at, heartbeat_at, lease_until)``: one row
  per proxy; ``heartbeat_at`` and ``lease_until`` are set from the database clock
  (``clock_timestamp()``), never from a proxy's. A member is live while its ``lease_until`` is
  in the database's future, so proxies with skewed clocks still agree on who is alive.
- ``queue_owners (tid, qid, owner, epoch, state, lease_until, grace_ms)``: one row per queue
  once any proxy claimed it. ``owner`` NULL means free; ``epoch`` grows by one at every claim
  and is what commits are fenced with; ``state`` is ``owned`` or ``releasing`` (the old owner
  drains before handing over); ``grace_ms`` is the owner's longest ack timeout, which a
  claimer must wait out past ``lease_until`` after the owner stopped renewing (a crash).

The transitions (``cluster_base.ClusterStore`` has their contract):

- **claim**: take a queue that is free (handed over), or whose owner stopped renewing: its
  ``lease_until`` plus its ``grace_ms`` lies in the database's past. Messages the dead owner
  had handed out have then timed out for their consumers too, so serving the queue again
  cannot break per-key order. ``epoch`` + 1.
- **renew**: push ``lease_until`` of every row this proxy owns to now + lease.
- **release**: mark an owned row ``releasing``; the owner then hands out nothing new from it
  and **hands over** when drained: the queue's final progress and the freeing of the row are
  one transaction, so the next owner starts exactly where this one stopped.

Fencing: ``Fence.check`` runs inside every progress or dead-letter commit with the queues it
touches; it locks those ``queue_owners`` rows and raises ``QueueNotOwned`` (naming the lost
queues) when any is not owned by this proxy at the epoch it holds. A deposed or long-paused
proxy therefore cannot move a group's progress or write dead letters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import asyncpg

from cproxy.errors import QueueNotOwned, StoreError
from cproxy.store._pg_sql import APPEND_CHANNEL, Conn
from cproxy.store.cluster_base import Member, OwnerRow, TidQid

#: The advisory lock taken while creating the cluster tables ("clustr").
SCHEMA_LOCK_KEY = 0x63_6C_75_73_74_72

TABLES = (
    """CREATE TABLE IF NOT EXISTS cluster_members (
        node_id text PRIMARY KEY,
        advertise_url text NOT NULL,
        started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        heartbeat_at timestamptz NOT NULL,
        lease_until timestamptz NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS queue_owners (
        tid integer NOT NULL,
        qid integer NOT NULL,
        owner text,
        epoch bigint NOT NULL DEFAULT 0,
        state text NOT NULL DEFAULT 'owned' CHECK (state IN ('owned', 'releasing')),
        lease_until timestamptz NOT NULL DEFAULT '-infinity',
        grace_ms bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (tid, qid))""",
    "CREATE INDEX IF NOT EXISTS queue_owners_by_owner ON queue_owners (owner)",
)

#: The channel that tells peers a queue became free or a member joined (so they claim or
#: release without waiting for their next heartbeat).
CHANNEL = "cproxy_cluster"

_MS = "* interval '1 millisecond'"

HEARTBEAT = (
    "INSERT INTO cluster_members (node_id, advertise_url, heartbeat_at, lease_until)"
    f" VALUES ($1, $2, clock_timestamp(), clock_timestamp() + $3 {_MS})"
    " ON CONFLICT (node_id) DO UPDATE SET advertise_url = excluded.advertise_url,"
    " heartbeat_at = excluded.heartbeat_at, lease_until = excluded.lease_until"
    " RETURNING heartbeat_at"
)

LIVE = (
    "SELECT node_id, advertise_url, heartbeat_at, lease_until,"
    " (extract(epoch FROM clock_timestamp() - heartbeat_at) * 1000)::bigint"
    " FROM cluster_members"
    " WHERE lease_until > clock_timestamp() ORDER BY node_id"
)

LEAVE = "DELETE FROM cluster_members WHERE node_id = $1"

ROWS = (
    "SELECT t.name, q.tid, q.qid, o.owner, coalesce(o.epoch, 0), coalesce(o.state, 'owned'),"
    f" o.lease_until, (o.owner IS NULL OR o.lease_until + o.grace_ms {_MS} < clock_timestamp())"
    " FROM queues q JOIN topics t ON t.tid = q.tid"
    " LEFT JOIN queue_owners o ON o.tid = q.tid AND o.qid = q.qid"
    ' ORDER BY t.name COLLATE "C", q.qid'
)

CLAIM = (
    "INSERT INTO queue_owners AS o (tid, qid, owner, epoch, state, lease_until, grace_ms)"
    f" VALUES ($1, $2, $3, 1, 'owned', clock_timestamp() + $4 {_MS}, $5)"
    " ON CONFLICT (tid, qid) DO UPDATE SET owner = excluded.owner, epoch = o.epoch + 1,"
    " state = 'owned', lease_until = excluded.lease_until, grace_ms = excluded.grace_ms"
    f" WHERE o.owner IS NULL OR o.lease_until + o.grace_ms {_MS} < clock_timestamp()"
    " RETURNING o.epoch"
)

RENEW = (
    f"UPDATE queue_owners SET lease_until = clock_timestamp() + $2 {_MS}, grace_ms = $3"
    " WHERE owner = $1 RETURNING tid, qid, epoch, state"
)

RELEASE = (
    "UPDATE queue_owners SET state = 'releasing'"
    " WHERE tid = $1 AND qid = $2 AND owner = $3 AND epoch = $4 RETURNING 1"
)

FREE = (
    "UPDATE queue_owners SET owner = NULL, state = 'owned', lease_until = '-infinity'"
    " WHERE tid = $1 AND qid = $2 AND owner = $3 AND epoch = $4 RETURNING 1"
)

#: Locks the rows it reads until the caller's transaction ends, so a claim cannot slip in
#: between the fence's check and the commit's writes.
FENCE = (
    "SELECT tid, qid, owner, epoch FROM queue_owners"
    " WHERE (tid, qid) IN (SELECT * FROM unnest($1::int[], $2::int[])) FOR SHARE"
)

NOTIFY = "SELECT pg_notify($1, $2)"


async def ensure_tables(conn: Conn) -> None:
    """Create the cluster tables if they are missing (safe when several proxies race)."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK_KEY)
        for statement in TABLES:
            await conn.execute(statement)


async def live_members(conn: Conn) -> list[Member]:
    return [Member(*row) for row in await conn.fetch(LIVE)]


async def owner_rows(conn: Conn) -> list[OwnerRow]:
    return [OwnerRow(*row) for row in await conn.fetch(ROWS)]


class Fence:
    """The epochs at which ``node_id`` holds its queues (a queue not listed is not owned:
    committing it fails). Changed by the store's claims, hand-overs and ``disown`` only."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.epochs: dict[TidQid, int] = {}

    async def check(self, conn: Conn, touched: Mapping[TidQid, tuple[str, int]]) -> None:
        """Raise ``QueueNotOwned`` unless every queue in ``touched`` (by tid, mapped to its
        (topic, qid)) is owned by this node at the held epoch. Call inside the transaction."""
        if not touched:
            return
        held = {q: self.epochs.get(q, -1) for q in touched}
        tids, qids = zip(*held, strict=True)
        found = {
            (tid, qid): (owner, epoch)
            for tid, qid, owner, epoch in await conn.fetch(FENCE, list(tids), list(qids))
        }
        lost = [q for q, e in held.items() if found.get(q) != (self.node_id, e)]
        if lost:
            refs = sorted(touched[q] for q in lost)
            raise QueueNotOwned(
                f"node {self.node_id} no longer owns {refs} at the epoch it holds: "
                "another proxy took them over",
                refs,
            )


class PgListener:
    """One dedicated connection (not pooled: LISTEN is session state) for notifications."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    @classmethod
    async def open(
        cls, dsn: str, on_append: Callable[[str, int, int], None], on_peer: Callable[[str], None]
    ) -> PgListener:
        def appended(conn: object, pid: int, channel: str, payload: object) -> None:
            topic, qid, end = str(payload).rsplit(":", 2)
            on_append(topic, int(qid), int(end))

        def peer(conn: object, pid: int, channel: str, payload: object) -> None:
            on_peer(str(payload))

        try:
            conn = await asyncpg.connect(dsn, timeout=5)
            try:
                await conn.add_listener(APPEND_CHANNEL, appended)
                await conn.add_listener(CHANNEL, peer)
            except BaseException:
                conn.terminate()
                raise
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreError(f"cannot LISTEN for cluster notifications: {exc}") from exc
        return cls(conn)

    def is_closed(self) -> bool:
        return self._conn.is_closed()

    async def close(self) -> None:
        try:
            await self._conn.close(timeout=2)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
            self._conn.terminate()
