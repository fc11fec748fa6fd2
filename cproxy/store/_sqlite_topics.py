"""The SQLite store's topics: create, update, delete, queue bounds, seek by time, retention.

``SqliteTopics`` is a collaborator of ``sqlite.SqliteStore``, built on its ``Database``: it owns
the topic caches (name -> tid and queues, each queue's floor and tail, retention bounds), which
the store reads through its methods (``topic``, ``tail``, ``read_range``) and whose tails its
appends publish after COMMIT (``publish_tails``), so that module stays about messages and
groups.

Retention deletes the oldest record batches (``_records``) of a queue, ``DELETE_BATCH`` offsets
per write, each its own short transaction (so produce calls queued behind it wait for one
write, not the whole cut), and records the queue's new floor (``floors`` table) in the same
transaction, so ``min_offset`` and the messages never disagree, even after a crash. Only whole
batches go: a batch the cut goes through stays until a later cut passes its end, and reads
start at the floor, so to callers the cut is exact to the message. Then it gives the freed
pages back to the file system with ``PRAGMA incremental_vacuum`` (the file is created with
``auto_vacuum = INCREMENTAL``; a file from before is converted once when opened, see
``_sqlite_schema``), again in bounded steps.

Deleting a topic first removes its row and everything small that names it in one transaction,
and records its tid in ``deleted_topics``; its batches are then deleted, ``PURGE_BATCH`` rows
per write. If the
process stops half way, the next ``open`` finishes the job. A new topic never takes the tid of
one whose messages may still be there.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
from collections.abc import Mapping

import anyio

from cproxy.errors import StoreError, TopicConflict
from cproxy.model import QueueStats, TopicInfo
from cproxy.store._common import check_qid, check_queues, topic_not_found
from cproxy.store._records import first_at, narrow, sizes
from cproxy.store._retention import ByteCounter, check_retention, queue_cut
from cproxy.store._sqlite_db import Database
from cproxy.store._sqlite_schema import BATCH_AT, READ_BATCHES

logger = logging.getLogger(__name__)

#: Offsets deleted per retention write (one short transaction each; whole batches only).
DELETE_BATCH = 2000
#: Pages handed back to the file system per write by ``PRAGMA incremental_vacuum``.
VACUUM_PAGES = 512

#: Batch rows deleted per write when a deleted topic's batches are purged.
PURGE_BATCH = 50

Bounds = tuple[int | None, int | None]


class SqliteTopics:
    """Topic-level operations of the SQLite store; see the module docstring."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._clear()

    def _clear(self) -> None:
        # Caches, written only by the writer thread and only after COMMIT (``Database.on_commit``).
        self._topics: dict[str, tuple[int, int]] = {}  # name -> (tid, queues)
        self._names: dict[int, str] = {}
        self._next: dict[int, list[int]] = {}  # tid -> next offset per qid
        self._last_ts: dict[int, list[int]] = {}  # tid -> last produced_at_ms per qid
        self._min: dict[int, list[int]] = {}  # tid -> min offset per qid
        self._bounds: dict[int, Bounds] = {}  # tid -> (retention_ms, retention_bytes)
        self._bytes = ByteCounter()
        # One retention pass or topic delete at a time: both move floors and byte totals.
        self._retention_lock = anyio.Lock()

    def load(self, conn: sqlite3.Connection) -> None:
        """Fill the caches: called once at open on the writer connection, before anything
        else runs."""
        self._clear()
        for (tid,) in conn.execute("SELECT tid FROM deleted_topics").fetchall():
            _purge_sync(conn, tid)
        floors = {(t, q): off for t, q, off in conn.execute("SELECT * FROM floors").fetchall()}
        for tid, name, queues, r_ms, r_bytes in conn.execute(
            "SELECT tid, name, queues, retention_ms, retention_bytes FROM topics"
        ).fetchall():
            self._add_topic(tid, name, queues, (r_ms, r_bytes))
            nexts, lasts, mins = self._next[tid], self._last_ts[tid], self._min[tid]
            for qid in range(queues):
                mins[qid] = nexts[qid] = floors.get((tid, qid), 0)
                # One b-tree descent per queue, instead of a GROUP BY over the whole log.
                row = conn.execute(
                    "SELECT next_off, last_ts FROM batches WHERE tid = ? AND qid = ?"
                    " ORDER BY base DESC LIMIT 1",
                    (tid, qid),
                ).fetchone()
                if row is not None:
                    # A batch cut through by retention ends above the floor.
                    nexts[qid], lasts[qid] = max(row[0], nexts[qid]), row[1]

    def _add_topic(self, tid: int, name: str, queues: int, bounds: Bounds) -> None:
        self._next[tid] = [0] * queues
        self._last_ts[tid] = [0] * queues
        self._min[tid] = [0] * queues
        # Copy-on-write: the event loop may be iterating the old dicts while the writer thread
        # publishes a new topic, and rebinding an attribute is atomic.
        self._bounds = {**self._bounds, tid: bounds}
        self._names = {**self._names, tid: name}
        self._topics = {**self._topics, name: (tid, queues)}

    def _drop_topic(self, tid: int, name: str) -> None:
        # ``_next``/``_last_ts`` stay: an append queued before the delete committed may still
        # run and publish into them; its rows are purged with the rest.
        self._topics = {n: v for n, v in self._topics.items() if n != name}
        self._names = {t: n for t, n in self._names.items() if t != tid}

    def _check_open(self) -> None:
        if not self._db.is_open:
            raise StoreError("the store is not open")

    def topic(self, name: str) -> tuple[int, int]:
        """``(tid, queues)`` of a topic; ``TopicNotFound`` if there is none."""
        self._check_open()
        try:
            return self._topics[name]
        except KeyError:
            raise topic_not_found(name) from None

    def tid_of(self, name: str) -> int | None:
        """The topic's tid, or None when there is no such topic."""
        entry = self._topics.get(name)
        return None if entry is None else entry[0]

    def name_of(self, tid: int) -> str:
        return self._names[tid]

    def tail(self, tid: int, qid: int) -> tuple[int, int]:
        """The queue's next offset and last ``produced_at_ms``, as committed."""
        return self._next[tid][qid], self._last_ts[tid][qid]

    def publish_tails(self, tid: int, tails: Mapping[int, tuple[int, int]]) -> None:
        """Appends to the topic's queues committed (qid -> (next offset, last produced_at_ms)):
        called by the writer thread after COMMIT (``Database.on_commit``)."""
        nexts, lasts = self._next[tid], self._last_ts[tid]
        for qid, (nxt, ts) in tails.items():
            nexts[qid], lasts[qid] = nxt, ts

    def read_range(self, tid: int, qid: int) -> tuple[int, int]:
        """The queue's stored offsets, ``[floor, next)``: a read outside needs no query."""
        return self._min[tid][qid], self._next[tid][qid]

    def _info(self, name: str) -> TopicInfo:
        tid, queues = self.topic(name)
        return TopicInfo(name, queues, *self._bounds[tid])

    # -- create, update, delete ----------------------------------------------------------------
    async def create_topic(
        self,
        name: str,
        queues: int,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
    ) -> tuple[TopicInfo, bool]:
        check_queues(queues)
        check_retention(retention_ms, retention_bytes)
        self._check_open()
        tx = functools.partial(self._create_topic_tx, name, queues, (retention_ms, retention_bytes))
        return await self._db.write(tx)

    def _create_topic_tx(
        self, name: str, queues: int, bounds: Bounds, conn: sqlite3.Connection
    ) -> tuple[TopicInfo, bool]:
        # Ask the table, not the cache: a create earlier in the same group transaction is
        # visible here but not yet published.
        existing = conn.execute(
            "SELECT queues, retention_ms, retention_bytes FROM topics WHERE name = ?", (name,)
        ).fetchone()
        if existing is not None:
            if existing[0] != queues:
                raise TopicConflict(
                    f"topic {name!r} exists with {existing[0]} queues, not {queues}"
                )
            return TopicInfo(name, *existing), False
        # Above every tid in use or still being purged, so orphans never join a new topic.
        cur = conn.execute(
            "INSERT INTO topics (tid, name, queues, retention_ms, retention_bytes) VALUES ("
            " (SELECT coalesce(max(t), 0) + 1 FROM (SELECT max(tid) AS t FROM topics"
            "  UNION ALL SELECT max(tid) FROM deleted_topics)), ?, ?, ?, ?)",
            (name, queues, *bounds),
        )
        tid = cur.lastrowid
        assert tid is not None
        self._db.on_commit(functools.partial(self._add_topic, tid, name, queues, bounds))
        return TopicInfo(name, queues, *bounds), True

    async def update_topic(
        self, name: str, retention_ms: int | None, retention_bytes: int | None
    ) -> TopicInfo:
        tid, _ = self.topic(name)
        check_retention(retention_ms, retention_bytes)
        bounds = (retention_ms, retention_bytes)

        def tx(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE topics SET retention_ms = ?, retention_bytes = ? WHERE tid = ?",
                (*bounds, tid),
            )

            def publish() -> None:
                self._bounds = {**self._bounds, tid: bounds}

            self._db.on_commit(publish)

        await self._db.write(tx)
        logger.info("topic=%s retention_ms=%s retention_bytes=%s", name, *bounds)
        return TopicInfo(name, self.topic(name)[1], *bounds)

    async def delete_topic(self, name: str) -> None:
        async with self._retention_lock:
            tid, queues = self.topic(name)

            def tx(conn: sqlite3.Connection) -> None:
                for table in ("topics", "dedup", "progress", "dead_letters", "floors"):
                    conn.execute(f"DELETE FROM {table} WHERE tid = ?", (tid,))
                conn.execute("INSERT INTO deleted_topics (tid) VALUES (?)", (tid,))
                self._db.on_commit(functools.partial(self._drop_topic, tid, name))

            await self._db.write(tx)
            for qid in range(queues):
                self._bytes.forget((tid, qid))
            deleted = 0
            while True:
                n = await self._db.write(functools.partial(_purge_batch, tid), weight=DELETE_BATCH)
                deleted += n
                if n == 0:
                    break
            await self._db.write(
                lambda conn: conn.execute("DELETE FROM deleted_topics WHERE tid = ?", (tid,))
            )
            await self._reclaim()
        logger.info("topic=%s deleted messages=%d", name, deleted)

    # -- bounds and seek by time ---------------------------------------------------------------
    async def list_topics(self) -> list[TopicInfo]:
        self._check_open()
        return [self._info(name) for name in sorted(self._topics)]

    async def queue_stats(self, topic: str) -> list[QueueStats]:
        tid, _ = self.topic(topic)
        mins, nexts = self._min[tid], self._next[tid]
        return [
            QueueStats(qid, lo, nxt) for qid, (lo, nxt) in enumerate(zip(mins, nexts, strict=True))
        ]

    async def offset_for_time(self, topic: str, qid: int, timestamp_ms: int) -> int:
        tid, queues = self.topic(topic)
        check_qid(topic, qid, queues)
        lo, hi = self._min[tid][qid], self._next[tid][qid]
        if lo >= hi or self._last_ts[tid][qid] < timestamp_ms:
            return hi

        def run(conn: sqlite3.Connection) -> int:
            # produced_at_ms is non-decreasing per queue (appends clamp it): bisect offsets,
            # one batch per probe (``_records.narrow``).
            low, high = lo, hi
            while low < high:
                mid = (low + high) // 2
                head = conn.execute(BATCH_AT, (tid, qid, mid)).fetchone()
                low, high, inside = narrow(low, high, mid, head, timestamp_ms)
                if inside:
                    low = first_at(head, timestamp_ms)
                    break
            return max(low, self._min[tid][qid])

        return await self._db.read(run)

    # -- retention -----------------------------------------------------------------------------
    async def apply_retention(self, topic: str, now_ms: int) -> dict[int, int]:
        tid, queues = self.topic(topic)
        moved: dict[int, int] = {}
        async with self._retention_lock:
            if self._names.get(tid) != topic:
                return moved  # deleted while we waited for the lock
            for qid in range(queues):
                floor, nxt = self._min[tid][qid], self._next[tid][qid]
                cut = await queue_cut(
                    self._bytes,
                    (tid, qid),
                    floor,
                    nxt,
                    self._bounds[tid],
                    now_ms,
                    functools.partial(self.offset_for_time, topic, qid),
                    functools.partial(self._sizes, tid, qid),
                )
                if cut > floor:
                    await self._cut(tid, qid, floor, cut)
                    moved[qid] = cut
            if moved:
                await self._reclaim()
        if moved:
            logger.info("topic=%s retention moved min_offset=%s", topic, moved)
        return moved

    async def _sizes(self, tid: int, qid: int, lo: int, hi: int) -> list[tuple[int, int]]:
        def run(conn: sqlite3.Connection) -> list[tuple[int, int]]:
            return sizes(conn.execute(READ_BATCHES, (tid, qid, lo, hi)).fetchall(), lo, hi)

        return await self._db.read(run)

    async def _cut(self, tid: int, qid: int, floor: int, cut: int) -> None:
        mins = self._min[tid]
        for lo in range(floor, cut, DELETE_BATCH):
            hi = min(cut, lo + DELETE_BATCH)

            def tx(conn: sqlite3.Connection, hi: int = hi) -> None:
                # Whole batches only: one the cut goes through stays, below the new floor.
                conn.execute(
                    "DELETE FROM batches WHERE tid = ? AND qid = ? AND base < ? AND next_off <= ?",
                    (tid, qid, hi, hi),
                )
                conn.execute(
                    "INSERT OR REPLACE INTO floors (tid, qid, min_off) VALUES (?, ?, ?)",
                    (tid, qid, hi),
                )
                self._db.on_commit(functools.partial(mins.__setitem__, qid, hi))

            await self._db.write(tx, weight=hi - lo)

    async def _reclaim(self) -> None:
        """Give free pages back to the file system, ``VACUUM_PAGES`` per write."""
        while await self._db.write(_vacuum_step, weight=VACUUM_PAGES):
            pass


