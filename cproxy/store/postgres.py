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

Wake-ups across proxies (cluster mode, ``notify_appends``): a produce on one proxy must wake
long polls on the others. The append transaction runs ``pg_notify('cproxy_append',
'<topic>:<qid>:<next>')`` per touched queue just before COMMIT, which PostgreSQL delivers
exactly when the messages become visible (and never for a rolled-back append); each proxy
listens on one dedicated connection (``cproxy.cluster.node``) and tells its groups.

Fencing (cluster mode, ``fence``): ``commit`` checks in its transaction that this proxy owns
every queue it writes progress or dead letters for, at the epoch it holds
(``cproxy.cluster.fencing``).

Foreign errors (asyncpg, OS, timeouts) become ``cproxy.errors.StoreError`` in ``_conn``.

Layout: ``_pg_base`` (settings, pool, topic cache, error translation), ``_pg_log`` (the
``MessageLog`` half), ``_pg_groups`` (the ``GroupStateStore`` half), ``_pg_sql`` (statements),
``_pg_schema`` (DDL and versions); offsets are planned by ``_append_plan``, shared with SQLite.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cproxy.model import AppendResult, MessageRef, NewMessage, QueueProgress, QueueRef
from cproxy.store._pg_groups import PgGroupState
from cproxy.store._pg_log import PgLog

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
