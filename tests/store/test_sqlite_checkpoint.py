"""WAL checkpoints and restarts (``cproxy.store._sqlite_checkpoint``): under steady writes the
WAL is started over once it is long, instead of growing to the writer's fallback threshold
and being copied inside a COMMIT; below the writer's peak, without a checkpoint on its path."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from cproxy.model import NewMessage
from cproxy.store import _sqlite_checkpoint
from cproxy.store.sqlite import SqliteStore

T0 = 1_700_000_000_000
BODY = b'"' + b"x" * 1000 + b'"'


def wal_bytes(store: SqliteStore) -> int:
    wal = store.path.with_name(store.path.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


def checkpointer(store: SqliteStore) -> _sqlite_checkpoint.Checkpointer:
    return store._db._checkpointer


async def test_a_long_wal_starts_over_while_writes_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that never pauses: settling gives up, and the writer is asked to catch up."""
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
        # Bounded well below what was written: it was started over again and again (under
        # CPU contention the checkpoint thread runs late, so the bound leaves room: 8 MB was
        # passed by a few KB with two busy loops beside the test).
        assert longest < 12_000_000, f"the WAL grew to {longest:,} bytes"
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


async def test_writes_with_pauses_have_the_wal_settled_without_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes with pauses between them (a service below its peak): the checkpointer's own
    passes copy the whole WAL, and the writer starts it over without a checkpoint of its own."""
    monkeypatch.setattr(_sqlite_checkpoint, "INTERVAL_S", 0.01)
    monkeypatch.setattr(_sqlite_checkpoint, "RESTART_FRAMES", 64)  # 256 KiB
    s = SqliteStore(tmp_path)
    await s.open()
    appends = written = longest = 0
    try:
        await s.create_topic("t", 1)
        deadline = time.monotonic() + 30
        while written < 4_000_000 or checkpointer(s).settled < 3:
            assert time.monotonic() < deadline, "writes too slow, or the WAL never settled"
            await s.append("t", [NewMessage(None, BODY, qid=0) for _ in range(20)], T0, 0)
            appends += 1
            written += 20 * len(BODY)
            longest = max(longest, wal_bytes(s))
            await anyio.sleep(0.003)
        # Without restarts the WAL would hold all 4 MB.
        assert longest < 1_500_000, f"the WAL grew to {longest:,} bytes"
        stored = await s.read("t", 0, 0, appends * 20 + 1)
        assert [m.offset for m in stored] == list(range(appends * 20))
    finally:
        await s.close()


@dataclass
class WalFile:
    """A database in WAL mode with no checkpoints of its own, and a checkpointer over it."""

    writer: sqlite3.Connection
    reader: sqlite3.Connection  # the checkpointer's connection
    checkpointer: _sqlite_checkpoint.Checkpointer
    asked: list[int]  # a 1 per call of on_long_wal

    def fill(self, rows: int) -> None:
        for _ in range(rows):  # ~3 pages each
            self.writer.execute("INSERT INTO t VALUES (?)", (b"x" * 10_000,))


@pytest.fixture
def wal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WalFile]:
    monkeypatch.setattr(_sqlite_checkpoint, "RESTART_FRAMES", 50)
    path = tmp_path / "db.sqlite"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("PRAGMA journal_mode = WAL")
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("CREATE TABLE t (v BLOB)")
    asked: list[int] = []
    checkpointer = _sqlite_checkpoint.Checkpointer(path, on_long_wal=lambda: asked.append(1))
    reader = sqlite3.connect(path, isolation_level=None)
    try:
        yield WalFile(writer, reader, checkpointer, asked)
    finally:
        reader.close()
        writer.close()


def test_a_long_wal_nobody_writes_to_is_settled_by_the_checkpointer(wal: WalFile) -> None:
    wal.fill(30)  # ~90 pages
    wal.checkpointer._checkpoint(wal.reader)
    assert (wal.checkpointer.settled, wal.checkpointer.asked, wal.asked) == (1, 0, [])
    # The next write starts the WAL over: it holds that write's frames only.
    wal.writer.execute("INSERT INTO t VALUES (?)", (b"x",))
    _, frames, _ = wal.reader.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert 0 < frames < 10


def test_only_a_pass_over_a_long_wal_asks_for_a_restart(
    wal: WalFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal.fill(1)  # a few pages
    wal.checkpointer._checkpoint(wal.reader)
    assert wal.asked == []
    wal.fill(30)  # ~90 pages
    # A writer that commits during every pass: each finds the WAL longer than the one
    # before, and after SETTLE_FRAMES more the writer is asked to catch up.
    monkeypatch.setattr(_sqlite_checkpoint, "SETTLE_S", 60)
    monkeypatch.setattr(_sqlite_checkpoint, "SETTLE_FRAMES", 12)
    passes = wal.checkpointer._pass
    grown = iter(range(1, 1_000_000))

    def pass_during_writes(c: sqlite3.Connection) -> tuple[int, int, int] | None:
        result = passes(c)
        assert result is not None
        more = next(grown)
        return result[0], result[1] + more, result[2] + more

    monkeypatch.setattr(wal.checkpointer, "_pass", pass_during_writes)
    started = time.monotonic()
    wal.checkpointer._checkpoint(wal.reader)
    assert time.monotonic() - started < 30
    # The first pass, then settling passes until the WAL grew by 12 frames.
    assert next(grown) - 1 == 1 + 12
    assert wal.asked == [1]
    assert (wal.checkpointer.settled, wal.checkpointer.asked) == (0, 1)
