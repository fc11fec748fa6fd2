"""The embedded default store: one SQLite file, ``<data_dir>/cproxy.db``, in WAL mode.

Messages are kept as record batches (``_records``): an append writes one ``batches`` row per
queue it touches, and a read decodes the batches holding its range (``_sqlite_schema`` has the
tables). The appends of one group transaction write one row per queue between them (up to
``MERGE_MAX`` messages), inserted when the transaction ends (``Database.defer``).

Durability: every write is committed before the call returns, so a 200 from the produce call
means the messages are in the database. Writes that arrive while the writer is busy share one
transaction (group commit, see ``_sqlite_writer`` and ``_sqlite_tx``); one failing write does
not take the others down (the batch is redone with a savepoint per write).
``group_commit=False`` gives each write its own transaction again (kept to measure the
difference). With WAL and ``synchronous="normal"``
(the default) a commit is written to the WAL without fsync: it survives the process being
killed at any moment (SIGKILL, OOM killer), but the last commits can be lost if the machine
loses power or the kernel crashes. ``synchronous="full"`` fsyncs the WAL on every commit and
survives power loss too, at the cost of one fsync per write.

Concurrency: one writer connection and one reader connection. With ``synchronous="normal"``
their statements run on the event loop's thread (``threads=None`` picks this): a COMMIT does
not fsync, so a transaction costs the loop less than a hop to a worker thread would, and
writes issued in the same loop iteration still share one transaction. With "full" (or
``threads=True``) each connection is driven from a worker thread through its own
``CapacityLimiter(1)`` so the loop never waits for an fsync; WAL lets reads run while a write
transaction is open. This store is the only writer of its file (a lock file
keeps other processes out), so the next offset and last ``produced_at_ms`` of every queue are
cached in memory and are authoritative; they are published only after a successful COMMIT, so
a failed transaction leaves them untouched. Inside a group transaction, an append continues from
the offsets staged by the earlier appends of the same transaction (``Database.tx_state``), and
dedup sees their ids because they are already in its (uncommitted) view of the tables.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sqlite3
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from cproxy.errors import ConfigError
from cproxy.model import (
    AppendResult,
    DeadLetter,
    MessageRef,
    NewMessage,
    QueueProgress,
    QueueRef,
    QueueStats,
    Record,
    TopicInfo,
)
from cproxy.store._append_plan import plan
from cproxy.store._common import check_qid, dead_letters_matching, message_qids
from cproxy.store._records import batch, decode
from cproxy.store._sqlite_append import Dedup
from cproxy.store._sqlite_db import (
    DEAD_LETTER_SELECT,
    SYNCHRONOUS,
    Database,
    DirLock,
    dead_letter,
    dead_letter_row,
)
from cproxy.store._sqlite_schema import INSERT_BATCH, READ_BATCHES
from cproxy.store._sqlite_topics import SqliteTopics

__all__ = ["SqliteStore"]

logger = logging.getLogger(__name__)


#: Key of the record batches waiting in the open transaction (``Database.tx_state``).
_PENDING = "pending record batches"

#: An append's record batch of a queue joins the one pending before it while the two hold at
#: most this many messages: bigger rows would make a read from their middle decode more.
MERGE_MAX = 128

_DELETE_DEAD_LETTER = "DELETE FROM dead_letters WHERE grp = ? AND tid = ? AND qid = ? AND off = ?"
_UPSERT_PROGRESS = (
    "INSERT OR REPLACE INTO progress (grp, tid, qid, committed, finished) VALUES (?, ?, ?, ?, ?)"
)


class SqliteStore:
    """The SQLite ``Store``. See the module docstring for durability and concurrency; topics
    and retention are its collaborator ``SqliteTopics``."""

    def __init__(
        self,
        data_dir: Path,
        *,
        synchronous: str = "normal",
        busy_timeout_ms: int = 5000,
        group_commit: bool = True,
        threads: bool | None = None,
    ) -> None:
        if synchronous.lower() not in SYNCHRONOUS:
            raise ConfigError(f"synchronous must be one of {SYNCHRONOUS}, not {synchronous!r}")
        self._db = Database(
            Path(data_dir) / "cproxy.db",
            synchronous=synchronous.lower(),
            busy_timeout_ms=busy_timeout_ms,
            group_commit=group_commit,
            threads=threads,
        )
        #: Topics, their caches, retention (``_sqlite_topics``).
        self.topics = SqliteTopics(self._db)
        self._dedup = Dedup()  # used by the writer thread only

    @property
    def path(self) -> Path:
        """The database file."""
        return self._db.path

    async def open(self) -> None:
        if not self._db.is_open:
            await self._db.open(self.topics.load)
            logger.info("opened SQLite store %s", self.path)

    async def close(self) -> None:
        await self._db.close()

    async def ping(self) -> bool:
        return await self._db.ping()

    # -- topics (``SqliteTopics``) ------------------------------------------------------------
    async def create_topic(
        self,
        name: str,
        queues: int,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
    ) -> tuple[TopicInfo, bool]:
        return await self.topics.create_topic(name, queues, retention_ms, retention_bytes)

    async def update_topic(
        self, name: str, retention_ms: int | None, retention_bytes: int | None
    ) -> TopicInfo:
        return await self.topics.update_topic(name, retention_ms, retention_bytes)

    async def delete_topic(self, name: str) -> None:
        await self.topics.delete_topic(name)

    async def list_topics(self) -> list[TopicInfo]:
        return await self.topics.list_topics()

    async def queue_stats(self, topic: str) -> list[QueueStats]:
        return await self.topics.queue_stats(topic)

    async def offset_for_time(self, topic: str, qid: int, timestamp_ms: int) -> int:
        return await self.topics.offset_for_time(topic, qid, timestamp_ms)

    async def apply_retention(self, topic: str, now_ms: int) -> dict[int, int]:
        return await self.topics.apply_retention(topic, now_ms)

    # -- messages ------------------------------------------------------------------------------
    async def append(
        self,
        topic: str,
        messages: Sequence[NewMessage],
        now_ms: int,
        dedup_window_ms: int,
    ) -> list[AppendResult]:
        tid, queues = self.topics.topic(topic)
        qids = message_qids(topic, messages, queues)
        if not messages:
            return []
        return await self._db.write(
            functools.partial(self._append_tx, topic, tid, messages, qids, now_ms, dedup_window_ms),
            weight=len(messages),
            mergeable=True,
        )

    def _append_tx(
        self,
        topic: str,
        tid: int,
        messages: Sequence[NewMessage],
        qids: Sequence[int],
        now_ms: int,
        window_ms: int,
        conn: sqlite3.Connection,
    ) -> list[AppendResult]:
        tail = self.topics.tail
        # (tid, qid) -> (next offset, last produced_at) left by earlier appends of this
        # transaction: not committed yet, so not in ``nexts``/``lasts``.
        staged: dict[tuple[int, int], tuple[int, int]] = self._db.tx_state
        known = self._dedup.known(conn, tid, messages, now_ms, window_ms)
        out = plan(
            topic,
            tid,
            messages,
            qids,
            now_ms,
            window_ms > 0,
            known,
            lambda qid: staged.get((tid, qid)) or tail(tid, qid),
        )
        self._dedup.record(conn, out.dedup_rows, now_ms, window_ms)
        # One row per queue (record batches, ``_records``), inserted by deferred work: at the
        # end of the transaction, merged with the rows of the appends after this one.
        pending: dict[tuple[int, int], list[list[Record]]]
        pending = self._db.tx_state.setdefault(_PENDING, {})
        for qid, stored in out.stored.items():
            rows = pending.get((tid, qid))
            if rows is None:
                pending[tid, qid] = [stored]
            elif len(rows[-1]) + len(stored) <= MERGE_MAX:
                rows[-1] = rows[-1] + stored
            else:
                rows.append(stored)
        self._db.defer(_PENDING, self._insert_pending)

        def stage() -> None:
            for qid, tail in out.tails.items():
                staged[tid, qid] = tail

        def publish() -> None:
            self.topics.publish_tails(tid, out.tails)

        self._db.on_success(stage)
        self._db.on_commit(publish)
        return out.results

    def _insert_pending(self, conn: sqlite3.Connection) -> None:
        """Insert the record batches the transaction's appends left (``_append_tx``)."""
        pending: dict[tuple[int, int], list[list[Record]]] = self._db.tx_state.pop(_PENDING, {})
        conn.executemany(
            INSERT_BATCH,
            [(tid, *batch(rows)) for (tid, _), queue in pending.items() for rows in queue],
        )

    async def read(self, topic: str, qid: int, from_offset: int, max_count: int) -> list[Record]:
        tid, queues = self.topics.topic(topic)
        check_qid(topic, qid, queues)
        # From the floor on: a batch retention cut through may still hold records below it.
        floor, end = self.topics.read_range(tid, qid)
        start = max(from_offset, floor)
        # The cached tail is authoritative, so reading past it needs no trip to the database.
        if max_count <= 0 or start >= end:
            return []
        stop = start + max_count

        def run(conn: sqlite3.Connection) -> list[Record]:
            rows = conn.execute(READ_BATCHES, (tid, qid, start, stop)).fetchall()
            return decode(topic, qid, rows, start, stop)

        return await self._db.read(run)

    # -- groups --------------------------------------------------------------------------------
    async def save_group(self, name: str, config_json: bytes) -> None:
        await self._db.write(
            lambda conn: conn.execute(
                "INSERT INTO groups (name, config) VALUES (?, ?)"
                " ON CONFLICT (name) DO UPDATE SET config = excluded.config",
                (name, bytes(config_json)),
            )
        )

    async def load_groups(self) -> dict[str, bytes]:
        return await self._db.read(
            lambda conn: dict(conn.execute("SELECT name, config FROM groups").fetchall())
        )

    async def delete_group(self, name: str) -> None:
        def run(conn: sqlite3.Connection) -> None:
            for table, column in (("groups", "name"), ("progress", "grp"), ("dead_letters", "grp")):
                conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (name,))

        await self._db.write(run)

    async def load_progress(self, group: str) -> dict[QueueRef, QueueProgress]:
        rows = await self._db.read(
            lambda conn: conn.execute(
                "SELECT tid, qid, committed, finished FROM progress WHERE grp = ?", (group,)
            ).fetchall()
        )
        return {
            (self.topics.name_of(tid), qid): QueueProgress.from_detail_json(committed, finished)
            for tid, qid, committed, finished in rows
        }

    async def commit(
        self,
        group: str,
        progress: Mapping[QueueRef, QueueProgress],
        dead_letters: Sequence[DeadLetter] = (),
        redrive_done: Sequence[MessageRef] = (),
    ) -> None:
        # Build every row first: an unknown topic raises before the transaction starts.
        progress_rows = [
            (group, self.topics.topic(topic)[0], qid, p.committed, p.detail_json().decode())
            for (topic, qid), p in progress.items()
        ]
        dead_rows = [
            dead_letter_row(group, self.topics.topic(dl.message.topic)[0], dl)
            for dl in dead_letters
        ]
        done_rows = self._redrive_rows(group, redrive_done)

        def run(conn: sqlite3.Connection) -> None:
            conn.executemany(_UPSERT_PROGRESS, progress_rows)
            # Deletes go first so a redriven message that was dead-lettered again stays dead.
            conn.executemany(_DELETE_DEAD_LETTER, done_rows)
            conn.executemany(
                "INSERT OR REPLACE INTO dead_letters (grp, tid, qid, off, key, id, headers, body,"
                " produced_at_ms, attempts, last_error, dead_lettered_at_ms, redriving)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                dead_rows,
            )

        # Progress rows touch no message rows: appends before and after it still share rows.
        await self._db.write(run, mergeable=True)

    def _redrive_rows(
        self, group: str, redrive_done: Sequence[MessageRef]
    ) -> list[tuple[str, int, int, int]]:
        # A topic that is gone has no dead letters left.
        tids = {topic: self.topics.tid_of(topic) for topic, _, _ in redrive_done}
        return [
            (group, tid, qid, off)
            for topic, qid, off in redrive_done
            if (tid := tids[topic]) is not None
        ]

    async def commit_with_outputs(
        self,
        group: str,
        progress: Mapping[QueueRef, QueueProgress],
        outputs: Sequence[tuple[str, Sequence[NewMessage]]],
        now_ms: int,
        dedup_window_ms: int,
        redrive_done: Sequence[MessageRef] = (),
    ) -> list[list[AppendResult]]:
        # One append per topic: appends of one write do not see each other's staged offsets
        # (``_append_tx`` stages them when the write succeeds), so outputs to the same topic
        # go as one append, and their results are split again afterwards.
        by_topic: dict[str, list[NewMessage]] = {}
        for topic, messages in outputs:
            by_topic.setdefault(topic, []).extend(messages)
        # Resolve everything first: an unknown topic or qid raises before the transaction.
        appends = []
        for topic, messages in by_topic.items():
            tid, queues = self.topics.topic(topic)
            qids = message_qids(topic, messages, queues)
            appends.append((topic, tid, messages, qids))
        progress_rows = [
            (group, self.topics.topic(topic)[0], qid, p.committed, p.detail_json().decode())
            for (topic, qid), p in progress.items()
        ]
        done_rows = self._redrive_rows(group, redrive_done)

        def run(conn: sqlite3.Connection) -> dict[str, list[AppendResult]]:
            stored = {
                topic: self._append_tx(topic, tid, ms, qids, now_ms, dedup_window_ms, conn)
                for topic, tid, ms, qids in appends
                if ms
            }
            conn.executemany(_UPSERT_PROGRESS, progress_rows)
            conn.executemany(_DELETE_DEAD_LETTER, done_rows)
            return stored

        stored = await self._db.write(
            run, weight=max(1, sum(len(ms) for _, ms in outputs)), mergeable=True
        )
        taken: dict[str, int] = {}
        results: list[list[AppendResult]] = []
        for topic, messages in outputs:
            start = taken.get(topic, 0)
            taken[topic] = start + len(messages)
            results.append(stored.get(topic, [])[start : start + len(messages)])
        return results

    # -- dead letters --------------------------------------------------------------------------
    def _dead_filter(self, topic: str | None) -> int | None:
        if topic is None:
            return None
        tid = self.topics.tid_of(topic)
        # An unknown topic matches nothing; -1 is never a tid.
        return tid if tid is not None else -1

    async def list_dead_letters(
        self, group: str, topic: str | None, limit: int
    ) -> list[DeadLetter]:
        if limit <= 0:
            return []
        tid = self._dead_filter(topic)
        rows = await self._db.read(
            lambda conn: conn.execute(
                DEAD_LETTER_SELECT + " LIMIT ?", (group, 0, tid, tid, limit)
            ).fetchall()
        )
        return [dead_letter(group, row) for row in rows]

    async def count_dead_letters(self, group: str) -> int:
        row = await self._db.read(
            lambda conn: conn.execute(
                "SELECT count(*) FROM dead_letters WHERE grp = ? AND redriving = 0", (group,)
            ).fetchone()
        )
        return int(row[0])

    async def start_redrive(
        self,
        group: str,
        topic: str | None,
        queues: Collection[QueueRef] | None = None,
        refs: Collection[MessageRef] | None = None,
    ) -> list[DeadLetter]:
        tid = self._dead_filter(topic)
        wanted = None if queues is None else set(queues)

        def run(conn: sqlite3.Connection) -> list[DeadLetter]:
            rows = conn.execute(DEAD_LETTER_SELECT, (group, 0, tid, tid)).fetchall()
            dead = dead_letters_matching((dead_letter(group, row) for row in rows), refs, None)
            if wanted is not None:
                dead = [d for d in dead if (d.message.topic, d.message.qid) in wanted]
            tids = {name: self._dead_filter(name) for name in {d.message.topic for d in dead}}
            conn.executemany(
                "UPDATE dead_letters SET redriving = 1 WHERE grp = ? AND tid = ? AND qid = ?"
                " AND off = ?",
                [(group, tids[d.message.topic], d.message.qid, d.message.offset) for d in dead],
            )
            return dead

        dead = await self._db.write(run)
        return [dataclasses.replace(d, redriving=True) for d in dead]

    async def load_redriving(self, group: str) -> list[DeadLetter]:
        rows = await self._db.read(
            lambda conn: conn.execute(DEAD_LETTER_SELECT, (group, 1, None, None)).fetchall()
        )
        return [dead_letter(group, row) for row in rows]

    async def delete_dead_letters(
        self,
        group: str,
        topic: str | None = None,
        refs: Collection[MessageRef] | None = None,
        before_ms: int | None = None,
    ) -> int:
        tid = self._dead_filter(topic)

        def run(conn: sqlite3.Connection) -> int:
            if refs is None:  # by topic and age only: no need to read the rows
                return conn.execute(
                    "DELETE FROM dead_letters WHERE grp = ? AND redriving = 0"
                    " AND (? IS NULL OR tid = ?) AND (? IS NULL OR dead_lettered_at_ms < ?)",
                    (group, tid, tid, before_ms, before_ms),
                ).rowcount
            rows = conn.execute(DEAD_LETTER_SELECT, (group, 0, tid, tid)).fetchall()
            doomed = dead_letters_matching(
                (dead_letter(group, row) for row in rows), refs, before_ms
            )
            conn.executemany(
                "DELETE FROM dead_letters WHERE grp = ? AND tid = ? AND qid = ? AND off = ?",
                [
                    (group, self._dead_filter(d.message.topic), d.message.qid, d.message.offset)
                    for d in doomed
                ],
            )
            return len(doomed)

        return await self._db.write(run)


def check_data_dir(data_dir: Path) -> None:
    """Raise ``StoreError`` (one clear sentence) when another process uses ``data_dir``.

    For ``cproxy serve`` to fail fast, before anything starts; the store takes the same lock
    again when it opens (a tiny window in which another process could win is then reported
    by the store).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = DirLock(data_dir)
    lock.acquire()
    lock.release()
