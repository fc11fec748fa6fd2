"""The SQLite store's writer: one connection, a queue of writes, and group commit.

Transactions run either on the event loop's thread (``threads=False``: no hop, the loop waits
for SQLite) or on a worker thread (``threads=True``: a hop costs ~100 µs of event-loop time,
but the loop serves meanwhile); ``Database`` picks. Either way a write that is its own
transaction costs a COMMIT, so writes that queue up while the writer is busy (or, on the loop,
within the turn the leader waits) are folded together: the next batch runs all of them (up to
``MAX_BATCH_WEIGHT`` messages) in ONE transaction, each in its own SAVEPOINT. One write failing
rolls back to its savepoint and raises to its own caller only; the others still commit. Every
caller is answered only after the shared COMMIT succeeded, so a returned write is durable; if
the COMMIT fails, every write of the batch fails and none of their ``on_commit`` actions runs.

Batches run in queue order (FIFO) and the writes inside a batch too, so later writes see the
effects of earlier ones exactly as if each had committed on its own.

There is no background task (a store has no task group to own one): the caller whose write is
at the head of the queue leads. It runs one batch, then hands the lead to
the caller now at the head, which finds more writes queued behind it. Everyone else just waits.

Self-healing: a connection left inside a transaction (a ROLLBACK that failed) would make every
later BEGIN fail with "cannot start a transaction within a transaction". Before each BEGIN the
writer rolls such a transaction back, and if even that fails it reopens the connection.
"""

from __future__ import annotations

import logging
import sqlite3
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar, cast

import anyio
from anyio import CapacityLimiter, to_thread

from cproxy.errors import StoreError

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Most messages one batch transaction takes on (a single larger write still runs, alone): it
#: bounds how long the writer holds the transaction and how long the last caller waits.
MAX_BATCH_WEIGHT = 5000


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


