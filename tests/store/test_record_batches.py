"""Record batches (``cproxy.store._records``): a produce call is one row per queue, and reads,
seeks and retention cuts still answer to the message.

The contract tests run on every store (the memory store keeps one entry per message and must
agree); the migration from the one-row-per-message table and reopening after a cut through a
batch are SQLite's own.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import pytest

from cproxy.model import NewMessage, QueueStats, Record
from cproxy.store import _records
from cproxy.store._sqlite_schema import _V3_TABLES
from cproxy.store.base import Store
from cproxy.store.sqlite import SqliteStore

T0 = 1_700_000_000_000
WINDOW = 60_000


def new(qid: int, n: int, *, key: str | None = None, msg_id: str | None = None) -> NewMessage:
    return NewMessage(key, b'{"n":%d}' % n, b'{"h":%d}' % n if n % 2 else None, msg_id, qid)


# -- the encoding ----------------------------------------------------------------------------


def test_a_record_keeps_every_field_of_a_message() -> None:
    stored = [
        Record("t", 3, 10, "k", b'{"a":[1,2]}', b'{"h":"v"}', "id-1", T0),
        Record("t", 3, 11, None, b'"\\u00e9\\n"', None, None, T0 + 1),
        Record("t", 3, 12, "\u00e9", b"{}", b"{}", "\u00e9", T0 + 2),
    ]
    row = _records.batch(stored)
    assert (row.qid, row.base, row.next_off, row.first_ts, row.last_ts) == (3, 10, 13, T0, T0 + 2)
    rows = [(row.base, row.next_off, row.records)]
    assert _records.decode("t", 3, rows, 0, 100) == stored
    assert _records.decode("t", 3, rows, 11, 12) == stored[1:2]
    assert _records.decode("t", 3, rows, 13, 20) == []
    # Consecutive batches decode as one run; a gap between them splits it.
    more = [Record("t", 3, off, None, b"{}", None, None, T0 + 3) for off in (13, 14, 20)]
    second, third = _records.batch(more[:2]), _records.batch(more[2:])
    rows += [
        (second.base, second.next_off, second.records),
        (third.base, third.next_off, third.records),
    ]
    assert _records.decode("t", 3, rows, 0, 100) == [*stored, *more]
    assert _records.decode("t", 3, rows, 12, 20) == [stored[2], *more[:2]]
    assert _records.decode("t", 3, rows, 14, 21) == more[1:]
    # Every per-message field of ``Record`` is in a record (topic, qid, offset are the row's).
    per_message = [f.name for f in fields(Record)][3:]
    assert list(_records.RECORD_FIELDS) == per_message
    # Bodies are stored as they came, byte for byte, not re-encoded.
    assert b'{"a":[1,2]}' in row.records


# -- every store -----------------------------------------------------------------------------


async def test_reads_slice_batches_to_the_asked_range(store: Store) -> None:
    await store.create_topic("t", 2)
    expected: dict[int, list[bytes]] = {0: [], 1: []}
    for call in range(5):
        batch = [new(i % 2, call * 100 + i) for i in range(13)]
        await store.append("t", batch, T0 + call, 0)
        for m in batch:
            assert m.qid is not None
            expected[m.qid].append(m.body_json)
    for qid, bodies in expected.items():
        for start in range(len(bodies) + 2):
            for count in (1, 2, 5, 7, 50):
                got = await store.read("t", qid, start, count)
                assert [m.offset for m in got] == list(
                    range(start, min(start + count, len(bodies)))
                )
                assert [m.body_json for m in got] == bodies[start : start + count]


async def test_a_byte_cut_through_a_batch_is_exact(store: Store) -> None:
    # One call, ten messages of 12 bytes (10-byte body + 2-byte key): one batch.
    await store.create_topic("t", 1, retention_bytes=50)
    batch = [NewMessage("k0", b'"%08d"' % i, qid=0) for i in range(10)]
    await store.append("t", batch, T0, 0)
    # 50 bytes hold 4 messages: offsets 6..9 stay, though 0..5 share their batch.
    assert await store.apply_retention("t", T0) == {0: 6}
    assert await store.queue_stats("t") == [QueueStats(0, 6, 10)]
    assert [m.offset for m in await store.read("t", 0, 0, 100)] == [6, 7, 8, 9]
    assert [m.offset for m in await store.read("t", 0, 2, 2)] == [6, 7]
    assert await store.offset_for_time("t", 0, T0 - 5) == 6
    # The running total does not count what is below the floor inside the kept batch.
    await store.append("t", [NewMessage("k0", b'"%08d"' % 10, qid=0)], T0, 0)
    assert await store.apply_retention("t", T0) == {0: 7}
    assert [m.offset for m in await store.read("t", 0, 0, 100)] == [7, 8, 9, 10]
    # A cut past the batch's end drops it.
    await store.update_topic("t", None, 12)
    assert await store.apply_retention("t", T0) == {0: 10}
    assert [m.offset for m in await store.read("t", 0, 0, 100)] == [10]


async def test_seek_by_time_finds_the_message_inside_a_batch(store: Store) -> None:
    await store.create_topic("t", 1)
    for call in range(4):
        await store.append("t", [new(0, call * 10 + i) for i in range(10)], T0 + call * 1000, 0)
    assert await store.offset_for_time("t", 0, T0) == 0
    assert await store.offset_for_time("t", 0, T0 + 1) == 10
    assert await store.offset_for_time("t", 0, T0 + 2000) == 20
    assert await store.offset_for_time("t", 0, T0 + 2500) == 30
    assert await store.offset_for_time("t", 0, T0 + 3001) == 40


async def test_dedup_ids_inside_batches(store: Store) -> None:
    await store.create_topic("t", 2)
    first = await store.append(
        "t",
        [new(i % 2, i, msg_id=f"id-{i}" if i % 3 == 0 else None) for i in range(12)],
        T0,
        WINDOW,
    )
    again = await store.append("t", [new(1, 99, msg_id="id-9"), new(1, 100)], T0 + 1, WINDOW)
    assert again[0].duplicate and (again[0].qid, again[0].offset) == (first[9].qid, first[9].offset)
    assert (again[1].qid, again[1].offset, again[1].duplicate) == (1, 6, False)


# -- SQLite: reopening and migrating ---------------------------------------------------------


async def test_a_cut_through_a_batch_survives_a_restart(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path)
    await s.open()
    await s.create_topic("t", 1, retention_bytes=50)
    await s.append("t", [NewMessage("k0", b'"%08d"' % i, qid=0) for i in range(10)], T0, 0)
    assert await s.apply_retention("t", T0) == {0: 6}
    await s.close()
    s = SqliteStore(tmp_path)
    await s.open()
    try:
        assert await s.queue_stats("t") == [QueueStats(0, 6, 10)]
        assert [m.offset for m in await s.read("t", 0, 0, 100)] == [6, 7, 8, 9]
        assert await s.apply_retention("t", T0) == {}
        assert (await s.append("t", [new(0, 1)], T0, 0))[0].offset == 10
    finally:
        await s.close()


#: The one-row-per-message table of SQLite schema versions 1 and 2.
V2_MESSAGES = (
    "CREATE TABLE messages (tid INTEGER NOT NULL, qid INTEGER NOT NULL, off INTEGER NOT NULL,"
    " produced_at_ms INTEGER NOT NULL, key TEXT, id TEXT, headers BLOB, body BLOB NOT NULL,"
    " PRIMARY KEY (tid, qid, off)) WITHOUT ROWID"
)


def rewrite_as(path: Path, version: int, change: Callable[[sqlite3.Connection], None]) -> None:
    """Apply ``change`` to a closed store's file and label it schema ``version``, in one
    transaction: the file as that older version left it."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        change(conn)
        conn.execute("UPDATE meta SET v = ? WHERE k = 'schema_version'", (str(version),))
        conn.execute("COMMIT")
    finally:
        conn.close()