def _vacuum_step(conn: sqlite3.Connection) -> bool:
    """Free up to ``VACUUM_PAGES`` pages; True if more are left."""
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
        return False  # not incremental (a conversion that could not run): SQLite reuses them
    free = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    # Python's sqlite3 steps a PRAGMA statement once, and each step frees one page.
    for _ in range(min(free, VACUUM_PAGES)):
        conn.execute("PRAGMA incremental_vacuum")
    return free > VACUUM_PAGES


def _purge_batch(tid: int, conn: sqlite3.Connection) -> int:
    """Delete up to ``PURGE_BATCH`` batch rows of a deleted topic; how many went."""
    cur = conn.execute(
        "DELETE FROM batches WHERE (tid, qid, base) IN"
        " (SELECT tid, qid, base FROM batches WHERE tid = ? LIMIT ?)",
        (tid, PURGE_BATCH),
    )
    return cur.rowcount


def _purge_sync(conn: sqlite3.Connection, tid: int) -> None:
    """Finish deleting a topic whose delete was interrupted (at open, before serving)."""
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            n = _purge_batch(tid, conn)
            if n == 0:
                conn.execute("DELETE FROM deleted_topics WHERE tid = ?", (tid,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        if n == 0:
            logger.info("finished deleting the messages of deleted topic tid=%d", tid)
            return
