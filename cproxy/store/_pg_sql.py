"""The PostgreSQL store's longer statements (and its connection type), kept apart so
``postgres.py`` reads as logic.

Multi-row writes pass one array per column and ``unnest`` them: one statement, one round trip
and one plan (asyncpg prepares and caches it) for any number of rows.
"""

from __future__ import annotations

from typing import TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

#: A pooled connection.
Conn: TypeAlias = "PoolConnectionProxy[asyncpg.Record]"

#: Advisory locks on (tid, id key), taken in the order of the array (callers sort it): a function
#: scan over ``unnest`` yields, and so locks, in array order.
LOCK_IDS = "SELECT pg_advisory_xact_lock($1::int, k) FROM unnest($2::int[]) AS k"

#: Lock the offset counters of the queues an append writes to. ``ORDER BY`` runs below the row
#: locking, so rows are locked in qid order: the fixed order that keeps appenders deadlock-free.
LOCK_QUEUES = (
    "SELECT qid, next_offset, last_produced_at_ms FROM queues"
    " WHERE tid = $1 AND qid = ANY($2::int[]) ORDER BY qid FOR UPDATE"
)

#: Record batches (``_records.Batch`` columns after the tid), one array per column.
INSERT_BATCHES = (
    "INSERT INTO batches (tid, qid, base, next_off, first_ts, last_ts, records)"
    " SELECT $1, u.* FROM unnest($2::int[], $3::bigint[], $4::bigint[], $5::bigint[],"
    " $6::bigint[], $7::bytea[]) AS u"
)

#: The batches holding offsets ``$3 <= off < $4`` of queue ($1, $2), in offset order: from
#: the one holding ``$3`` (the last starting at or below it; ``$3`` itself when none does) up
#: to the last one starting below ``$4``.
READ_BATCHES = (
    "SELECT base, next_off, records FROM batches WHERE tid = $1 AND qid = $2 AND base < $4"
    " AND base >= coalesce((SELECT base FROM batches WHERE tid = $1 AND qid = $2"
    " AND base <= $3 ORDER BY base DESC LIMIT 1), $3) ORDER BY base"
)

#: Reads of one topic, one per (qid ``$2[i]``, start ``$3[i]``, count ``$4[i]``), in one
#: statement (one round trip, one snapshot). Each start is raised to its queue's floor (a
#: batch retention cut through may hold records below it); rows are tagged with ``i``
#: (1-based): the start, then each batch holding offsets ``start <= off < start + count``,
#: or one row with a NULL base when there is none.
READ_MANY_FROM_FLOOR = (
    "SELECT r.i, q.start, b.base, b.next_off, b.records FROM"
    " unnest($2::int[], $3::bigint[], $4::int[]) WITH ORDINALITY AS r(qid, off, n, i)"
    " CROSS JOIN LATERAL (SELECT greatest(r.off, min_offset) AS start FROM queues"
    "  WHERE tid = $1 AND qid = r.qid) AS q"
    " LEFT JOIN LATERAL (SELECT base, next_off, records FROM batches"
    "  WHERE tid = $1 AND qid = r.qid AND base < q.start + r.n"
    "  AND base >= coalesce((SELECT base FROM batches WHERE tid = $1 AND qid = r.qid"
    "  AND base <= q.start ORDER BY base DESC LIMIT 1), q.start)"
    "  ORDER BY base) AS b ON true"
    " ORDER BY r.i, b.base"
)

#: The batch holding offset ``$3`` of queue ($1, $2), if any: the last one starting at or
#: below it (``_records.Head``; the caller checks ``next_off``).
BATCH_AT = (
    "SELECT base, next_off, first_ts, last_ts, records FROM batches"
    " WHERE tid = $1 AND qid = $2 AND base <= $3 ORDER BY base DESC LIMIT 1"
)

UPDATE_QUEUES = (
    "UPDATE queues q SET next_offset = u.n, last_produced_at_ms = u.ts"
    " FROM unnest($2::int[], $3::bigint[], $4::bigint[]) AS u(qid, n, ts)"
    " WHERE q.tid = $1 AND q.qid = u.qid"
)

