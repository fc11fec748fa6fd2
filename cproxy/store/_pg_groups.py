"""The PostgreSQL store's group-state half (``base.GroupStateStore``).

Group configs, progress, dead letters and redrives; ``commit`` is one transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import asyncpg

from cproxy.model import DeadLetter, MessageRef, QueueProgress, QueueRef, Record
from cproxy.store._pg_base import PgBase
from cproxy.store._pg_log import columns
from cproxy.store._pg_sql import (
    DEAD_LETTER_COLUMNS,
    DELETE_DEAD_LETTERS,
    UPSERT_DEAD_LETTERS,
    UPSERT_PROGRESS,
    Conn,
)


class PgGroupState(PgBase):
    """Group configs, progress and dead letters over the pool of ``PgBase``."""

    # -- groups --------------------------------------------------------------------------------
    async def save_group(self, name: str, config_json: bytes) -> None:
        async with self._conn() as conn:
            await conn.execute(
                "INSERT INTO groups (name, config) VALUES ($1, $2)"
                " ON CONFLICT (name) DO UPDATE SET config = excluded.config",
                name,
                bytes(config_json),
            )

    async def load_groups(self) -> dict[str, bytes]:
        async with self._conn() as conn:
            return {name: config for name, config in await conn.fetch("SELECT * FROM groups")}

    async def delete_group(self, name: str) -> None:
        async with self._conn() as conn, conn.transaction():
            for table, column in (("groups", "name"), ("progress", "grp"), ("dead_letters", "grp")):
                await conn.execute(f"DELETE FROM {table} WHERE {column} = $1", name)

    async def load_progress(self, group: str) -> dict[QueueRef, QueueProgress]:
        async with self._conn() as conn:
            rows = await conn.fetch(
                "SELECT t.name, p.qid, p.committed, p.finished::text FROM progress p"
                " JOIN topics t ON t.tid = p.tid WHERE p.grp = $1",
                group,
            )
        return {
            (name, qid): QueueProgress.from_detail_json(committed, finished)
            for name, qid, committed, finished in rows
        }

    async def commit(
        self,
        group: str,
        progress: Mapping[QueueRef, QueueProgress],
        dead_letters: Sequence[DeadLetter] = (),
        redrive_done: Sequence[MessageRef] = (),
    ) -> None:
        async with self._conn() as conn, conn.transaction():
            await self.commit_within(conn, group, progress, dead_letters, redrive_done)

    async def commit_within(
        self,
        conn: Conn,
        group: str,
        progress: Mapping[QueueRef, QueueProgress],
        dead_letters: Sequence[DeadLetter] = (),
        redrive_done: Sequence[MessageRef] = (),
    ) -> None:
        """``commit`` inside a transaction the caller holds on ``conn`` (a hand-over writes
        the final progress of several groups and frees the queue in one transaction).

        In cluster mode (``join_cluster``) the queues whose progress or dead letters are written
        must be owned by this proxy at the epoch it holds, else ``QueueNotOwned`` is raised
        and nothing is written (checked first, in the same transaction).
        """
        # Resolve every topic first: an unknown one raises before anything is written.
        progress_rows: list[tuple[int, int, int, str]] = []
        touched: dict[tuple[int, int], QueueRef] = {}
        for (topic, qid), p in progress.items():
            tid = (await self._topic(conn, topic))[0]
            progress_rows.append((tid, qid, p.committed, p.detail_json().decode()))
            touched[tid, qid] = (topic, qid)
        # One row per message, the last one winning (as an upsert of each in turn would).
        dead_rows: dict[tuple[int, int, int], tuple[Any, ...]] = {}
        for dl in dead_letters:
            tid, m = (await self._topic(conn, dl.message.topic))[0], dl.message
            dead_rows[tid, m.qid, m.offset] = (
                tid, m.qid, m.offset, m.key, m.id, m.headers_json, m.body_json,
                m.produced_at_ms, dl.attempts, dl.last_error, dl.dead_lettered_at_ms,
                dl.redriving,
            )  # fmt: skip
            touched[tid, m.qid] = (m.topic, m.qid)
        done_rows: list[tuple[int, int, int]] = []
        for topic, qid, off in redrive_done:
            maybe_tid = await self._tid_or_none(conn, topic)
            if maybe_tid is not None:  # a topic that is gone has no dead letters left
                done_rows.append((maybe_tid, qid, off))
        if self._fence is not None:
            await self._fence.check(conn, touched)
        if progress_rows:
            await conn.execute(UPSERT_PROGRESS, group, *columns(progress_rows))
        # Deletes go first so a redriven message that was dead-lettered again stays dead.
        if done_rows:
            await conn.execute(DELETE_DEAD_LETTERS, group, *columns(done_rows))
        if dead_rows:
            await conn.execute(UPSERT_DEAD_LETTERS, group, *columns(list(dead_rows.values())))

    # -- dead letters --------------------------------------------------------------------------
    async def _dead_letters(
        self, group: str, redriving: bool, topic: str | None, limit: int | None = None
    ) -> list[DeadLetter]:
        async with self._conn() as conn:
            # An unknown topic matches nothing; -1 is never a tid.
            tid = await self._topic_filter(conn, topic)
            rows = await conn.fetch(
                f"SELECT {DEAD_LETTER_COLUMNS} FROM dead_letters d JOIN topics t ON t.tid = d.tid"
                " WHERE d.grp = $1 AND d.redriving = $2 AND ($3::int IS NULL OR d.tid = $3)"
                ' ORDER BY t.name COLLATE "C", d.qid, d.off LIMIT $4',
                group,
                redriving,
                tid,
                limit,
            )
        return [_dead_letter(group, row) for row in rows]

    async def list_dead_letters(
        self, group: str, topic: str | None, limit: int
    ) -> list[DeadLetter]:
        if limit <= 0:
            self._check_open()
            return []
        return await self._dead_letters(group, False, topic, limit)

    async def count_dead_letters(self, group: str) -> int:
        async with self._conn() as conn:
            count = await conn.fetchval(
                "SELECT count(*) FROM dead_letters WHERE grp = $1 AND NOT redriving", group
            )
        return int(count)

    async def start_redrive(
        self,
        group: str,
        topic: str | None,
        queues: Collection[QueueRef] | None = None,
        refs: Collection[MessageRef] | None = None,
    ) -> list[DeadLetter]:
        names, qids = ([q[0] for q in queues], [q[1] for q in queues]) if queues else ([], [])
        named = list(refs or ())
        async with self._conn() as conn:
            tid = await self._topic_filter(conn, topic)
            rows = await conn.fetch(
                f"UPDATE dead_letters d SET redriving = true FROM topics t WHERE t.tid = d.tid"
                " AND d.grp = $1 AND NOT d.redriving AND ($2::int IS NULL OR d.tid = $2)"
                " AND ($3 OR (t.name, d.qid) IN (SELECT * FROM unnest($4::text[], $5::int[])))"
                f" AND ({_among_refs(6)})"
                f" RETURNING {DEAD_LETTER_COLUMNS}",
                group, tid, queues is None, names, qids,
                refs is None, *columns(named) if named else ([], [], []),
            )  # fmt: skip
        # Python's str order is code point order, as COLLATE "C" on UTF-8.
        marked = [_dead_letter(group, row) for row in rows]
        return sorted(marked, key=lambda d: d.message.ref)

    async def load_redriving(self, group: str) -> list[DeadLetter]:
        return await self._dead_letters(group, True, None)

    async def delete_dead_letters(
        self,
        group: str,
        topic: str | None = None,
        refs: Collection[MessageRef] | None = None,
        before_ms: int | None = None,
    ) -> int:
        named = list(refs or ())
        async with self._conn() as conn:
            tid = await self._topic_filter(conn, topic)
            status = await conn.execute(
                "DELETE FROM dead_letters d USING topics t WHERE t.tid = d.tid"
                " AND d.grp = $1 AND NOT d.redriving AND ($2::int IS NULL OR d.tid = $2)"
                " AND ($3::bigint IS NULL OR d.dead_lettered_at_ms < $3)"
                f" AND ({_among_refs(4)})",
                group, tid, before_ms, refs is None, *columns(named) if named else ([], [], []),
            )  # fmt: skip
        return int(status.split()[-1])


def _among_refs(n: int) -> str:
    """SQL: parameter ``$n`` true (any dead letter), or the dead letter is among those named
    by the next three (arrays of topics, qids, offsets)."""
    return (
        f"${n} OR (t.name, d.qid, d.off) IN"
        f" (SELECT * FROM unnest(${n + 1}::text[], ${n + 2}::int[], ${n + 3}::bigint[]))"
    )


def _dead_letter(group: str, row: asyncpg.Record) -> DeadLetter:
    """A ``DeadLetter`` from a row of ``DEAD_LETTER_COLUMNS``."""
    return DeadLetter(group, Record(*row[:8]), row[8], row[9], row[10], row[11])
