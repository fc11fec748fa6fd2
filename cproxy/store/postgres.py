"""The PostgreSQL store: one database shared by every proxy of a cluster (asyncpg).

Install with the ``postgres`` extra (``pip install 'cproxy-ordered[postgres]'``).
``PostgresStore(dsn)`` is a full ``Store`` (both the ``MessageLog`` and the ``GroupStateStore``
protocols of ``base.py``) and keeps the same rules as the SQLite and memory stores.

Schema (version 3; ``_pg_schema.py`` has the DDL, a ``cproxy_meta`` row records the version and
``_pg_schema.MIGRATIONS`` holds the migration from each version to the next):

- ``topics (tid, name, queues, retention_ms, retention_bytes)`` and ``queues (tid, qid,
  next_offset, last_produced_at_ms, min_offset)``: one row per queue holds its offset counter,
  the last ``produced_at_ms`` (for clamping) and the lowest offset retention kept.
- ``batches (tid, qid, base, next_off, first_ts, last_ts, records)``, primary key
  ``(tid, qid, base)``: record batches (``_records``), one row per queue and produce call
  holding its messages at offsets ``base .. next_off - 1`` in one MessagePack blob. A read is
  one range scan of that index from the batch holding its first offset, sliced to the range;
  seek by time bisects the offsets, one primary-key lookup per probe.
  Retention deletes whole batches and raises ``queues.min_offset`` to the exact cut; reads
  start there.
- ``dedup (tid, id, qid, off, produced_at_ms)``, primary key ``(tid, id)``: the newest stored
  copy of each id, pruned now and then once older than the largest window seen.
- ``groups (name, config)``, ``progress (grp, tid, qid, committed, finished)`` and
  ``dead_letters (grp, tid, qid, off, <message columns>, attempts, ..., redriving)``.

Append, and why it cannot deadlock: one transaction per call. With dedup on, it first takes a
transaction-level advisory lock per id (``(tid, hash(id))``, in sorted order), so two proxies
appending the same id cannot both miss the other's copy; then it reads the live dedup entries,
then locks the ``queues`` rows it appends to with ``SELECT ... ORDER BY qid FOR UPDATE``, inserts
one batch per queue (one multi-row ``INSERT ... SELECT FROM unnest``), records the ids,
advances the counters and commits. Every appender takes its locks in the same global order
(ids, then qids), so there is no cycle to deadlock on; appends to different queues only share
the id locks.
Offsets come from the locked counter, so they are contiguous, and a reader can never see a gap:
the next append to a queue waits for the previous one's COMMIT.

Durability: sessions run with ``synchronous_commit = on``, so a returned append is in the WAL on
disk (as far as the server's ``fsync`` setting makes it so).

Wake-ups across proxies (cluster mode, after ``join_cluster``): a produce on one proxy must wake
long polls on the others. The append transaction runs ``pg_notify('cproxy_append',
'<topic>:<qid>:<next>')`` per touched queue just before COMMIT, which PostgreSQL delivers
exactly when the messages become visible (and never for a rolled-back append); each proxy
listens on one dedicated connection (``listen``, used by ``cproxy.cluster.node``) and tells
its groups.

Cluster mode (``cluster_base.ClusterStore``, the only part of the store the cluster uses): the
store owns the cluster's tables too (``_pg_cluster``: membership, queue ownership), and
fencing: after ``join_cluster(node_id)``, ``commit`` checks in its transaction that this proxy
owns every queue it writes progress or dead letters for, at the epoch its last claim got
(``_pg_cluster.Fence``).

Foreign errors (asyncpg, OS, timeouts) become ``cproxy.errors.StoreError`` in ``_conn``.

Layout: ``_pg_base`` (settings, pool, topic cache, error translation), ``_pg_log`` (the
``MessageLog`` half), ``_pg_groups`` (the ``GroupStateStore`` half), ``_pg_sql`` (statements),
``_pg_schema`` (DDL and versions), ``_pg_cluster`` (the cluster's tables, the fence and the
LISTEN connection); offsets are planned by ``_append_plan``, shared with SQLite.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from cproxy.errors import ConfigError, QueueNotOwned, StoreError
from cproxy.model import AppendResult, MessageRef, NewMessage, QueueProgress, QueueRef
from cproxy.store import _pg_cluster
from cproxy.store._pg_cluster import Fence, PgListener
from cproxy.store._pg_groups import PgGroupState
from cproxy.store._pg_log import PgLog
from cproxy.store.cluster_base import FinalCommit, Member, OwnerRow, TidQid

__all__ = ["PostgresStore"]


class PostgresStore(PgLog, PgGroupState):
    """The PostgreSQL ``Store``: both halves over one pool (see ``_pg_base.PgBase`` for the
    constructor's settings). Usable between ``open()`` and ``close()``."""

    async def commit_with_outputs(
        self,
        group: str,
        progress: Mapping[QueueRef, QueueProgress],
        outputs: Sequence[tuple[str, Sequence[NewMessage]]],
        now_ms: int,
        dedup_window_ms: int,
        redrive_done: Sequence[MessageRef] = (),
    ) -> list[list[AppendResult]]:
        # Outputs in topic order: every appender then takes its locks in one global order
        # (topic, then ids, then qids; see the module docstring), so none can deadlock.
        order = sorted(range(len(outputs)), key=lambda i: outputs[i][0])
        results: list[list[AppendResult]] = [[] for _ in outputs]
        added = 0
        async with self._conn() as conn:
            async with conn.transaction():
                for i in order:
                    topic, messages = outputs[i]
                    results[i], n = await self.append_within(
                        conn, topic, messages, now_ms, dedup_window_ms
                    )
                    added += n
                # Fenced: a proxy that lost an input queue writes nothing (QueueNotOwned).
                await self.commit_within(conn, group, progress, (), redrive_done)
            if added:
                await self._maybe_prune(conn, added, now_ms, dedup_window_ms)
        return results

    # -- cluster mode (``cluster_base.ClusterStore``) ------------------------------------------
    async def join_cluster(self, node_id: str) -> None:
        if self._fence is not None and self._fence.node_id != node_id:
            raise ConfigError(f"this store joined the cluster as {self._fence.node_id!r} already")
        async with self._conn() as conn:
            await _pg_cluster.ensure_tables(conn)
        if self._fence is None:  # joining again keeps the epochs held
            self._fence = Fence(node_id)
        self._notify_appends = True

    def _joined(self) -> Fence:
        if self._fence is None:
            raise StoreError("the store has not joined a cluster")
        return self._fence

    async def heartbeat(self, advertise_url: str, lease_ms: int) -> datetime:
        node_id = self._joined().node_id
        async with self._conn() as conn:
            at: datetime = await conn.fetchval(
                _pg_cluster.HEARTBEAT, node_id, advertise_url, lease_ms
            )
        return at

    async def live_members(self) -> list[Member]:
        async with self._conn() as conn:
            return await _pg_cluster.live_members(conn)

    async def leave_cluster(self) -> None:
        node_id = self._joined().node_id
        async with self._conn() as conn:
            await conn.execute(_pg_cluster.LEAVE, node_id)

    async def owner_rows(self) -> list[OwnerRow]:
        async with self._conn() as conn:
            return await _pg_cluster.owner_rows(conn)

    async def claim(self, queue: TidQid, lease_ms: int, grace_ms: int) -> int | None:
        fence = self._joined()
        async with self._conn() as conn:
            epoch: int | None = await conn.fetchval(
                _pg_cluster.CLAIM, *queue, fence.node_id, lease_ms, grace_ms
            )
        if epoch is not None:
            fence.epochs[queue] = epoch
        return epoch

    async def renew(self, lease_ms: int, grace_ms: int) -> dict[TidQid, int]:
        node_id = self._joined().node_id
        async with self._conn() as conn:
            rows = await conn.fetch(_pg_cluster.RENEW, node_id, lease_ms, grace_ms)
        return {(tid, qid): epoch for tid, qid, epoch, _ in rows}

    async def release(self, queue: TidQid, epoch: int) -> bool:
        node_id = self._joined().node_id
        async with self._conn() as conn:
            return await conn.fetchval(_pg_cluster.RELEASE, *queue, node_id, epoch) is not None

    async def hand_over(self, queue: TidQid, epoch: int, finals: Sequence[FinalCommit]) -> None:
        fence = self._joined()
        async with self._conn() as conn, conn.transaction():
            for final in finals:
                await self.commit_within(
                    conn, final.group, final.progress, final.dead_letters, final.redrive_done
                )
            if await conn.fetchval(_pg_cluster.FREE, *queue, fence.node_id, epoch) is None:
                raise QueueNotOwned(
                    f"queue {queue} is not owned by {fence.node_id} at epoch {epoch}", []
                )
            await conn.execute(
                _pg_cluster.NOTIFY, _pg_cluster.CHANNEL, f"free:{queue[0]}:{queue[1]}"
            )
        fence.epochs.pop(queue, None)

    def disown(self, queue: TidQid) -> None:
        self._joined().epochs.pop(queue, None)

    async def notify_peers(self, what: str) -> None:
        async with self._conn() as conn:
            await conn.execute(_pg_cluster.NOTIFY, _pg_cluster.CHANNEL, what)

    async def listen(
        self, on_append: Callable[[str, int, int], None], on_peer: Callable[[str], None]
    ) -> PgListener:
        return await PgListener.open(self._dsn, on_append, on_peer)
