"""The SQLite store's writer: one connection, a queue of writes, and group commit.

Transactions run either on the event loop's thread (``threads=False``: no hop, the loop waits
for SQLite) or on a worker thread (``threads=True``: a hop costs ~100 µs of event-loop time,
but the loop serves meanwhile); ``Database`` picks. Either way a write that is its own
transaction costs a COMMIT, so writes that queue up while the writer is busy are folded
together: the next batch runs all of them (up to ``MAX_BATCH_WEIGHT`` messages) in ONE
transaction (``_sqlite_tx``: how a batch commits or fails write by write). A leader that finds
itself alone first lets a few loop turns pass (``GATHER_TURNS``) so that requests whose bytes
have already arrived join it: with small produce calls this more than halves the COMMITs
(old journal, round 7). Batches run in queue order (FIFO).

There is no background task (a store has no task group to own one): the caller whose write is
at the head of the queue leads. It runs one batch, then hands the lead to
the caller now at the head, which finds more writes queued behind it. Everyone else just waits.
"""

from __future__ import annotations

import sqlite3
from collections import deque
from collections.abc import Callable
from typing import TypeVar, cast

import anyio
from anyio import CapacityLimiter, to_thread

from cproxy.errors import StoreError
from cproxy.store._sqlite_tx import Job

T = TypeVar("T")

#: Most messages one batch transaction takes on (a single larger write still runs, alone): it
#: bounds how long the writer holds the transaction and how long the last caller waits.
MAX_BATCH_WEIGHT = 5000

#: Loop turns a leader alone in the queue lets pass before it runs: at least the first number
#: (a request already in the socket buffer needs two: one to read and parse it, one for its
#: task to reach ``write``), and more while each turn still brings new writes, up to the
#: second. A turn with nothing else to run costs a few µs; a COMMIT saved, ~100 µs.
GATHER_TURNS = (2, 8)


class Writer:
    """The write queue in front of the writer connection; see the module docstring.
    ``run_batch`` runs a batch of writes in one transaction (``Transactions.run_batch``)."""

    def __init__(
        self,
        run_batch: Callable[[list[Job]], None],
        *,
        group_commit: bool = True,
        threads: bool = True,
    ) -> None:
        self._run_batch = run_batch
        self._group_commit = group_commit
        #: Transactions on a worker thread; False: on the event loop's thread (see ``Database``).
        self.threads = threads
        self.limiter: CapacityLimiter | None = None
        self._queue: deque[Job] = deque()
        self._leading = False  # a caller leads (or has been handed the lead); empty queue if not

    # -- event loop side -----------------------------------------------------------------------
    async def write(
        self, fn: Callable[[sqlite3.Connection], T], weight: int = 1, mergeable: bool = False
    ) -> T:
        """Run ``fn`` atomically in a write transaction; return once that committed.
        ``mergeable``: ``fn`` neither reads nor changes what deferred work writes."""
        if self.limiter is None:
            raise StoreError("the store is not open")
        job = Job(fn, weight, mergeable)
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

    async def _wait_turn(self, job: Job) -> None:
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

    async def _lead(self, job: Job) -> None:
        try:
            if len(self._queue) == 1:
                # Alone so far: let the requests that are ready to run (typically the callers
                # just answered by the last batch) queue their next writes first. A loop turn
                # costs far less than the COMMIT (and the thread hop) each would need.
                await self._gather()
            while not job.finished:
                await self._run_next_batch()
        except BaseException:
            if not job.finished:
                self._queue.remove(job)  # cancelled before its batch reached the thread
            raise
        finally:
            self._hand_off()

    async def _gather(self) -> None:
        least, most = GATHER_TURNS
        for turn in range(1, most + 1):
            queued = len(self._queue)
            await anyio.lowlevel.checkpoint()
            if turn >= least and len(self._queue) == queued:
                return

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

    async def _run(self, batch: list[Job]) -> None:
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
