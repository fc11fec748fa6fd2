"""The SQLite store's plumbing: connections, the data-dir lock, threads, transactions.

Kept apart from ``sqlite.py`` so that module reads as store logic only; the tables and their
migrations are in ``_sqlite_schema``.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

from anyio import CapacityLimiter, to_thread

from cproxy.errors import StoreError
from cproxy.model import DeadLetter, Record
from cproxy.store._sqlite_checkpoint import FALLBACK_PAGES, Checkpointer
from cproxy.store._sqlite_schema import ensure_schema
from cproxy.store._sqlite_tx import Transactions, as_store_error
from cproxy.store._sqlite_writer import Writer

if sys.platform != "win32":
    import fcntl

logger = logging.getLogger(__name__)

T = TypeVar("T")

# 4 KiB pages (SQLite's default): every commit writes each page it touched to the WAL in full,
# so with small produce batches the page size sets the bytes per commit. A record batch of up
# to ~4 KB stays in its leaf page (schema 4's rowid table), larger ones continue on overflow
# pages; 16 KiB pages (chosen when a row held one message) made appends 1.2-1.4x slower
# (benchmarks/store_raw.py and the old journal, both at 9a646a6 in git history). New files only.
PAGE_SIZE = 4096
CACHE_KIB = 32 * 1024
MMAP_BYTES = 256 * 1024 * 1024
# Truncate the WAL back to this size after a checkpoint so one burst does not keep it huge.
WAL_SIZE_LIMIT = 64 * 1024 * 1024

SYNCHRONOUS = ("off", "normal", "full", "extra")

DEAD_LETTER_SELECT = """
    SELECT t.name, d.qid, d.off, d.key, d.body, d.headers, d.id, d.produced_at_ms,
           d.attempts, d.last_error, d.dead_lettered_at_ms, d.redriving
    FROM dead_letters d JOIN topics t ON t.tid = d.tid
    WHERE d.grp = ? AND d.redriving = ? AND (? IS NULL OR d.tid = ?)
    ORDER BY t.name, d.qid, d.off"""


def dead_letter(group: str, row: Sequence[Any]) -> DeadLetter:
    """A ``DeadLetter`` from a ``DEAD_LETTER_SELECT`` row."""
    message = Record(*row[:8])
    return DeadLetter(group, message, row[8], row[9], row[10], bool(row[11]))


def dead_letter_row(group: str, tid: int, dl: DeadLetter) -> tuple[Any, ...]:
    """Parameters for ``INSERT INTO dead_letters``, in table column order."""
    m = dl.message
    return (
        group, tid, m.qid, m.offset, m.key, m.id, m.headers_json, m.body_json, m.produced_at_ms,
        dl.attempts, dl.last_error, dl.dead_lettered_at_ms, int(dl.redriving),
    )  # fmt: skip


def connect(
    path: Path, *, synchronous: str, busy_timeout_ms: int, reader: bool
) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit) with our pragmas applied."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        # page_size only takes effect before the first table exists, i.e. on a new file.
        conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        if not reader:
            # Same: before WAL mode writes the first page (``ensure_schema`` converts old files).
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode != "wal":
            raise StoreError(f"{path}: cannot enable WAL journal mode (got {mode!r})")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.execute(f"PRAGMA mmap_size = {MMAP_BYTES}")
        conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
        if reader:
            conn.execute("PRAGMA query_only = ON")
        else:
            # Checkpoints run in the background (``_sqlite_checkpoint``); this is the net.
            conn.execute(f"PRAGMA wal_autocheckpoint = {FALLBACK_PAGES}")
    except BaseException:
        conn.close()
        raise
    return conn


class DirLock:
    """An exclusive ``flock`` on ``cproxy.lock`` in the data dir.

    The store caches next offsets on the assumption that it is the only writer, so a second
    process on the same directory must be refused rather than allowed to corrupt the log.
    The kernel drops the lock when the process dies, so a SIGKILL never leaves it stale.
    """

    def __init__(self, data_dir: Path) -> None:
        self._path = data_dir / "cproxy.lock"
        self._file: IO[bytes] | None = None

    def acquire(self) -> None:
        file = open(self._path, "ab")  # noqa: SIM115 - held open for the store's lifetime
        if sys.platform != "win32":
            try:
                fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                file.close()
                raise StoreError(f"{self._path.parent} is in use by another cproxy store") from None
        self._file = file

    def release(self) -> None:
        if self._file is not None:
            # Closing the descriptor releases the flock.
            self._file.close()
            self._file = None


class Database:
    """The writer (``_sqlite_writer.Writer``) and one reader connection, plus the data-dir lock.

    ``write`` runs a function atomically in a ``BEGIN IMMEDIATE`` transaction, possibly shared
    with other writes queued at the same time (group commit), and returns once it committed.
    Actions registered with ``on_commit`` during it run only once COMMIT succeeded, which is
    how the store keeps its in-memory caches consistent with what is durable. sqlite3 and OS
    errors leave as ``StoreError``.
    """

    def __init__(
        self,
        path: Path,
        *,
        synchronous: str,
        busy_timeout_ms: int,
        group_commit: bool = True,
        threads: bool | None = None,
    ) -> None:
        self.path = path
        # Statements run on the event loop's own thread unless a commit may fsync: with WAL
        # and synchronous=normal a COMMIT is a write() into the WAL (fsyncs happen in the
        # background checkpointer), so a transaction of a produce batch takes less loop time
        # than the hop to a worker thread and back costs (the hop and the GIL hand-over were
        # ~19 % of the server's busy time). "full" fsyncs every commit: that waits in a thread.
        self.threads = synchronous in ("full", "extra") if threads is None else threads
        self._connect = functools.partial(
            connect, path, synchronous=synchronous, busy_timeout_ms=busy_timeout_ms
        )
        self._lock = DirLock(path.parent)
        #: The writer connection and its transactions.
        self._tx = Transactions(functools.partial(self._connect, reader=False))
        #: The queue of writes in front of it (group commit).
        self._writer = Writer(self._tx.run_batch, group_commit=group_commit, threads=self.threads)
        self._reader: sqlite3.Connection | None = None
        self._read_limiter: CapacityLimiter | None = None
        self._checkpointer = Checkpointer(path, on_long_wal=self._tx.request_wal_restart)

    @property
    def is_open(self) -> bool:
        return self._tx.conn is not None

    @property
    def tx_state(self) -> dict[Any, Any]:
        """Scratch space of the open write transaction (see ``Writer.tx_state``)."""
        return self._tx.tx_state

    async def open(self, load: Callable[[sqlite3.Connection], None]) -> None:
        """Open both connections, create or check the schema, then call ``load(writer)``."""
        # Limiters are made here, inside the event loop that will use them.
        self._writer.limiter = CapacityLimiter(1)
        self._read_limiter = CapacityLimiter(1)
        await to_thread.run_sync(
            _translated, functools.partial(self._open_sync, load), limiter=self._writer.limiter
        )

    def _open_sync(self, load: Callable[[sqlite3.Connection], None]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        writer = reader = None
        try:
            writer = self._connect(reader=False)
            ensure_schema(writer, self.path)
            reader = self._connect(reader=True)
            load(writer)
        except BaseException:
            for conn in (reader, writer):
                if conn is not None:
                    conn.close()
            self._lock.release()
            raise
        self._tx.conn, self._reader = writer, reader
        self._checkpointer.start()

    async def close(self) -> None:
        write_limiter = self._writer.limiter
        if write_limiter is None or self._read_limiter is None:
            return
        # Through the limiters, so calls in progress finish before their connection goes away.
        # The reader goes first: the last connection to close checkpoints and removes the WAL.
        try:
            await to_thread.run_sync(self._checkpointer.stop)
            await to_thread.run_sync(self._close_sync, self, "_reader", limiter=self._read_limiter)
            await to_thread.run_sync(self._close_sync, self._tx, "conn", limiter=write_limiter)
        finally:
            self._lock.release()

    @staticmethod
    def _close_sync(owner: object, attr: str) -> None:
        conn: sqlite3.Connection | None = getattr(owner, attr)
        setattr(owner, attr, None)
        if conn is not None:
            _translated(conn.close)

    async def ping(self) -> bool:
        """True when the database takes a write (``/readyz``); see ``_probe_sync``."""
        if self._read_limiter is None:
            return False
        return await to_thread.run_sync(self._probe_sync, limiter=self._read_limiter)

    def _probe_sync(self) -> bool:
        """Upsert one ``meta`` row in a write transaction on a fresh connection.

        A read alone passes on a read-only database or a full disk, where every append fails.
        The probe gets its own connection that never waits for locks, so it neither queues
        behind the writer nor hangs on a lock: if the write lock is taken (our writer is busy,
        or another process holds it) that is contention, not failure, and a read decides.
        """
        reader = self._reader
        if reader is None:
            return False
        conn = None
        try:
            # mode=rw: never create a file that is gone; timeout=0: fail at once when busy.
            conn = sqlite3.connect(f"{self.path.as_uri()}?mode=rw", uri=True, timeout=0)
            conn.isolation_level = None
            conn.execute("PRAGMA synchronous = NORMAL")
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                    raise
                reader.execute("SELECT 1").fetchone()
                return True
            # A changing value, so a page really is written (and the WAL appended to).
            conn.execute(
                "INSERT OR REPLACE INTO meta (k, v) VALUES ('ready_probe', ?)",
                (str(time.time_ns()),),
            )
            conn.execute("COMMIT")
        except (sqlite3.Error, OSError) as exc:
            logger.warning("SQLite store: readiness write probe failed: %s", exc)
            return False
        finally:
            if conn is not None:
                conn.close()
        return True

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on the reader connection (each statement sees the latest commit)."""
        if self._read_limiter is None:
            raise StoreError("the store is not open")
        if not self.threads:
            return self._read_sync(fn)
        return await to_thread.run_sync(self._read_sync, fn, limiter=self._read_limiter)

    def _read_sync(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._reader
        if conn is None:
            raise StoreError("the store is closed")
        return _translated(functools.partial(fn, conn))

    async def write(
        self, fn: Callable[[sqlite3.Connection], T], *, weight: int = 1, mergeable: bool = False
    ) -> T:
        """Run ``fn`` atomically in a write transaction; return once that committed.

        ``weight`` (messages, for an append) bounds how much one group transaction takes on;
        ``mergeable``: ``fn`` may run while deferred work (``defer``) is pending, because it
        neither reads nor changes what that work writes.
        """
        return await self._writer.write(fn, weight, mergeable)

    def on_success(self, action: Callable[[], None]) -> None:
        """Run ``action`` once the running write succeeded, before the next write of its
        transaction runs (to stage what that one must see); never if it fails."""
        self._tx.on_success(action)

    def on_commit(self, action: Callable[[], None]) -> None:
        """Run ``action`` after the running write commits (never on rollback)."""
        self._tx.on_commit(action)

    def defer(self, key: Any, work: Callable[[sqlite3.Connection], None]) -> None:
        """Run ``work(conn)`` later in this transaction: before its next write that is not
        ``mergeable``, or before COMMIT; one ``work`` per key. If it fails, so does every
        write of the transaction."""
        self._tx.defer(key, work)


def _translated(fn: Callable[[], T]) -> T:
    """Call ``fn``, turning sqlite3 and OS errors into ``StoreError``."""
    try:
        return fn()
    except (sqlite3.Error, OSError) as exc:
        raise as_store_error(exc) from exc