#: Delete the dedup entries stored from $1 to $2 (expired), about $3 of them at most, the
#: oldest first; returns how many, and the newest time deleted (``PgLog._maybe_prune``). The
#: bound is a time: that of the $3-th entry on, found in the time index, so the DELETE walks
#: that index's range and nothing else (entries of one millisecond go together). The scan
#: starts at $1, where the last one ended: entries deleted before stay in the index as dead
#: tuples until a vacuum, and a scan from the start would walk all of them every time.
PRUNE_DEDUP = (
    "WITH d AS (DELETE FROM dedup WHERE produced_at_ms >= $1 AND produced_at_ms <= LEAST($2,"
    " coalesce((SELECT produced_at_ms FROM dedup WHERE produced_at_ms >= $1"
    " ORDER BY produced_at_ms OFFSET $3 - 1 LIMIT 1), $2)) RETURNING produced_at_ms)"
    " SELECT count(*), max(produced_at_ms) FROM d"
)

INSERT_DEDUP = (
    "INSERT INTO dedup (tid, id, qid, off, produced_at_ms)"
    " SELECT $1, u.* FROM unnest($2::text[], $3::int[], $4::bigint[], $5::bigint[]) AS u"
    " ON CONFLICT (tid, id) DO UPDATE SET qid = excluded.qid, off = excluded.off,"
    " produced_at_ms = excluded.produced_at_ms"
)

UPSERT_PROGRESS = (
    "INSERT INTO progress (grp, tid, qid, committed, finished)"
    " SELECT $1, u.tid, u.qid, u.c, u.f::jsonb"
    " FROM unnest($2::int[], $3::int[], $4::bigint[], $5::text[]) AS u(tid, qid, c, f)"
    " ON CONFLICT (grp, tid, qid) DO UPDATE"
    " SET committed = excluded.committed, finished = excluded.finished"
)

DELETE_DEAD_LETTERS = (
    "DELETE FROM dead_letters d"
    " USING unnest($2::int[], $3::int[], $4::bigint[]) AS u(tid, qid, off)"
    " WHERE d.grp = $1 AND d.tid = u.tid AND d.qid = u.qid AND d.off = u.off"
)

UPSERT_DEAD_LETTERS = (
    "INSERT INTO dead_letters (grp, tid, qid, off, key, id, headers, body, produced_at_ms,"
    " attempts, last_error, dead_lettered_at_ms, redriving)"
    " SELECT $1, u.* FROM unnest($2::int[], $3::int[], $4::bigint[], $5::text[], $6::text[],"
    " $7::bytea[], $8::bytea[], $9::bigint[], $10::int[], $11::text[], $12::bigint[],"
    " $13::bool[]) AS u"
    " ON CONFLICT (grp, tid, qid, off) DO UPDATE SET key = excluded.key, id = excluded.id,"
    " headers = excluded.headers, body = excluded.body, produced_at_ms = excluded.produced_at_ms,"
    " attempts = excluded.attempts, last_error = excluded.last_error,"
    " dead_lettered_at_ms = excluded.dead_lettered_at_ms, redriving = excluded.redriving"
)

#: A dead letter as ``postgres._dead_letter`` reads it: ``d`` is dead_letters, ``t`` topics.
DEAD_LETTER_COLUMNS = (
    "t.name, d.qid, d.off, d.key, d.body, d.headers, d.id, d.produced_at_ms,"
    " d.attempts, d.last_error, d.dead_lettered_at_ms, d.redriving"
)

#: The channel on which appends announce new data (cluster mode): the payload is
#: ``<topic>:<qid>:<next offset>``; topic names cannot contain ``:``.
APPEND_CHANNEL = "cproxy_append"

#: One notification per queue an append wrote to.
NOTIFY_APPEND = f"SELECT pg_notify('{APPEND_CHANNEL}', p) FROM unnest($1::text[]) AS p"
