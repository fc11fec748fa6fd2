"""The PostgreSQL store's log half (``base.MessageLog``): topics, append, read, seek by time.

How an append allocates offsets without deadlocks is described in ``postgres.py``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any

from cproxy.errors import StoreError, TopicConflict
from cproxy.model import AppendResult, Message, NewMessage, QueueStats, TopicInfo
from cproxy.store._append_plan import Stored, plan
from cproxy.store._common import check_qid, check_queues, dedup_live, message_qids
from cproxy.store._pg_base import Conn, PgBase
from cproxy.store._pg_sql import (
    INSERT_DEDUP,
    INSERT_MESSAGES,
    LOCK_IDS,
    LOCK_QUEUES,
    UPDATE_QUEUES,
)

logger = logging.getLogger(__name__)

#: Prune expired dedup entries after this many new ones (per store), amortising the DELETE.
PRUNE_EVERY = 10_000


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
    async def create_topic(self, name: str, queues: int) -> tuple[TopicInfo, bool]:
        check_queues(queues)
        async with self._conn() as conn, conn.transaction():
            # Two proxies creating one topic: the second INSERT waits for the first's COMMIT,
            # then does nothing, and the SELECT below sees the committed row.
            tid = await conn.fetchval(
                "INSERT INTO topics (name, queues) VALUES ($1, $2)"
                " ON CONFLICT (name) DO NOTHING RETURNING tid",
                name,
                queues,
            )
            if tid is None:
                row = await conn.fetchrow("SELECT tid, queues FROM topics WHERE name = $1", name)
                if row is None:  # only if someone deletes topics by hand
                    raise StoreError(f"topic {name!r} vanished while it was being created")
                if row[1] != queues:
                    raise TopicConflict(f"topic {name!r} exists with {row[1]} queues, not {queues}")
                self._topics[name] = (row[0], row[1])
                return TopicInfo(name, queues), False
            await conn.execute(
                "INSERT INTO queues (tid, qid) SELECT $1, generate_series(0, $2 - 1)", tid, queues
            )
        self._topics[name] = (tid, queues)  # only once committed
        return TopicInfo(name, queues), True

    async def list_topics(self) -> list[TopicInfo]:
        async with self._conn() as conn:
            rows = await conn.fetch("SELECT name, queues FROM topics")
        return sorted((TopicInfo(name, queues) for name, queues in rows), key=lambda t: t.name)

    async def queue_stats(self, topic: str) -> list[QueueStats]:
        async with self._conn() as conn:
            tid, _ = await self._topic(conn, topic)
            rows = await conn.fetch(
                "SELECT qid, next_offset FROM queues WHERE tid = $1 ORDER BY qid", tid
            )
        # No retention yet: every queue still starts at offset 0.
        return [QueueStats(qid, 0, nxt) for qid, nxt in rows]

    # -- messages ------------------------------------------------------------------------------
    async def append(
        self,
        topic: str,
        messages: Sequence[NewMessage],
        now_ms: int,
        dedup_window_ms: int,
    ) -> list[AppendResult]:
        async with self._conn() as conn:
            tid, queues = await self._topic(conn, topic)
            qids = message_qids(topic, messages, queues)
            if not messages:
                return []
            dedup = dedup_window_ms > 0
            ids = sorted({m.id for m in messages if m.id is not None}) if dedup else []
            async with conn.transaction():
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
                touched = sorted(
                    {q for q, m in zip(qids, messages, strict=True) if m.id not in known}
                )
                tails = {
                    qid: (nxt, last)
                    for qid, nxt, last in await conn.fetch(LOCK_QUEUES, tid, touched)
                }
                out = plan(topic, tid, messages, qids, now_ms, dedup, known, tails.__getitem__)
                if out.rows:
                    await conn.execute(INSERT_MESSAGES, tid, *columns(out.rows)[1:])
                    tails_now = [(qid, nxt, ts) for qid, (nxt, ts) in out.tails.items()]
                    await conn.execute(UPDATE_QUEUES, tid, *columns(tails_now))
                if out.dedup_rows:
                    await conn.execute(INSERT_DEDUP, tid, *columns(out.dedup_rows)[1:])
            if out.dedup_rows:
                await self._maybe_prune(conn, len(out.dedup_rows), now_ms, dedup_window_ms)
        return out.results

    async def _maybe_prune(self, conn: Conn, added: int, now_ms: int, window_ms: int) -> None:
        # Hints only: another proxy prunes on its own count, which at worst prunes sooner.
        self._max_window_ms = max(self._max_window_ms, window_ms)
        self._since_prune += added
        if self._since_prune >= PRUNE_EVERY:
            self._since_prune = 0
            status = await conn.execute(
                "DELETE FROM dedup WHERE produced_at_ms <= $1", now_ms - self._max_window_ms
            )
            logger.debug("pruned expired dedup entries: %s", status)

    async def read(self, topic: str, qid: int, from_offset: int, max_count: int) -> list[Message]:
        async with self._conn() as conn:
            tid, queues = await self._topic(conn, topic)
            check_qid(topic, qid, queues)
            if max_count <= 0:
                return []
            rows = await conn.fetch(
                "SELECT off, produced_at_ms, key, id, headers, body FROM messages"
                " WHERE tid = $1 AND qid = $2 AND off >= $3 ORDER BY off LIMIT $4",
                tid,
                qid,
                max(from_offset, 0),
                max_count,
            )
        return [
            Message(topic, qid, off, key, body, headers, msg_id, ts)
            for off, ts, key, msg_id, headers, body in rows
        ]

    async def offset_for_time(self, topic: str, qid: int, timestamp_ms: int) -> int:
        async with self._conn() as conn:
            tid, queues = await self._topic(conn, topic)
            check_qid(topic, qid, queues)
            row = await conn.fetchrow(
                "SELECT next_offset, last_produced_at_ms FROM queues WHERE tid = $1 AND qid = $2",
                tid,
                qid,
            )
            if row is None:
                raise StoreError(f"queue {qid} of topic {topic!r} has no offset counter")
            hi, last = row
            if hi == 0 or last < timestamp_ms:
                return int(hi)
            # produced_at_ms is non-decreasing per queue (appends clamp it), so bisect offsets:
            # a handful of primary-key lookups instead of an index on time.
            lo: int = 0
            while lo < hi:
                mid = (lo + hi) // 2
                ts = await conn.fetchval(
                    "SELECT produced_at_ms FROM messages WHERE tid = $1 AND qid = $2 AND off = $3",
                    tid,
                    qid,
                    mid,
                )
                if ts < timestamp_ms:
                    lo = mid + 1
                else:
                    hi = mid
            return lo
