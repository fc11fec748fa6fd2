"""The SQLite writer's transactions: a batch of queued writes run in ONE transaction.

``Writer`` (``_sqlite_writer``) queues the writes and hands each batch to ``run_batch``, on a
worker thread or on the event loop's own (see ``Database``).

A batch runs optimistically, without savepoints. If one of its writes fails, the transaction
is rolled back and the batch runs again the careful way, each write in its own SAVEPOINT: the
one failing rolls back to its savepoint and raises to its own caller only; the others still
commit. Every caller is answered only after the shared COMMIT succeeded, so a returned write is
durable; if the COMMIT fails, every write of the batch fails and none of their ``on_commit``
actions runs. The writes inside a batch run in queue order, so later writes see the effects of
earlier ones exactly as if each had committed on its own.

Deferred work (``defer``): a write may leave rows for the transaction to insert later, merged
with those of the writes after it (the SQLite store merges the record batches that several
appends write to one queue into one row). It runs before the next write that is not
``mergeable`` (so that write sees those rows) and before COMMIT; if it fails, the batch runs
again the careful way, where deferred work is done at once, inside its write's savepoint.

WAL restarts: the background checkpointer starts a long WAL over without the writer when it
can (``_sqlite_checkpoint``). When writes kept coming while it tried, it asks the writer
(``request_wal_restart``): the next transaction first checkpoints the frames committed since
that checkpointer's last pass (a few; the passes copied the rest), so it begins on a fully
checkpointed WAL and SQLite writes the WAL from its start again.

Self-healing: a connection left inside a transaction (a ROLLBACK that failed) would make every
later BEGIN fail with "cannot start a transaction within a transaction". Before each BEGIN the
writer rolls such a transaction back, and if even that fails it reopens the connection.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import Any

import anyio

from cproxy.errors import StoreError

logger = logging.getLogger(__name__)


def as_store_error(exc: BaseException) -> BaseException:
    """sqlite3 and OS errors as ``StoreError`` (the one translation point); others unchanged."""
    if isinstance(exc, sqlite3.Error | OSError):
        logger.warning("SQLite store error: %s", exc)
        return _store_error(f"SQLite store failed: {exc}", exc)
    return exc


def _store_error(message: str, cause: BaseException) -> StoreError:
    error = StoreError(message)
    error.__cause__ = cause
    return error


class Job:
    """One queued write: its function, and its outcome once the batch ran."""

    __slots__ = (
        "error",
        "finished",
        "fn",
        "mergeable",
        "on_commit",
        "on_success",
        "taken",
        "value",
        "wake",
        "weight",
    )

    def __init__(
        self, fn: Callable[[sqlite3.Connection], Any], weight: int, mergeable: bool
    ) -> None:
        self.fn = fn
        self.weight = weight
        self.mergeable = mergeable  # may run while deferred work is pending (see ``defer``)
        # Set when the job finished, or when its caller is to lead the next batch.
        self.wake = anyio.Event()
        self.taken = False  # in a batch handed to the worker thread
        self.finished = False  # outcome final: ``value`` or ``error``
        self.value: Any = None
        self.error: BaseException | None = None
        self.on_success: list[Callable[[], None]] = []
        self.on_commit: list[Callable[[], None]] = []

    def reset(self) -> None:
        """Forget the outcome of a run that was rolled back, to run again."""
        self.value, self.error, self.finished = None, None, False
        self.on_success.clear()
        self.on_commit.clear()

    def fail(self, error: BaseException) -> None:
        self.error, self.finished = error, True

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class Transactions:
    """The writer connection and the transactions run on it; see the module docstring."""

    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connect = connect
        self.conn: sqlite3.Connection | None = None
        #: Scratch space of the open transaction: what later writes of the same batch must see
        #: of earlier ones before it is committed (e.g. next offsets). Cleared at every BEGIN.
        self.tx_state: dict[Any, Any] = {}
        #: Deferred work of the open transaction, by key (see ``defer``).
        self._deferred: dict[Any, Callable[[sqlite3.Connection], None]] = {}
        self._merging = True  # the fast way (``_run_transaction``): deferred work waits
        self._current: Job | None = None
        self._reconnect = False
        self._last_failure = "none"
        #: Set from the checkpointer's thread (``request_wal_restart``), read before a BEGIN.
        self._wal_restart_due = False
        #: Transactions run and writes committed or failed in them (for benchmarks and tests).
        self.transactions = 0
        self.writes = 0

    # -- hooks for the running write (worker thread) -------------------------------------------
    def on_success(self, action: Callable[[], None]) -> None:
        """Run ``action`` once the running write succeeded, before the next one of its batch."""
        assert self._current is not None, "on_success outside a write"
        self._current.on_success.append(action)

    def on_commit(self, action: Callable[[], None]) -> None:
        """Run ``action`` after the running write is committed (never if it is rolled back)."""
        assert self._current is not None, "on_commit outside a write"
        self._current.on_commit.append(action)

    def defer(self, key: Any, work: Callable[[sqlite3.Connection], None]) -> None:
        """Run ``work(conn)`` once in this transaction, before its next write that is not
        ``mergeable`` or before COMMIT (one ``work`` per key: a later one replaces it)."""
        assert self._current is not None, "defer outside a write"
        if self._merging:
            self._deferred[key] = work
        else:
            assert self.conn is not None
            work(self.conn)

    def _run_deferred(self, conn: sqlite3.Connection) -> None:
        while self._deferred:
            key = next(iter(self._deferred))
            self._deferred.pop(key)(conn)

    # -- worker thread side --------------------------------------------------------------------
    def run_batch(self, batch: list[Job]) -> None:
        """Run ``batch`` in one transaction; every job is finished (value or error) after."""
        self.transactions += 1
        self.writes += len(batch)
        try:
            self._run_transaction(batch)
        except BaseException as exc:
            # Not an error of one write (those are all caught): the transaction may be left
            # open, and the next batch rolls it back (``_ready_connection``).
            self._last_failure = f"interrupted by {exc!r}"
            raise
        finally:
            self._current = None
            for job in batch:
                if not job.finished:  # only after a BaseException escaped the transaction
                    job.fail(StoreError("the write was interrupted"))

    def request_wal_restart(self) -> None:
        """Have the next transaction start the WAL over (callable from any thread)."""
        self._wal_restart_due = True

    def _catch_up_wal(self, conn: sqlite3.Connection) -> None:
        self._wal_restart_due = False
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:  # the transaction appends to the WAL as before
            logger.debug("SQLite store: checkpoint before a WAL restart failed: %s", exc)

    def _run_transaction(self, batch: list[Job], fast: bool = True) -> None:
        """Run ``batch`` in one transaction. The fast way, its writes run without savepoints
        and their deferred work merged; if any of them fails, the transaction is rolled back
        and the batch runs again the careful way (``_redo``): each write in its own
        savepoint, its deferred work done at once, inside it."""
        try:
            conn = self._ready_connection()
            if self._wal_restart_due:
                self._catch_up_wal(conn)
            self.tx_state.clear()
            self._deferred.clear()
            self._merging = fast
            conn.execute("BEGIN IMMEDIATE")
        except Exception as exc:
            self._fail_all(batch, exc)
            return
        # A write alone in its transaction needs no savepoint (the transaction is its undo);
        # several need one each only the careful way (the fast way undoes by redoing).
        redo = fast and len(batch) > 1
        savepoints = not fast and len(batch) > 1
        done: list[Job] = []
        for job in batch:
            self._current = job
            try:
                if self._deferred and not job.mergeable:
                    self._run_deferred(conn)
                if savepoints:
                    conn.execute("SAVEPOINT w")
                job.value = job.fn(conn)
                if savepoints:
                    conn.execute("RELEASE w")
                for action in job.on_success:
                    action()
            except Exception as exc:
                if redo:
                    self._redo(conn, batch, exc)
                    return
                if savepoints and self._undo_savepoint(conn, exc):
                    job.fail(as_store_error(exc))
                    continue
                # The transaction itself is gone (SQLite rolls all of it back on errors such
                # as SQLITE_FULL or SQLITE_IOERR) or cannot be trusted: the whole batch fails.
                job.fail(as_store_error(exc))
                self._abort(conn, batch, exc)
                return
            done.append(job)
        self._current = None
        try:
            self._run_deferred(conn)
        except Exception as exc:
            if redo:
                self._redo(conn, batch, exc)
            else:
                self._abort(conn, batch, exc)
            return
        try:
            conn.execute("COMMIT")
        except Exception as exc:
            self._abort(conn, batch, exc)
            return
        for job in done:
            try:
                for action in job.on_commit:
                    action()
            except Exception as exc:
                logger.exception("SQLite store: a post-commit action failed")
                job.fail(exc)
            else:
                job.finished = True

    def _redo(self, conn: sqlite3.Connection, batch: list[Job], exc: Exception) -> None:
        """A write of a fast batch failed: roll all of it back, run it again carefully."""
        logger.debug("SQLite store: redoing a batch of %d writes one by one: %s", len(batch), exc)
        self._current = None
        if not self._roll_back(conn, exc):
            self._fail_all(batch, exc)
            return
        for job in batch:
            job.reset()
        self._run_transaction(batch, fast=False)

    def _undo_savepoint(self, conn: sqlite3.Connection, exc: Exception) -> bool:
        """Roll back one write of a batch; False when the whole transaction must go."""
        self._last_failure = f"{type(exc).__name__}: {exc}"
        if not conn.in_transaction:
            return False
        try:
            conn.execute("ROLLBACK TO w")
            conn.execute("RELEASE w")
        except sqlite3.Error:
            logger.exception("SQLite store: rolling back to a savepoint failed")
            return False
        return True

    def _abort(self, conn: sqlite3.Connection, batch: list[Job], exc: Exception) -> None:
        """Roll back the whole batch: every write not failed yet fails because of ``exc``."""
        self._roll_back(conn, exc)
        self._fail_all(batch, exc)

    def _roll_back(self, conn: sqlite3.Connection, exc: Exception) -> bool:
        """Roll back the open transaction after ``exc``; False if even that failed (the
        connection is then left for the next batch to heal, see ``_ready_connection``)."""
        self._last_failure = f"{type(exc).__name__}: {exc}"
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                logger.exception("SQLite store: rollback of a failed transaction failed")
                return False
        return True

    @staticmethod
    def _fail_all(batch: list[Job], exc: Exception) -> None:
        """Fail every write of ``batch`` not failed yet (a fresh error each: one per raise)."""
        pending = [job for job in batch if not job.finished]
        if not pending:
            return
        logger.warning(
            "SQLite store: %d write(s) failed with their transaction: %s", len(pending), exc
        )
        if isinstance(exc, StoreError):
            message = exc.message
        elif isinstance(exc, sqlite3.Error | OSError):
            message = f"SQLite store failed: {exc}"
        else:  # a bug in one write (not an SQLite error) still took the whole batch down
            message = f"SQLite store failed: the transaction was rolled back ({exc!r})"
        for job in pending:
            job.fail(_store_error(message, exc))

    def _ready_connection(self) -> sqlite3.Connection:
        """The writer connection, outside any transaction: healed or reopened if need be."""
        conn = self.conn
        if conn is None:
            raise StoreError("the store is closed")
        if not self._reconnect and conn.in_transaction:
            logger.warning(
                "SQLite writer connection is still inside a transaction before BEGIN (last "
                "failure: %s); rolling it back",
                self._last_failure,
            )
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                logger.warning("SQLite store: that ROLLBACK failed too (%s); reconnecting", exc)
                self._reconnect = True
        if self._reconnect:
            conn = self._reopen(conn)
        return conn

    def _reopen(self, old: sqlite3.Connection) -> sqlite3.Connection:
        # Closing the old connection also drops its transaction and its write lock; a failure
        # here must not keep us from opening the new one.
        try:
            old.close()
        except sqlite3.Error as exc:
            logger.warning("SQLite store: closing the broken writer connection failed: %s", exc)
        conn = self._connect()  # raises until it works; ``_reconnect`` stays set until then
        self.conn, self._reconnect = conn, False
        logger.warning("SQLite store: reopened the writer connection")
        return conn
