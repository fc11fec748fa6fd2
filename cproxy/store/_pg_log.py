"""The PostgreSQL store's log half (``base.MessageLog``): topics, append, read, seek by time.

How an append allocates offsets without deadlocks is described in ``postgres.py``.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Sequence
from typing import Any

from cproxy.errors import StoreError, TopicConflict
from cproxy.model import AppendResult, NewMessage, QueueStats, Record, TopicInfo
from cproxy.store._append_plan import Stored, plan
from cproxy.store._common import (
    check_qid,
    check_queues,
    dedup_live,
    message_qids,
    topic_not_found,
)
from cproxy.store._pg_base import PgBase
from cproxy.store._pg_schema import FOREIGN_ERRORS
from cproxy.store._pg_sql import (
    BATCH_AT,
    INSERT_BATCHES,
    INSERT_DEDUP,
    LOCK_IDS,
    LOCK_QUEUES,
    NOTIFY_APPEND,
    PRUNE_DEDUP,
    READ_BATCHES,
    READ_MANY_FROM_FLOOR,
    UPDATE_QUEUES,
    Conn,
)
from cproxy.store._records import batch, decode, first_at, narrow, sizes
from cproxy.store._retention import check_retention, queue_cut

logger = logging.getLogger(__name__)

#: Expired dedup entries deleted per entry added, oldest first, in one DELETE per
#: ``PRUNE_EVERY`` entries added. One DELETE of every expired entry per 10,000 added (as
#: before) held that append for ~10-40 ms at 300,000 entries; bounded ones, ten times as
#: often, keep up with what expires and hold an append for a few ms.
PRUNE_PER_ENTRY = 4
PRUNE_EVERY = 1000
#: Offsets deleted per retention transaction (whole record batches only).
DELETE_BATCH = 2000

_TOPIC_COLUMNS = "tid, name, queues, retention_ms, retention_bytes"


def id_lock_key(msg_id: str) -> int:
    """A signed 32-bit advisory-lock key for a message id (paired with the tid)."""
    digest = hashlib.blake2b(msg_id.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)


def columns(rows: Sequence[Sequence[Any]]) -> list[list[Any]]:
    """Rows as column arrays, for ``unnest``."""
    return [list(column) for column in zip(*rows, strict=True)]


class PgLog(PgBase):
    """Topics and messages over the pool of ``PgBase``."""

    # -- topics --------------------------------------------------------------------------------
    async def create_topic(
        self,
        name: str,
        queues: int,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
    ) -> tuple[TopicInfo, bool]:
        check_queues(queues)
        check_retention(retention_ms, retention_bytes)
        async with self._conn() as conn, conn.transaction():
            # Two proxies creating one topic: the second INSERT waits for the first's COMMIT,
            # then does nothing, and the SELECT below sees the committed row.
            tid = await conn.fetchval(
                "INSERT INTO topics (name, queues, retention_ms, retention_bytes)"
                " VALUES ($1, $2, $3, $4) ON CONFLICT (name) DO NOTHING RETURNING tid",
                name,
                queues,
                retention_ms,
                retention_bytes,
            )
            if tid is None:
                row = await conn.fetchrow(
                    f"SELECT {_TOPIC_COLUMNS} FROM topics WHERE name = $1", name
                )
                if row is None:  # deleted by another proxy in between
                    raise StoreError(f"topic {name!r} vanished while it was being created")
                if row[2] != queues:
                    raise TopicConflict(f"topic {name!r} exists with {row[2]} queues, not {queues}")
                self._topics[name] = (row[0], row[2])
                return TopicInfo(*row[1:]), False
            await conn.execute(
                "INSERT INTO queues (tid, qid) SELECT $1, generate_series(0, $2 - 1)", tid, queues
            )
        self._topics[name] = (tid, queues)  # only once committed
        return TopicInfo(name, queues, retention_ms, retention_bytes), True

    async def update_topic(
        self, name: str, retention_ms: int | None, retention_bytes: int | None
    ) -> TopicInfo:
        check_retention(retention_ms, retention_bytes)
        async with self._conn() as conn:
            row = await conn.fetchrow(
                "UPDATE topics SET retention_ms = $2, retention_bytes = $3 WHERE name = $1"
                f" RETURNING {_TOPIC_COLUMNS}",
                name,
                retention_ms,
                retention_bytes,
            )
        if row is None:
            self._topics.pop(name, None)
            raise topic_not_found(name)
        return TopicInfo(*row[1:])

    async def delete_topic(self, name: str) -> None:
        # One transaction: PostgreSQL takes a large DELETE without blocking appends to other
        # topics (row locks only), and no other proxy ever sees half a topic.
        async with self._conn() as conn, conn.transaction():
            tid = await conn.fetchval("SELECT tid FROM topics WHERE name = $1 FOR UPDATE", name)
            if tid is None:
                self._topics.pop(name, None)
                raise topic_not_found(name)
            for table in ("progress", "dead_letters", "dedup", "batches", "queues", "topics"):
                await conn.execute(f"DELETE FROM {table} WHERE tid = $1", tid)
        entry = self._topics.pop(name, None)
        for qid in range(entry[1] if entry else 0):
            self._bytes.forget((tid, qid))

    async def list_topics(self) -> list[TopicInfo]:
        async with self._conn() as conn:
            rows = await conn.fetch(f"SELECT {_TOPIC_COLUMNS} FROM topics")
        return sorted((TopicInfo(*row[1:]) for row in rows), key=lambda t: t.name)

    async def queue_stats(self, topic: str) -> list[QueueStats]:
        async with self._conn() as conn:
            tid, _ = await self._topic(conn, topic)
            rows = await conn.fetch(
                "SELECT qid, min_offset, next_offset FROM queues WHERE tid = $1 ORDER BY qid", tid
            )
        return [QueueStats(qid, lo, nxt) for qid, lo, nxt in rows]

    async def apply_retention(self, topic: str, now_ms: int) -> dict[int, int]:
        async with self._conn() as conn:
            row = await conn.fetchrow(f"SELECT {_TOPIC_COLUMNS} FROM topics WHERE name = $1", topic)
            if row is None:
                raise topic_not_found(topic)
            tid, _, _, retention_ms, retention_bytes = row
            if retention_ms is None and retention_bytes is None:
                return {}
            bounds = await conn.fetch(
                "SELECT qid, min_offset, next_offset FROM queues WHERE tid = $1 ORDER BY qid", tid
            )
        moved: dict[int, int] = {}
        for qid, floor, nxt in bounds:
            cut = await queue_cut(
                self._bytes,
                (tid, qid),
                floor,
                nxt,
                (retention_ms, retention_bytes),
                now_ms,
                functools.partial(self.offset_for_time, topic, qid),
                functools.partial(self._sizes, tid, qid),
            )
            if cut > floor:
                moved[qid] = await self._cut(tid, qid, floor, cut)
        if moved:
            logger.info("topic=%s retention moved min_offset=%s", topic, moved)
        return moved

    async def _sizes(self, tid: int, qid: int, lo: int, hi: int) -> list[tuple[int, int]]:
        async with self._conn() as conn:
            rows = await conn.fetch(READ_BATCHES, tid, qid, lo, hi)
        return sizes([(base, nxt, blob) for base, nxt, blob in rows], lo, hi)

    async def _cut(self, tid: int, qid: int, floor: int, cut: int) -> int:
        """Delete ``[floor, cut)`` in batches, raising ``min_offset`` with each; the new min."""
        low = floor
        for lo in range(floor, cut, DELETE_BATCH):
            hi = min(cut, lo + DELETE_BATCH)
            async with self._conn() as conn, conn.transaction():
                # Another proxy may have cut further meanwhile: never move the floor down.
                low = await conn.fetchval(
                    "UPDATE queues SET min_offset = greatest(min_offset, $3)"
                    " WHERE tid = $1 AND qid = $2 RETURNING min_offset",
                    tid,
                    qid,
                    hi,
                )
                # Whole batches only: one the cut goes through stays, below the new floor.
                await conn.execute(
                    "DELETE FROM batches WHERE tid = $1 AND qid = $2 AND base < $3"
                    " AND next_off <= $3",
                    tid,
                    qid,
                    hi,
                )
        return int(low)

    # -- messages ------------------------------------------------------------------------------
    async def append(
        self,
        topic: str,
        messages: Sequence[NewMessage],
        now_ms: int,
        dedup_window_ms: int,
    ) -> list[AppendResult]:
        async with self._conn() as conn:
            async with conn.transaction():
                results, added = await self.append_within(
                    conn, topic, messages, now_ms, dedup_window_ms
                )
            if added:
                await self._maybe_prune(conn, added, now_ms, dedup_window_ms)
        return results

    async def append_within(
        self,
        conn: Conn,
        topic: str,
        messages: Sequence[NewMessage],
        now_ms: int,
        dedup_window_ms: int,
    ) -> tuple[list[AppendResult], int]:
        """``append`` inside a transaction the caller holds on ``conn`` (an ack with
        outputs stores them with the group's progress); also returns how many dedup entries
        it added (the caller prunes after the commit, ``_maybe_prune``)."""
        tid, queues = await self._topic(conn, topic)
        qids = message_qids(topic, messages, queues)
        if not messages:
            return [], 0
        dedup = dedup_window_ms > 0
        ids = sorted({m.id for m in messages if m.id is not None}) if dedup else []
        known: dict[str, Stored] = {}
        if ids:
            keys = sorted({id_lock_key(i) for i in ids})
            await conn.execute(LOCK_IDS, tid, keys)
            for msg_id, qid, off, ts in await conn.fetch(
                "SELECT id, qid, off, produced_at_ms FROM dedup"
                " WHERE tid = $1 AND id = ANY($2::text[])",
                tid,
                ids,
            ):
                if dedup_live(ts, now_ms, dedup_window_ms):
                    known[msg_id] = (qid, off, ts)
        # Lock only the queues that get a new message, in qid order.
        touched = sorted({q for q, m in zip(qids, messages, strict=True) if m.id not in known})
        tails = {qid: (nxt, last) for qid, nxt, last in await conn.fetch(LOCK_QUEUES, tid, touched)}
        out = plan(topic, tid, messages, qids, now_ms, dedup, known, tails.__getitem__)
        if out.stored:
            # One row per queue of this call (record batches, ``_records``).
            await conn.execute(
                INSERT_BATCHES, tid, *columns([batch(ms) for ms in out.stored.values()])
            )
            tails_now = [(qid, nxt, ts) for qid, (nxt, ts) in out.tails.items()]
            await conn.execute(UPDATE_QUEUES, tid, *columns(tails_now))
            if self._notify_appends:
                # Delivered at COMMIT, never for a rolled-back append.
                await conn.execute(NOTIFY_APPEND, [f"{topic}:{q}:{n}" for q, n, _ in tails_now])
        if out.dedup_rows:
            await conn.execute(INSERT_DEDUP, tid, *columns(out.dedup_rows)[1:])
        return out.results, len(out.dedup_rows)

    async def _maybe_prune(self, conn: Conn, added: int, now_ms: int, window_ms: int) -> None:
        """Delete some expired dedup entries, oldest first: once every ``PRUNE_EVERY``
        entries added, up to about ``PRUNE_PER_ENTRY`` per entry added since the last time.
        Hints only: another proxy prunes on its own count; entries are stored a window ahead
        of where a scan ends, so a scan never passes one that has not expired yet.

        It runs after the append committed, so it never fails the append: a failed prune is
        logged, and the next one owes its entries too. (One way it fails: it locks entries
        in time order, an append that re-sends expired ids locks theirs in id order, and
        PostgreSQL ends such a deadlock by failing one of the two.)"""
        self._max_window_ms = max(self._max_window_ms, window_ms)
        self._prune_owed += added
        if self._prune_owed < PRUNE_EVERY:
            return
        owed, self._prune_owed = self._prune_owed, 0
        try:
            row = await conn.fetchrow(
                PRUNE_DEDUP, self._pruned_to_ms, now_ms - self._max_window_ms,
                PRUNE_PER_ENTRY * owed,
            )  # fmt: skip
        except FOREIGN_ERRORS as exc:
            self._prune_owed += owed
            logger.warning("deleting expired dedup entries failed, will try again: %s", exc)
            return
        assert row is not None  # an aggregate's one row
        deleted, newest = row
        if newest is not None:
            self._pruned_to_ms = max(self._pruned_to_ms, newest)
        if deleted:
            logger.debug("pruned %d expired dedup entries", deleted)

    async def read(self, topic: str, qid: int, from_offset: int, max_count: int) -> list[Record]:
        return (await self.read_many(topic, [(qid, from_offset, max_count)]))[0]

    async def read_many(
        self, topic: str, wants: Sequence[tuple[int, int, int]]
    ) -> list[list[Record]]:
        """``read(topic, qid, from_offset, max_count)`` for each ``(qid, from_offset,
        max_count)`` of ``wants``, in one statement (one round trip and one snapshot)."""
        async with self._conn() as conn:
            tid, queues = await self._topic(conn, topic)
            for qid, _, _ in wants:
                check_qid(topic, qid, queues)
            if all(n <= 0 for _, _, n in wants):
                return [[] for _ in wants]
            rows = await conn.fetch(
                READ_MANY_FROM_FLOOR, tid, [w[0] for w in wants], [w[1] for w in wants],
                [max(0, w[2]) for w in wants],
            )  # fmt: skip
        found: list[list[tuple[int, int, bytes]]] = [[] for _ in wants]
        starts = [0] * len(wants)
        for i, start, base, nxt, blob in rows:
            starts[i - 1] = start
            if base is not None:
                found[i - 1].append((base, nxt, blob))
        return [
            decode(topic, qid, found[k], starts[k], starts[k] + n) if found[k] and n > 0 else []
            for k, (qid, _, n) in enumerate(wants)
        ]

    async def offset_for_time(self, topic: str, qid: int, timestamp_ms: int) -> int:
        async with self._conn() as conn:
            tid, queues = await self._topic(conn, topic)
            check_qid(topic, qid, queues)
            row = await conn.fetchrow(
                "SELECT min_offset, next_offset, last_produced_at_ms FROM queues"
                " WHERE tid = $1 AND qid = $2",
                tid,
                qid,
            )
            if row is None:
                raise StoreError(f"queue {qid} of topic {topic!r} has no offset counter")
            lo, hi, last = row
            if lo >= hi or last < timestamp_ms:
                return int(hi)
            # produced_at_ms is non-decreasing per queue (appends clamp it): bisect offsets,
            # one batch per probe (``_records.narrow``), a primary-key lookup each.
            low, high = int(lo), int(hi)
            while low < high:
                mid = (low + high) // 2
                row = await conn.fetchrow(BATCH_AT, tid, qid, mid)
                head = None if row is None else (row[0], row[1], row[2], row[3], row[4])
                low, high, inside = narrow(low, high, mid, head, timestamp_ms)
                if head is not None and inside:
                    low = first_at(head, timestamp_ms)
                    break
        return max(low, int(lo))
