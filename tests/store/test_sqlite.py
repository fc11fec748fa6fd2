"""What only the SQLite store has: a file that outlives the process, WAL, schema versions."""

from __future__ import annotations

import logging
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from cproxy.errors import ConfigError, StoreError
from cproxy.model import AppendResult, DeadLetter, NewMessage, QueueProgress
from cproxy.store import _sqlite_append, _sqlite_tx
from cproxy.store.sqlite import SqliteStore
from tests.store.sqlite_faults import LOCKING_WRITE, on_body_written, refuse_rows_with

T0 = 1_700_000_000_000
WINDOW = 60_000


@pytest.fixture(params=[True, False], ids=["group-commit", "one-tx-per-write"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path, group_commit=request.param)
    await s.open()
    yield s
    await s.close()


def raw(path: Path) -> sqlite3.Connection:
    """A connection of our own next to the store's, as another process would have."""
    return sqlite3.connect(path, isolation_level=None)


async def test_everything_survives_close_and_reopen(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "nested" / "dir")
    await s.open()
    await s.create_topic("t", 2)
    await s.append("t", [NewMessage("k", b"1", b'{"h":"1"}', "id-1", qid=1)], T0 + 500, WINDOW)
    message = (await s.read("t", 1, 0, 1))[0]
    await s.save_group("g", b'{"v":1}')
    await s.commit(
        "g", {("t", 1): QueueProgress(1, ((3, 4),))}, [DeadLetter("g", message, 2, "x", T0)]
    )
    await s.close()

    s = SqliteStore(tmp_path / "nested" / "dir")
    await s.open()
    try:
        assert [(t.name, t.queues) for t in await s.list_topics()] == [("t", 2)]
        assert await s.read("t", 1, 0, 10) == [message]
        assert await s.load_groups() == {"g": b'{"v":1}'}
        assert await s.load_progress("g") == {("t", 1): QueueProgress(1, ((3, 4),))}
        assert [d.message for d in await s.list_dead_letters("g", None, 10)] == [message]
        # Offsets, produced_at clamping and dedup pick up where they were.
        results = await s.append(
            "t",
            [NewMessage(None, b"2", qid=1), NewMessage(None, b"3", id="id-1", qid=0)],
            T0,
            WINDOW,
        )
        assert results == [AppendResult(1, 1), AppendResult(1, 0, duplicate=True)]
        assert [m.produced_at_ms for m in await s.read("t", 1, 0, 10)] == [T0 + 500, T0 + 500]
    finally:
        await s.close()


_CHILD = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from pathlib import Path
    from cproxy.model import NewMessage, QueueProgress
    from cproxy.store.sqlite import SqliteStore

    async def main() -> None:
        store = SqliteStore(Path(sys.argv[1]))
        await store.open()
        await store.create_topic("t", 2)
        for i in range(50):
            batch = [NewMessage(None, b"%d" % (i * 4 + j), None, f"id-{i * 4 + j}", qid=j % 2)
                     for j in range(4)]
            await store.append("t", batch, 1_700_000_000_000 + i, 60_000)
        await store.commit("g", {("t", 0): QueueProgress(17)})
        print("appended", flush=True)
        # Every append has returned (a 200 was sent); now die without closing anything.
        os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(main())
    """
)


def test_committed_appends_survive_sigkill(tmp_path: Path) -> None:
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert child.stdout == "appended\n"
    # The data is only in the WAL: a clean close would have checkpointed and removed it.
    assert (tmp_path / "cproxy.db-wal").stat().st_size > 0

    async def check() -> None:
        s = SqliteStore(tmp_path)
        await s.open()  # the dead child's lock is gone with it
        try:
            bodies = [m.body_json for q in (0, 1) for m in await s.read("t", q, 0, 1000)]
            assert sorted(int(b) for b in bodies) == list(range(200))
            assert [x.next_offset for x in await s.queue_stats("t")] == [100, 100]
            assert await s.load_progress("g") == {("t", 0): QueueProgress(17)}
            again = await s.append(
                "t",
                [NewMessage(None, b"x", id="id-199", qid=1), NewMessage(None, b"y", qid=1)],
                T0,
                WINDOW,
            )
            assert again == [AppendResult(1, 99, duplicate=True), AppendResult(1, 100)]
        finally:
            await s.close()

    anyio.run(check)


async def test_wal_mode_and_file_layout(store: SqliteStore, tmp_path: Path) -> None:
    assert store.path == tmp_path / "cproxy.db"
    conn = raw(store.path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        version = conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
        assert version == ("5",)
    finally:
        conn.close()


async def test_reads_are_not_blocked_by_an_open_write_transaction(store: SqliteStore) -> None:
    await store.create_topic("t", 1)
    await store.append("t", [NewMessage(None, b"committed", qid=0)], T0, 0)
    other = raw(store.path)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute(LOCKING_WRITE)
        with anyio.fail_after(2):
            assert [m.body_json for m in await store.read("t", 0, 0, 10)] == [b"committed"]
            assert await store.ping()
    finally:
        other.execute("ROLLBACK")
        other.close()


async def test_reads_run_concurrently_with_appends(store: SqliteStore) -> None:
    await store.create_topic("t", 1)
    total, seen = 3000, list[int]()

    async def produce() -> None:
        for i in range(0, total, 30):
            await store.append(
                "t", [NewMessage(None, b"%d" % n, qid=0) for n in range(i, i + 30)], T0, 0
            )

    async def consume() -> None:
        with anyio.fail_after(30):
            while len(seen) < total:
                batch = await store.read("t", 0, len(seen), 100)
                # Every read sees a committed, gap-free prefix of the log.
                assert [m.offset for m in batch] == list(range(len(seen), len(seen) + len(batch)))
                seen.extend(int(m.body_json) for m in batch)
                # Not a bare checkpoint: an event loop that never sleeps drops the GIL only
                # briefly (in select) and takes it straight back, and the writer thread, which
                # needs it again after every row it inserts, can lose that race for seconds.
                await anyio.sleep(0 if batch else 0.0005)

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        tg.start_soon(produce)
    assert seen == list(range(total))


async def test_failed_transaction_stores_nothing_and_keeps_caches(store: SqliteStore) -> None:
    await store.create_topic("t", 2)
    await store.append("t", [NewMessage(None, b"0", qid=0)], T0, WINDOW)
    # Make SQLite itself fail mid-batch, after earlier rows of the call were inserted.
    refuse_rows_with(store.path)
    batch = [
        NewMessage(None, b"1", id="a", qid=0),
        NewMessage(None, b"2", qid=1),
        NewMessage(None, b"!", qid=0),
    ]
    with pytest.raises(StoreError, match="injected failure") as caught:
        await store.append("t", batch, T0 + 1000, WINDOW)
    assert isinstance(caught.value.__cause__, sqlite3.Error)
    assert [s.next_offset for s in await store.queue_stats("t")] == [1, 0]
    assert [m.body_json for m in await store.read("t", 0, 0, 10)] == [b"0"]
    results = await store.append(
        "t", [NewMessage(None, b"3", id="a", qid=0), NewMessage(None, b"4", qid=1)], T0, WINDOW
    )
    assert results == [AppendResult(0, 1), AppendResult(1, 0)]
    # produced_at was not advanced by the failed call either.
    assert [m.produced_at_ms for m in await store.read("t", 0, 0, 10)] == [T0, T0]


async def test_failed_commit_with_outputs_writes_neither(store: SqliteStore) -> None:
    await store.create_topic("in", 1)
    await store.create_topic("out", 1)
    await store.commit("g", {("in", 0): QueueProgress(1)})
    refuse_rows_with(store.path)
    with pytest.raises(StoreError, match="injected failure"):
        await store.commit_with_outputs(
            "g",
            {("in", 0): QueueProgress(2)},
            [("out", [NewMessage(None, b"1", id="a", qid=0), NewMessage(None, b"!", qid=0)])],
            T0,
            WINDOW,
        )
    assert await store.load_progress("g") == {("in", 0): QueueProgress(1)}
    assert [s.next_offset for s in await store.queue_stats("out")] == [0]
    results = await store.commit_with_outputs(
        "g", {}, [("out", [NewMessage(None, b"2", id="a", qid=0)])], T0, WINDOW
    )
    assert results == [[AppendResult(0, 0)]]


async def test_failed_commit_keeps_caches(store: SqliteStore) -> None:
    await store.create_topic("t", 1)
    await store.append("t", [NewMessage(None, b"0", qid=0)], T0, 0)
    conn = raw(store.path)
    try:
        # A deferred foreign key is checked at COMMIT: the statements all succeed and then the
        # COMMIT fails, the case where publishing caches early would go unnoticed.
        conn.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        conn.execute(
            "CREATE TABLE child (pid INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)"
        )
        conn.execute(on_body_written("late_boom", "AFTER", b"!", "INSERT INTO child VALUES (42)"))
    finally:
        conn.close()
    writer = store._db._tx.conn  # white box: enforcement is a per-connection setting
    assert writer is not None
    writer.execute("PRAGMA foreign_keys = ON")

    with pytest.raises(StoreError, match="FOREIGN KEY"):
        await store.append("t", [NewMessage(None, b"!", qid=0)], T0 + 1000, 0)
    assert [s.next_offset for s in await store.queue_stats("t")] == [1]
    assert await store.offset_for_time("t", 0, T0 + 1) == 1
    assert await store.append("t", [NewMessage(None, b"1", qid=0)], T0, 0) == [AppendResult(0, 1)]
    assert [m.produced_at_ms for m in await store.read("t", 0, 0, 10)] == [T0, T0]


def _dedup_ids(path: Path) -> list[str]:
    conn = raw(path)
    try:
        return [row[0] for row in conn.execute("SELECT id FROM dedup ORDER BY tid, id")]
    finally:
        conn.close()


async def test_expired_dedup_entries_are_swept_a_stretch_per_insert(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sqlite_append, "SWEEP_PER_ENTRY", 3)
    await store.create_topic("t", 1)

    async def append(msg_id: str, now_ms: int) -> AppendResult:
        message = NewMessage(None, b"{}", id=msg_id, qid=0)
        return (await store.append("t", [message], now_ms, WINDOW))[0]

    for i in range(8):
        await append(f"old-{i}", T0 + i)  # each insert sweeps 3 entries: none has expired
    assert len(_dedup_ids(store.path)) == 8
    # From here on the old entries have expired. Each insert sweeps the next 3 entries in key
    # order, wherever the last sweep stopped: expired ones go, live ones stay.
    later = T0 + WINDOW + 10
    await append("new-0", later)
    assert len(_dedup_ids(store.path)) >= 1 + 8 - 3
    for i in range(1, 6):  # 6 sweeps of 3 cover every entry at least once
        await append(f"new-{i}", later)
    assert _dedup_ids(store.path) == [f"new-{i}" for i in range(6)]
    assert (await append("new-1", later + 1)).duplicate
    assert not (await append("old-7", later + 1)).duplicate  # expired: stored again


async def test_a_backlog_of_expired_entries_is_swept_faster(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sqlite_append, "SWEEP_PER_ENTRY", 2)
    monkeypatch.setattr(_sqlite_append, "SWEEP_BACKLOG_MAX", 32)
    await store.create_topic("t", 1)
    burst = [NewMessage(None, b"{}", id=f"a-old-{i:02}", qid=0) for i in range(60)]
    await store.append("t", burst, T0, WINDOW)
    # Then single ids (sorting after the burst's), once the burst has expired: at 2 entries
    # per insert the sweep would need 30 inserts; looking twice as far while most of what it
    # finds has expired, 8 do (the first reaches the end, then 2 + 4 + ... + 32 + 32).
    later = T0 + WINDOW + 10
    for i in range(8):
        await store.append("t", [NewMessage(None, b"{}", id=f"z-new-{i}", qid=0)], later, WINDOW)
    assert _dedup_ids(store.path) == [f"z-new-{i}" for i in range(8)]


async def test_version_4_file_loses_the_dedup_time_index(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path)
    await s.open()
    await s.create_topic("t", 1)
    await s.append("t", [NewMessage(None, b"1", id="a", qid=0)], T0, WINDOW)
    await s.close()
    conn = raw(tmp_path / "cproxy.db")  # as schema version 4 left it
    conn.execute("CREATE INDEX dedup_by_time ON dedup (produced_at_ms)")
    conn.execute("UPDATE meta SET v = '4' WHERE k = 'schema_version'")
    conn.close()
    s = SqliteStore(tmp_path)
    await s.open()
    try:
        again = await s.append("t", [NewMessage(None, b"1", id="a", qid=0)], T0 + 1, WINDOW)
        assert again == [AppendResult(0, 0, duplicate=True)]
    finally:
        await s.close()
    conn = raw(tmp_path / "cproxy.db")
    try:
        assert conn.execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone() == ("5",)
        indexes = conn.execute("SELECT name FROM sqlite_master WHERE tbl_name = 'dedup'").fetchall()
        assert ("dedup_by_time",) not in indexes
    finally:
        conn.close()


async def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path)
    await s.open()
    await s.close()
    conn = raw(tmp_path / "cproxy.db")
    conn.execute("UPDATE meta SET v = '99' WHERE k = 'schema_version'")
    conn.close()
    with pytest.raises(StoreError, match="schema version 99, newer"):
        await SqliteStore(tmp_path).open()
    # The failed open released the data dir: fixing the file makes it usable again.
    conn = raw(tmp_path / "cproxy.db")
    conn.execute("UPDATE meta SET v = '5' WHERE k = 'schema_version'")
    conn.close()
    s = SqliteStore(tmp_path)
    await s.open()
    await s.close()


async def test_second_store_on_same_dir_is_refused(store: SqliteStore, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="in use"):
        await SqliteStore(tmp_path).open()
    await store.create_topic("t", 1)  # the first one is unaffected


async def test_reopen_after_close_in_same_process(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path)
    await s.open()
    await s.create_topic("t", 1)
    await s.close()
    await s.open()
    try:
        assert [t.name for t in await s.list_topics()] == ["t"]
    finally:
        await s.close()


async def test_unusable_data_dir_raises_store_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StoreError):
        await SqliteStore(tmp_path / "file").open()


def test_invalid_synchronous_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        SqliteStore(tmp_path, synchronous="sometimes")


async def test_synchronous_full_is_applied(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path, synchronous="full")
    await s.open()
    try:
        # The setting is per connection, so ask the store's own writer.
        level = await s._db.write(lambda conn: conn.execute("PRAGMA synchronous").fetchone())
        assert level == (2,)  # FULL
    finally:
        await s.close()


# -- self-healing writer -----------------------------------------------------------------------


async def test_a_writer_left_inside_a_transaction_heals(
    store: SqliteStore, caplog: pytest.LogCaptureFixture
) -> None:
    await store.create_topic("t", 1)
    await store.append("t", [NewMessage(None, b"1", qid=0)], T0, 0)
    conn = store._db._tx.conn
    assert conn is not None
    # What a ROLLBACK that failed after a failed write leaves behind: it used to make every
    # later BEGIN fail with "cannot start a transaction within a transaction".
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(LOCKING_WRITE)
    with caplog.at_level(logging.WARNING, logger=_sqlite_tx.__name__):
        assert await store.append("t", [NewMessage(None, b"2", qid=0)], T0, 0) == [
            AppendResult(0, 1)
        ]
    assert "still inside a transaction" in caplog.text
    assert store._db._tx.conn is conn  # the ROLLBACK worked: same connection
    assert [m.body_json for m in await store.read("t", 0, 0, 10)] == [b"1", b"2"]


class _StuckConnection:
    """A writer connection inside a transaction that cannot be rolled back."""

    def __init__(self, real: sqlite3.Connection) -> None:
        self.real = real
        self.in_transaction = True

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "ROLLBACK":
            raise sqlite3.OperationalError("injected: cannot rollback")
        return self.real.execute(sql, *args)

    def close(self) -> None:
        self.real.close()


async def test_a_writer_that_cannot_roll_back_is_reopened(
    store: SqliteStore, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.create_topic("t", 1)
    writer = store._db._tx
    assert writer.conn is not None
    stuck = _StuckConnection(writer.conn)
    writer.conn = stuck  # type: ignore[assignment]
    connect, attempts = writer._connect, []

    def flaky_connect() -> sqlite3.Connection:
        attempts.append(1)
        if len(attempts) == 1:
            raise sqlite3.OperationalError("injected: cannot open")
        return connect()

    monkeypatch.setattr(writer, "_connect", flaky_connect)
    with caplog.at_level(logging.WARNING, logger=_sqlite_tx.__name__):
        # The first reopen fails: that write fails, and the next one tries again.
        with pytest.raises(StoreError, match="cannot open"):
            await store.append("t", [NewMessage(None, b"1", qid=0)], T0, 0)
        assert await store.append("t", [NewMessage(None, b"2", qid=0)], T0, 0) == [
            AppendResult(0, 0)
        ]
    assert "reconnecting" in caplog.text and "reopened" in caplog.text
    assert writer.conn is not stuck and isinstance(writer.conn, sqlite3.Connection)
    assert [m.body_json for m in await store.read("t", 0, 0, 10)] == [b"2"]


async def test_the_wal_is_checkpointed_in_the_background_not_by_a_commit(tmp_path: Path) -> None:
    """Appends leave the WAL to the background checkpointer: the database file takes the
    pages over while the store stays open, and the writer's own threshold is far away."""
    s = SqliteStore(tmp_path)
    await s.open()
    try:
        await s.create_topic("t", 1)
        body = b'"' + b"x" * 1000 + b'"'
        for _ in range(20):  # ~2 MB: far below the writer's fallback threshold (64 MiB)
            await s.append("t", [NewMessage(None, body, qid=0) for _ in range(100)], T0, 0)
        with anyio.fail_after(10):
            while s.path.stat().st_size < 2_000_000:  # pages copied back from the WAL
                await anyio.sleep(0.05)
    finally:
        await s.close()
