"""The cluster's tables, kept beside (not inside) the store's versioned schema.

Created with ``IF NOT EXISTS`` under a transaction-level advisory lock by the first proxy that
starts in cluster mode; a single proxy (SQLite, or PostgreSQL without a cluster) never has them.

- ``cluster_members (node_id, advertise_url, started_at, heartbeat_at, lease_until)``: one row
  per proxy; ``heartbeat_at`` and ``lease_until`` are set from the database clock
  (``clock_timestamp()``), never from a proxy's.
- ``queue_owners (tid, qid, owner, epoch, state, lease_until, grace_ms)``: one row per queue
  once any proxy claimed it. ``owner`` NULL means free; ``epoch`` grows by one at every claim
  and is what commits are fenced with; ``state`` is ``owned`` or ``releasing`` (the old owner
  drains before handing over); ``grace_ms`` is the owner's longest ack timeout, which a
  claimer must wait out past ``lease_until`` after the owner stopped renewing (a crash).
"""

from __future__ import annotations

from cproxy.store._pg_base import Conn

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


async def ensure_cluster_schema(conn: Conn) -> None:
    """Create the cluster tables if they are missing (safe when several proxies race)."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK_KEY)
        for statement in TABLES:
            await conn.execute(statement)
