"""The SQLite store's schema: its tables, its version, and the migrations from older files.

Kept apart from ``_sqlite_db`` (connections, threads, transactions) as ``_pg_schema`` is for
the PostgreSQL store. The statements that read and write record batches (``_records``) are
here too, next to the table they name.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from cproxy.errors import StoreError
from cproxy.model import Record
from cproxy.store._records import group_rows

logger = logging.getLogger(__name__)

#: 2: topic retention (``topics.retention_ms``/``retention_bytes``), queue floors (``floors``),
#: interrupted topic deletes (``deleted_topics``), and files use incremental auto-vacuum.
#: 3: record batches (``batches``, one row per queue and produce call) replace ``messages``.
#: 4: ``batches`` becomes a rowid table with a unique index on (tid, qid, base) (``_BATCHES``).
#: 5: ``dedup`` loses its index on ``produced_at_ms``: expired entries are swept in key order
#: (``_sqlite_append``).
SCHEMA_VERSION = 5

#: Tables added by schema version 2.
_V2_TABLES = (
    # The lowest offset kept of a queue that retention cut (absent: 0). It also keeps
    # next offsets after a queue was emptied: the next offset is never below it.
    """CREATE TABLE floors (
        tid INTEGER NOT NULL, qid INTEGER NOT NULL, min_off INTEGER NOT NULL,
        PRIMARY KEY (tid, qid)) WITHOUT ROWID""",
    # Topics deleted whose messages may not all be deleted yet (``_sqlite_topics``).
    "CREATE TABLE deleted_topics (tid INTEGER PRIMARY KEY)",
)

#: Tables added by schema version 3 (its ``batches`` replaced by ``_BATCHES`` in 4): record
#: batches (``_records``), keyed (tid, qid, base) without rowid, so an append writes one
#: b-tree entry per queue it touches (no second index: seek by time bisects this key) and a
#: read is one range scan of it. A batch larger than ~1/4 page continues on overflow pages.
_V3_TABLES = (
    """CREATE TABLE batches (
        tid INTEGER NOT NULL, qid INTEGER NOT NULL, base INTEGER NOT NULL,
        next_off INTEGER NOT NULL, first_ts INTEGER NOT NULL, last_ts INTEGER NOT NULL,
        records BLOB NOT NULL,
        PRIMARY KEY (tid, qid, base)) WITHOUT ROWID""",
)

#: Schema version 4's ``batches``: the same columns in a rowid table, found by a unique index
#: on (tid, qid, base). In a WITHOUT ROWID table (version 3) the whole row is the b-tree key,
#: so its interior pages hold copies of entire rows, blobs included: with rows of a kilobyte
#: or more, every commit of 8 queues' rows rewrote ~31 pages. A rowid table keeps the blobs in
#: its leaves (interior pages hold rowids) and the index entries are a few bytes: ~15 pages
#: per such commit, appends ~1.5x cheaper (old journal).
_BATCHES = (
    """CREATE TABLE batches (
        tid INTEGER NOT NULL, qid INTEGER NOT NULL, base INTEGER NOT NULL,
        next_off INTEGER NOT NULL, first_ts INTEGER NOT NULL, last_ts INTEGER NOT NULL,
        records BLOB NOT NULL)""",
    "CREATE UNIQUE INDEX batches_key ON batches (tid, qid, base)",
)

#: The batches holding offsets ``?3 <= off < ?4`` of queue (?1, ?2), in offset order: from the
#: one holding ``?3`` (the last starting at or below it; ``?3`` itself when none does), up to
#: the last one starting below ``?4``. Two seeks of the primary key, then one range scan.
READ_BATCHES = (
    "SELECT base, next_off, records FROM batches WHERE tid = ?1 AND qid = ?2 AND base < ?4"
    " AND base >= coalesce((SELECT base FROM batches WHERE tid = ?1 AND qid = ?2"
    " AND base <= ?3 ORDER BY base DESC LIMIT 1), ?3) ORDER BY base"
)

#: The batch holding offset ``?3`` of queue (?1, ?2), if any: the last one starting at or
#: below it (``_records.Head``; the caller checks ``next_off``).
BATCH_AT = (
    "SELECT base, next_off, first_ts, last_ts, records FROM batches"
    " WHERE tid = ? AND qid = ? AND base <= ? ORDER BY base DESC LIMIT 1"
)

#: Most records one migrated batch holds (old rows of contiguous offsets are grouped).
MIGRATED_BATCH = 100

INSERT_BATCH = (
    "INSERT INTO batches (tid, qid, base, next_off, first_ts, last_ts, records)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)

_TABLES = (
    "CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL) WITHOUT ROWID",
    """CREATE TABLE topics (
        tid INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        queues INTEGER NOT NULL,
        retention_ms INTEGER,
        retention_bytes INTEGER)""",
    """CREATE TABLE dedup (
        tid INTEGER NOT NULL, id TEXT NOT NULL,
        qid INTEGER NOT NULL, off INTEGER NOT NULL, produced_at_ms INTEGER NOT NULL,
        PRIMARY KEY (tid, id)) WITHOUT ROWID""",
    "CREATE TABLE groups (name TEXT PRIMARY KEY, config BLOB NOT NULL) WITHOUT ROWID",
    """CREATE TABLE progress (
        grp TEXT NOT NULL, tid INTEGER NOT NULL, qid INTEGER NOT NULL,
        committed INTEGER NOT NULL, finished TEXT NOT NULL,
        PRIMARY KEY (grp, tid, qid)) WITHOUT ROWID""",
    """CREATE TABLE dead_letters (
        grp TEXT NOT NULL, tid INTEGER NOT NULL, qid INTEGER NOT NULL, off INTEGER NOT NULL,
        key TEXT, id TEXT, headers BLOB, body BLOB NOT NULL, produced_at_ms INTEGER NOT NULL,
        attempts INTEGER NOT NULL, last_error TEXT, dead_lettered_at_ms INTEGER NOT NULL,
        redriving INTEGER NOT NULL,
        PRIMARY KEY (grp, tid, qid, off)) WITHOUT ROWID""",
    *_V2_TABLES,
    *_BATCHES,
)


def _messages_to_batches(conn: sqlite3.Connection) -> None:
    """Schema 3: move every message of the v2 ``messages`` table into batches, then drop it.

    Streams the old rows in key order and groups runs of contiguous offsets of one queue
    (``_records.group_rows``), so nothing is held in memory but one batch.
    """
    for statement in _V3_TABLES:
        conn.execute(statement)
    old = conn.execute(
        "SELECT tid, qid, off, key, body, headers, id, produced_at_ms FROM messages"
        " ORDER BY tid, qid, off"
    )
    rows = (
        (tid, Record("", qid, off, key, bytes(body), _blob(headers), msg_id, ts))
        for tid, qid, off, key, body, headers, msg_id, ts in old
    )
    moved = 0
    for tid, b in group_rows(rows, MIGRATED_BATCH):
        conn.execute(INSERT_BATCH, (tid, *b))
        moved += b.next_off - b.base
    conn.execute("DROP TABLE messages")
    logger.info("moved %d messages into record batches", moved)


def _batches_to_rowid_table(conn: sqlite3.Connection) -> None:
    """Schema 4: copy the WITHOUT ROWID ``batches`` into the rowid table of ``_BATCHES``."""
    conn.execute("ALTER TABLE batches RENAME TO batches_v3")
    for statement in _BATCHES:
        conn.execute(statement)
    columns = "tid, qid, base, next_off, first_ts, last_ts, records"
    moved = conn.execute(
        f"INSERT INTO batches ({columns}) SELECT {columns} FROM batches_v3 ORDER BY tid, qid, base"
    ).rowcount
    conn.execute("DROP TABLE batches_v3")
    logger.info("moved %d record batches into the version 4 table", moved)


def _blob(value: bytes | None) -> bytes | None:
    return None if value is None else bytes(value)


#: version -> steps (SQL, or a function of the connection) that take a file from
#: ``version - 1`` to ``version``; all of them run in one transaction.
MIGRATIONS: dict[int, tuple[str | Callable[[sqlite3.Connection], None], ...]] = {
    2: (
        "ALTER TABLE topics ADD COLUMN retention_ms INTEGER",
        "ALTER TABLE topics ADD COLUMN retention_bytes INTEGER",
        *_V2_TABLES,
    ),
    3: (_messages_to_batches,),
    4: (_batches_to_rowid_table,),
    5: ("DROP INDEX IF EXISTS dedup_by_time",),
}


def ensure_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Create the schema in a new file, migrate an older one, refuse a newer one.

    New files get ``auto_vacuum = INCREMENTAL`` (set by ``connect``: it only takes effect on an
    empty file), so retention can give space back; an older file is converted once with a
    ``VACUUM`` (which rewrites the whole file: it takes time and needs as much free disk again).
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        has_meta = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
        ).fetchone()
        if has_meta is None:
            for statement in _TABLES:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO meta (k, v) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
            logger.info("created SQLite store schema v%d in %s", SCHEMA_VERSION, path)
        else:
            row = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
            version = int(row[0]) if row is not None else 0
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{path} has schema version {version}, newer than version {SCHEMA_VERSION} "
                    "that this cproxy understands; upgrade cproxy to open it"
                )
            for target in range(version + 1, SCHEMA_VERSION + 1):
                if target not in MIGRATIONS:
                    raise StoreError(f"{path} has schema version {version}, which has no migration")
                for step in MIGRATIONS[target]:
                    if isinstance(step, str):
                        conn.execute(step)
                    else:
                        step(conn)
                conn.execute("UPDATE meta SET v = ? WHERE k = 'schema_version'", (str(target),))
                logger.info("migrated SQLite store %s to schema v%d", path, target)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
        logger.warning(
            "converting %s to incremental auto-vacuum (one VACUUM; can take a while)", path
        )
        started = time.monotonic()
        conn.execute("VACUUM")
        logger.info("converted %s in %.1fs", path, time.monotonic() - started)