def back_to_version_2(path: Path, stored: list[tuple[int, Record]]) -> None:
    """Rewrite a closed store's file as schema version 2 kept it: ``stored`` (tid, message)
    in the ``messages`` table, no batches."""

    def change(conn: sqlite3.Connection) -> None:
        conn.execute("DROP TABLE batches")
        conn.execute(V2_MESSAGES)
        conn.executemany(
            "INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (tid, m.qid, m.offset, m.produced_at_ms, m.key, m.id, m.headers_json, m.body_json)
                for tid, m in stored
            ],
        )

    rewrite_as(path, 2, change)


async def test_a_version_2_file_is_migrated_keeping_every_message(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path)
    await s.open()
    await s.create_topic("t", 3, retention_ms=10**9)
    await s.create_topic("u", 1)
    sent = [new(i % 3, i, key=f"k{i % 7}", msg_id=f"id-{i}" if i % 2 else None) for i in range(250)]
    for start in range(0, 250, 25):
        await s.append("t", sent[start : start + 25], T0 + start, WINDOW)
    await s.append("u", [new(0, 1)], T0, 0)
    before = {qid: await s.read("t", qid, 0, 1000) for qid in range(3)}
    stats = await s.queue_stats("t")
    tids = {name: s.topics.topic(name)[0] for name in ("t", "u")}
    await s.close()
    stored = [(tids["t"], m) for ms in before.values() for m in ms]
    stored.append((tids["u"], Record("u", 0, 0, None, b'{"n":1}', b'{"h":1}', None, T0)))
    # What version 2 left: one row per message; offsets 0..1 of queue 0 cut by retention.
    kept = [(t, m) for t, m in stored if m.topic == "u" or m.offset > 1 or m.qid]
    back_to_version_2(tmp_path / "cproxy.db", kept)
    conn = sqlite3.connect(tmp_path / "cproxy.db", isolation_level=None)
    conn.execute("INSERT OR REPLACE INTO floors VALUES (?, 0, 2)", (tids["t"],))
    conn.close()

    s = SqliteStore(tmp_path)
    await s.open()
    try:
        conn = sqlite3.connect(tmp_path / "cproxy.db")
        assert conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone() == ("5",)
        assert (
            conn.execute("SELECT name FROM sqlite_master WHERE name = 'messages'").fetchall() == []
        )
        # Contiguous rows of a queue became batches of up to 100 messages.
        assert conn.execute("SELECT count(*) FROM batches").fetchone() == (4,)
        conn.close()
        assert [m for m in await s.read("t", 0, 0, 1000)] == before[0][2:]
        assert {qid: await s.read("t", qid, 0, 1000) for qid in (1, 2)} == {
            qid: before[qid] for qid in (1, 2)
        }
        assert [m.body_json for m in await s.read("u", 0, 0, 10)] == [b'{"n":1}']
        assert await s.queue_stats("t") == [QueueStats(0, 2, stats[0].next_offset), *stats[1:]]
        # Seek by time, dedup and appends carry on over the migrated log.
        assert await s.offset_for_time("t", 0, T0 + 100) == before[0][34].offset
        again = await s.append("t", [sent[1], new(0, 1000)], T0 + 500, WINDOW)
        assert again[0].duplicate and (again[0].qid, again[0].offset) == (1, 0)
        assert again[1].offset == stats[0].next_offset
    finally:
        await s.close()


