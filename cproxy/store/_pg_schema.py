"""The PostgreSQL store's schema, its version check, and the translation of foreign errors.

Kept apart from ``postgres.py`` so that module reads as store logic only. The tables are
described in ``postgres.py``'s module docstring.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import asyncpg

from cproxy.errors import StoreError
from cproxy.model import Record
from cproxy.store._pg_sql import INSERT_BATCHES, Conn
from cproxy.store._records import group_rows

logger = logging.getLogger(__name__)

#: Bumped by every change of the tables. A later version adds a migration from the one before
#: to ``MIGRATIONS``.
SCHEMA_VERSION = 3

#: Most records one migrated batch holds (old rows of contiguous offsets are grouped).
MIGRATED_BATCH = 100
#: Old rows read per query while migrating.
MIGRATE_CHUNK = 10_000

#: Tables of schema version 3: record batches (``_records``), one row per queue and produce
#: call, keyed by (tid, qid, base); no second index (seek by time bisects this key).
V3_TABLES = (
    """CREATE TABLE batches (
        tid integer NOT NULL, qid integer NOT NULL, base bigint NOT NULL,
        next_off bigint NOT NULL, first_ts bigint NOT NULL, last_ts bigint NOT NULL,
        records bytea NOT NULL,
        PRIMARY KEY (tid, qid, base))""",
)


async def _messages_to_batches(conn: Conn) -> None:
    """Schema 3: move every message of the v2 ``messages`` table into batches, then drop it.

    Queue by queue, ``MIGRATE_CHUNK`` rows at a time, runs of contiguous offsets grouped into
    batches of at most ``MIGRATED_BATCH`` (``_records.group_rows``).
    """
    for statement in V3_TABLES:
        await conn.execute(statement)
    moved = 0
    for tid, qid in await conn.fetch("SELECT tid, qid FROM queues ORDER BY tid, qid"):
        after = -1
        while True:
            rows = await conn.fetch(
                "SELECT off, key, body, headers, id, produced_at_ms FROM messages"
                " WHERE tid = $1 AND qid = $2 AND off > $3 ORDER BY off LIMIT $4",
                tid,
                qid,
                after,
                MIGRATE_CHUNK,
            )
            if not rows:
                break
            after = rows[-1][0]
            grouped = [
                b
                for _, b in group_rows(
                    ((tid, Record("", qid, *row)) for row in rows), MIGRATED_BATCH
                )
            ]
            await conn.execute(INSERT_BATCHES, tid, *(list(c) for c in zip(*grouped, strict=True)))
            moved += len(rows)
    await conn.execute("DROP TABLE messages")
    logger.info("moved %d messages into record batches", moved)


#: version -> steps (SQL, or a coroutine function of the connection) that take a database from
#: ``version - 1`` to ``version``; all of them run in one transaction.
MIGRATIONS: dict[int, tuple[str | Callable[[Conn], Awaitable[None]], ...]] = {
    # 2: topic retention bounds, and each queue's lowest kept offset.
    2: (
        "ALTER TABLE topics ADD COLUMN retention_ms bigint, ADD COLUMN retention_bytes bigint",
        "ALTER TABLE queues ADD COLUMN min_offset bigint NOT NULL DEFAULT 0",
    ),
    # 3: record batches replace the one-row-per-message table.
    3: (_messages_to_batches,),
}

#: Any fixed number: the transaction-level advisory lock that serialises schema creation
#: between proxies that open the same database at the same time.
SCHEMA_LOCK_KEY = 0x63_70_72_6F_78_79  # "cproxy"

TABLES = (
    "CREATE TABLE cproxy_meta (k text PRIMARY KEY, v text NOT NULL)",
    """CREATE TABLE topics (
        tid integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        name text NOT NULL UNIQUE,
        queues integer NOT NULL CHECK (queues > 0),
        retention_ms bigint, retention_bytes bigint)""",
    # One row per queue: the offset counter. Appends lock these rows (FOR UPDATE, in qid order)
    # to allocate offsets, which serialises appends per queue and never across queues.
    """CREATE TABLE queues (
        tid integer NOT NULL REFERENCES topics (tid),
        qid integer NOT NULL,
        next_offset bigint NOT NULL DEFAULT 0,
        last_produced_at_ms bigint NOT NULL DEFAULT 0,
        min_offset bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (tid, qid))""",
    *V3_TABLES,
    # The produce-dedup index on (topic, id): the newest stored copy of each id.
    """CREATE TABLE dedup (
        tid integer NOT NULL, id text NOT NULL,
        qid integer NOT NULL, off bigint NOT NULL, produced_at_ms bigint NOT NULL,
        PRIMARY KEY (tid, id))""",
    "CREATE INDEX dedup_by_time ON dedup (produced_at_ms)",
    "CREATE TABLE groups (name text PRIMARY KEY, config bytea NOT NULL)",
    """CREATE TABLE progress (
        grp text NOT NULL, tid integer NOT NULL REFERENCES topics (tid),
        qid integer NOT NULL, committed bigint NOT NULL, finished jsonb NOT NULL,
        PRIMARY KEY (grp, tid, qid))""",
    """CREATE TABLE dead_letters (
        grp text NOT NULL, tid integer NOT NULL REFERENCES topics (tid),
        qid integer NOT NULL, off bigint NOT NULL,
        key text, id text, headers bytea, body bytea NOT NULL, produced_at_ms bigint NOT NULL,
        attempts integer NOT NULL, last_error text, dead_lettered_at_ms bigint NOT NULL,
        redriving boolean NOT NULL,
        PRIMARY KEY (grp, tid, qid, off))""",
)

#: Errors that mean "the database failed or cannot be reached".
FOREIGN_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    OSError,
    asyncio.TimeoutError,
)


def as_store_error(exc: BaseException) -> StoreError:
    """A ``StoreError`` describing a foreign error (the caller chains it with ``from``)."""
    sqlstate = getattr(exc, "sqlstate", None)
    detail = f"{type(exc).__name__}: {exc}" + (f" (SQLSTATE {sqlstate})" if sqlstate else "")
    return StoreError(f"PostgreSQL store failed: {detail}")


async def ensure_schema(conn: Conn) -> None:
    """Create the schema in an empty database, migrate an older one, refuse a newer one."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK_KEY)
        exists = await conn.fetchval("SELECT to_regclass('cproxy_meta') IS NOT NULL")
        if not exists:
            for statement in TABLES:
                await conn.execute(statement)
            await conn.execute(
                "INSERT INTO cproxy_meta (k, v) VALUES ('schema_version', $1)", str(SCHEMA_VERSION)
            )
            logger.info("created PostgreSQL store schema v%d", SCHEMA_VERSION)
            return
        raw = await conn.fetchval("SELECT v FROM cproxy_meta WHERE k = 'schema_version'")
        version = int(raw) if raw is not None else 0
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the database has schema version {version}, newer than version "
                f"{SCHEMA_VERSION} that this cproxy understands; upgrade cproxy to open it"
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            if target not in MIGRATIONS:
                raise StoreError(f"the database has schema version {version}, with no migration")
            for step in MIGRATIONS[target]:
                if isinstance(step, str):
                    await conn.execute(step)
                else:
                    await step(conn)
            await conn.execute(
                "UPDATE cproxy_meta SET v = $1 WHERE k = 'schema_version'", str(target)
            )
            logger.info("migrated PostgreSQL store schema to v%d", target)
