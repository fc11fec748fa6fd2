"""WAL checkpoints and restarts (``cproxy.store._sqlite_checkpoint``): under steady writes the
WAL is started over once it is long, instead of growing to the writer's fallback threshold
and being copied inside a COMMIT."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from cproxy.model import NewMessage
from cproxy.store import _sqlite_checkpoint
from cproxy.store.sqlite import SqliteStore

T0 = 1_700_000_000_000
BODY = b'"' + b"x" * 1000 + b'"'


def wal_bytes(store: SqliteStore) -> int:
    wal = store.path.with_name(store.path.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


async def test_a_long_wal_starts_over_while_writes_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sqlite_checkpoint, "INTERVAL_S", 0.01)
    monkeypatch.setattr(_sqlite_checkpoint, "RESTART_FRAMES", 64)  # 256 KiB
    s = SqliteStore(tmp_path)
    await s.open()
    written = longest = 0
    appends = 0
    try:
        await s.create_topic("t", 1)
        deadline = time.monotonic() + 30
        # ~24 MB of records, never a pause: without restarts the WAL would hold all of it
        # (the writer's own fallback is at 64 MiB).
        while written < 24_000_000:
            assert time.monotonic() < deadline, "writes too slow"
            await s.append("t", [NewMessage(None, BODY, qid=0) for _ in range(20)], T0, 0)
            appends += 1
            written += 20 * len(BODY)
            longest = max(longest, wal_bytes(s))
        assert longest < 8_000_000, f"the WAL grew to {longest:,} bytes"
        stored = await s.read("t", 0, 0, appends * 20 + 1)
        assert [m.offset for m in stored] == list(range(appends * 20))
    finally:
        await s.close()
    # Nothing written before or after a restart is lost.
    again = SqliteStore(tmp_path)
    await again.open()
    try:
        assert len(await again.read("t", 0, 0, appends * 20 + 1)) == appends * 20
    finally:
        await again.close()


def test_only_a_pass_over_a_long_wal_asks_for_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sqlite_checkpoint, "RESTART_FRAMES", 50)
    path = tmp_path / "db.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("CREATE TABLE t (v BLOB)")
    asked: list[int] = []
    checkpointer = _sqlite_checkpoint.Checkpointer(path, on_long_wal=lambda: asked.append(1))
    reader = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("INSERT INTO t VALUES (?)", (b"x" * 10_000,))  # a few pages
        checkpointer._checkpoint(reader)
        assert asked == []
        for _ in range(30):  # ~90 pages
            conn.execute("INSERT INTO t VALUES (?)", (b"x" * 10_000,))
        checkpointer._checkpoint(reader)
        assert asked == [1]
    finally:
        reader.close()
        conn.close()