@pytest.mark.parametrize("rows", [0, 1])
async def test_a_version_2_file_with_no_or_one_message_is_migrated(
    tmp_path: Path, rows: int
) -> None:
    s = SqliteStore(tmp_path)
    await s.open()
    await s.create_topic("t", 1)
    await s.close()
    back_to_version_2(
        tmp_path / "cproxy.db", [(1, Record("t", 0, 0, "k", b"{}", None, None, T0))][:rows]
    )
    s = SqliteStore(tmp_path)
    await s.open()
    try:
        assert [m.key for m in await s.read("t", 0, 0, 10)] == ["k"][:rows]
        assert (await s.append("t", [new(0, 1)], T0, 0))[0].offset == rows
    finally:
        await s.close()


def back_to_version_3(path: Path) -> None:
    """Rewrite a closed store's file as schema version 3 kept it: the same batch rows in the
    WITHOUT ROWID table."""

    def change(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE batches RENAME TO batches_v4")
        conn.execute("DROP INDEX batches_key")
        (v3_batches,) = _V3_TABLES  # the WITHOUT ROWID table schema 3 created
        conn.execute(v3_batches)
        conn.execute("INSERT INTO batches SELECT * FROM batches_v4")
        conn.execute("DROP TABLE batches_v4")

    rewrite_as(path, 3, change)


def batch_table(path: Path) -> tuple[str, int, bool]:
    """The file's schema version, its batch rows, and whether ``batches`` is WITHOUT ROWID."""
    conn = sqlite3.connect(path)
    try:
        (version,) = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
        (rows,) = conn.execute("SELECT count(*) FROM batches").fetchone()
        (table_sql,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'batches'"
        ).fetchone()
        return version, rows, "WITHOUT ROWID" in table_sql
    finally:
        conn.close()


async def test_a_version_3_file_is_migrated_keeping_every_batch(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path)
    await s.open()
    await s.create_topic("t", 2, retention_ms=10**9)
    sent = [new(i % 2, i, key=f"k{i % 5}", msg_id=f"id-{i}" if i % 3 else None) for i in range(90)]
    for start in range(0, 90, 30):
        await s.append("t", sent[start : start + 30], T0 + start, WINDOW)
    before = {qid: await s.read("t", qid, 0, 1000) for qid in range(2)}
    stats = await s.queue_stats("t")
    await s.close()
    back_to_version_3(tmp_path / "cproxy.db")
    assert batch_table(tmp_path / "cproxy.db") == ("3", 6, True)

    s = SqliteStore(tmp_path)
    await s.open()
    try:
        # The same rows, now in a rowid table.
        assert batch_table(tmp_path / "cproxy.db") == ("5", 6, False)
        assert {qid: await s.read("t", qid, 0, 1000) for qid in range(2)} == before
        assert await s.queue_stats("t") == stats
        # Seek by time, dedup and appends carry on over the migrated batches.
        assert await s.offset_for_time("t", 0, T0 + 30) == before[0][15].offset
        again = await s.append("t", [sent[1], new(1, 1000)], T0 + 500, WINDOW)
        assert again[0].duplicate and (again[0].qid, again[0].offset) == (1, 0)
        assert again[1].offset == stats[1].next_offset
    finally:
        await s.close()