class _Job:
    """One queued write: its function, and its outcome once the batch ran."""

    __slots__ = (
        "error",
        "finished",
        "fn",
        "on_commit",
        "on_success",
        "taken",
        "value",
        "wake",
        "weight",
    )

    def __init__(self, fn: Callable[[sqlite3.Connection], Any], weight: int) -> None:
        self.fn = fn
        self.weight = weight
        # Set when the job finished, or when its caller is to lead the next batch.
        self.wake = anyio.Event()
        self.taken = False  # in a batch handed to the worker thread
        self.finished = False  # outcome final: ``value`` or ``error``
        self.value: Any = None
        self.error: BaseException | None = None
        self.on_success: list[Callable[[], None]] = []
        self.on_commit: list[Callable[[], None]] = []

    def fail(self, error: BaseException) -> None:
        self.error, self.finished = error, True

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class Writer:
    """The writer connection and its write queue; see the module docstring."""

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        *,
        group_commit: bool = True,
        threads: bool = True,
    ) -> None:
        self._connect = connect
        self._group_commit = group_commit
        #: Transactions on a worker thread; False: on the event loop's thread (see ``Database``).
        self.threads = threads
        self.conn: sqlite3.Connection | None = None
        self.limiter: CapacityLimiter | None = None
        #: Scratch space of the open transaction: what later writes of the same batch must see
        #: of earlier ones before it is committed (e.g. next offsets). Cleared at every BEGIN.
        self.tx_state: dict[Any, Any] = {}
        self._queue: deque[_Job] = deque()
        self._leading = False  # a caller leads (or has been handed the lead); empty queue if not
        self._current: _Job | None = None
        self._reconnect = False
        self._last_failure = "none"
        #: Transactions run and writes committed or failed in them (for benchmarks and tests).
        self.transactions = 0
        self.writes = 0

    # -- event loop side -----------------------------------------------------------------------
    async def write(self, fn: Callable[[sqlite3.Connection], T], weight: int = 1) -> T:
        """Run ``fn`` atomically in a write transaction; return once that committed."""
        if self.limiter is None:
            raise StoreError("the store is not open")
        job = _Job(fn, weight)
        if not self._group_commit:
            await self._run([job])
            return cast(T, job.outcome())
        self._queue.append(job)
        if self._leading:
            await self._wait_turn(job)
        else:
            self._leading = True
        if not job.finished:
            await self._lead(job)
        return cast(T, job.outcome())

    async def _wait_turn(self, job: _Job) -> None:
        try:
            await job.wake.wait()
        except BaseException:  # cancelled
            if job.taken:
                # The batch is running on the worker thread and will commit or fail as one;
                # as with a plain thread hop, the cancellation waits for that to finish.
                with anyio.CancelScope(shield=True):
                    await job.wake.wait()
            if not job.finished:
                # Never ran (perhaps put back after a leader's hop was cancelled), never will.
                self._queue.remove(job)
                if job.wake.is_set():
                    self._hand_off()  # the lead had just been handed to this caller
            raise

    async def _lead(self, job: _Job) -> None:
        try:
            if len(self._queue) == 1:
                # Alone so far: let the tasks that are ready to run (typically the callers
                # just answered by the last batch) queue their next writes first. One loop
                # iteration costs far less than the thread hop and COMMIT each would need.
                await anyio.lowlevel.checkpoint()
            while not job.finished:
                await self._run_next_batch()
        except BaseException:
            if not job.finished:
                self._queue.remove(job)  # cancelled before its batch reached the thread
            raise
        finally:
            self._hand_off()

    async def _run_next_batch(self) -> None:
        batch = [self._queue.popleft()]
        weight = batch[0].weight
        while self._queue and weight + self._queue[0].weight <= MAX_BATCH_WEIGHT:
            weight += self._queue[0].weight
            batch.append(self._queue.popleft())
        for job in batch:
            job.taken = True
        try:
            await self._run(batch)
        finally:
            # No await from here on: the outcomes are handed out even to a cancelled leader.
            unrun = [job for job in batch if not job.finished]
            for job in reversed(unrun):
                # Cancelled before the thread started (the hop's checkpoint): back to the head.
                job.taken = False
                self._queue.appendleft(job)
            for job in batch:
                if job.finished:
                    job.wake.set()

    async def _run(self, batch: list[_Job]) -> None:
        if not self.threads:
            self._run_batch(batch)  # no await: nothing can cancel it half-way
            return
        assert self.limiter is not None
        await to_thread.run_sync(self._run_batch, batch, limiter=self.limiter)

    def _hand_off(self) -> None:
        if self._queue:
            self._queue[0].wake.set()
        else:
            self._leading = False

    # -- hooks for the running write (worker thread) -------------------------------------------
    def on_success(self, action: Callable[[], None]) -> None:
        """Run ``action`` once the running write succeeded, before the next one of its batch."""
        assert self._current is not None, "on_success outside a write"
        self._current.on_success.append(action)

    def on_commit(self, action: Callable[[], None]) -> None:
        """Run ``action`` after the running write is committed (never if it is rolled back)."""
        assert self._current is not None, "on_commit outside a write"
        self._current.on_commit.append(action)

    # -- worker thread side --------------------------------------------------------------------
    def _run_batch(self, batch: list[_Job]) -> None:
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

    def _run_transaction(self, batch: list[_Job]) -> None:
        try:
            conn = self._ready_connection()
            self.tx_state.clear()
            conn.execute("BEGIN IMMEDIATE")
        except Exception as exc:
            self._fail_all(batch, exc)
            return
        # A write alone in its transaction needs no savepoint: the transaction is its undo.
        savepoints = len(batch) > 1
        done: list[_Job] = []
        for job in batch:
            self._current = job
            try:
                if savepoints:
                    conn.execute("SAVEPOINT w")
                job.value = job.fn(conn)
                if savepoints:
                    conn.execute("RELEASE w")
                for action in job.on_success:
                    action()
            except Exception as exc:
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

    def _abort(self, conn: sqlite3.Connection, batch: list[_Job], exc: Exception) -> None:
        """Roll back the whole batch: every write not failed yet fails because of ``exc``."""
        self._last_failure = f"{type(exc).__name__}: {exc}"
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                # Left for the next batch to heal (see ``_ready_connection``).
                logger.exception("SQLite store: rollback of a failed transaction failed")
        self._fail_all(batch, exc)

    @staticmethod
    def _fail_all(batch: list[_Job], exc: Exception) -> None:
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
