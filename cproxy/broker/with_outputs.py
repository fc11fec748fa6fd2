"""Acks with outputs of one group (guarantee 10), committed in shared store transactions.

Each call's results are first *held* in the engine (``GroupEngine.hold``): all current, or
the call is refused (``StaleResults``) and nothing changes. Held calls then wait for the
group's next transaction: the first one to arrive leads it and takes every call held by then
(group commit), so calls arriving while a transaction runs share the next one instead of
waiting one transaction each. One transaction writes the outputs of all its calls and the
progress of their queues as it is once their results apply (``progress_after``; redriven
dead letters they finish are deleted with it), under the runner's commit lock, so no other
progress write of the group can land between the snapshot and the write (and undo it).
Then each call's results are applied (``settle_held``).

All or nothing per call: a transaction that fails fails every call in it, and their
deliveries are in flight again as they were (``unhold``). A store error may hide a COMMIT
that happened (PostgreSQL lost during it): the deliveries then stay held (a repeated call is
refused) until the stored progress tells which it was (``resolve``: it equals what the
transaction wrote, or not); until then no progress of the group is written, since it could
undo that transaction. On PostgreSQL with a fence, a
queue lost to another proxy fails the transaction (``QueueNotOwned``): the calls with results
on a lost queue answer ``StaleResults`` (its new owner delivers those messages again), the
others ``StoreError`` (nothing stored: the caller may retry).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import anyio

from cproxy.engine.group import GroupEngine
from cproxy.engine.records import Result
from cproxy.engine.snapshots import Outcome
from cproxy.errors import QueueNotOwned, StaleResults, StoreError
from cproxy.model import AppendResult, MessageRef, NewMessage, QueueProgress, QueueRef
from cproxy.store.base import Store

from .clock import now_ms

logger = logging.getLogger(__name__)

#: One output: a topic and the messages to append to it.
Append = tuple[str, Sequence[NewMessage]]


class _Call:
    """One ack with outputs waiting for (or leading) a transaction."""

    __slots__ = ("error", "lead", "outcome", "outputs", "results", "stored", "wake")

    def __init__(self, results: Sequence[Result], outputs: Sequence[Append]) -> None:
        self.results = results
        self.outputs = outputs
        self.wake = anyio.Event()
        self.lead = False  # woken to lead the next transaction, not because it is done
        self.outcome: Outcome | None = None
        self.stored: list[list[AppendResult]] = []
        self.error: BaseException | None = None


def _refs(results: Sequence[Result]) -> list[MessageRef]:
    return [
        (r.topic, r.qid, offset) for r in results for offset in [*r.acks, *(o for o, _ in r.fails)]
    ]


class OutputCommits:
    """The acks with outputs of one group (see the module docstring)."""

    def __init__(
        self,
        name: str,
        engine: GroupEngine,
        store: Store,
        lock: anyio.Lock,
        on_applied: Callable[[Outcome], None],
    ) -> None:
        """``lock``: the runner's commit lock; ``on_applied``: results applied outside a
        call (``resolve``), for the runner's wake-ups."""
        self._name = name
        self._engine = engine
        self._store = store
        self._lock = lock
        self._on_applied = on_applied
        self._waiting: list[_Call] = []
        self._leading = False
        #: Failed transactions whose COMMIT may have happened: (results held, progress).
        self._unresolved: list[tuple[list[Result], dict[QueueRef, QueueProgress]]] = []

    async def commit(
        self, results: Sequence[Result], outputs: Sequence[Append], dedup_window_ms: int
    ) -> tuple[Outcome, list[list[AppendResult]]]:
        """Apply ``results`` and store ``outputs`` in one transaction (shared with other
        calls); see the module docstring for the errors."""
        stale = self._engine.hold(results)
        if stale:
            raise StaleResults(stale)
        call = _Call(results, outputs)
        self._waiting.append(call)
        # Shielded: a caller cancelled mid-transaction must not leave results held, nor
        # put them back in flight while the transaction still commits.
        with anyio.CancelScope(shield=True):
            if self._leading:
                await call.wake.wait()  # done, or handed the lead of the next transaction
            else:
                self._leading = call.lead = True
            if call.lead:
                try:
                    batch, self._waiting = self._waiting, []
                    await self._run(batch, dedup_window_ms)
                finally:
                    if self._waiting:  # arrived meanwhile: the first leads the next one
                        self._waiting[0].lead = True
                        self._waiting[0].wake.set()
                    else:
                        self._leading = False
        if call.error is not None:
            raise call.error
        assert call.outcome is not None
        return call.outcome, call.stored

    async def _run(self, batch: list[_Call], dedup_window_ms: int) -> None:
        results = [r for call in batch for r in call.results]
        outputs = [o for call in batch for o in call.outputs]
        try:
            async with self._lock:
                if not await self._resolve():
                    raise StoreError("the outcome of an earlier transaction is not known yet")
                progress = self._engine.progress_after(results)
                redrives = self._engine.held_redrives(results)
                try:
                    stored = await self._store.commit_with_outputs(
                        self._name, progress, outputs, now_ms(), dedup_window_ms, redrives
                    )
                except StoreError as exc:
                    # The COMMIT may have happened all the same (PostgreSQL lost during it):
                    # the deliveries stay held until the stored progress tells.
                    self._unresolved.append((results, progress))
                    await self._resolve()
                    self._fail(batch, exc)
                    return
        except BaseException as exc:
            self._engine.unhold(results)
            self._fail(batch, exc)
            if not isinstance(exc, Exception):
                raise
            return
        now = now_ms()
        taken = 0
        for call in batch:
            call.stored = stored[taken : taken + len(call.outputs)]
            taken += len(call.outputs)
            call.outcome = self._engine.settle_held(call.results, now, progress)
            call.wake.set()

    def _fail(self, batch: list[_Call], exc: BaseException) -> None:
        for call in batch:
            call.error = self._error_for(call, exc)
            call.wake.set()

    async def resolve(self) -> bool:
        """Settle, or put back in flight, the deliveries of failed transactions whose outcome
        was not known; False while one still is not (the store cannot be read). Call with the
        commit lock held: no progress write of the group may come before (it could undo a
        transaction that did commit)."""
        return await self._resolve()

    async def _resolve(self) -> bool:
        while self._unresolved:
            results, progress = self._unresolved[0]
            try:
                persisted = await self._store.load_progress(self._name)
            except StoreError:
                return False
            del self._unresolved[0]
            # Only that transaction can have written this progress (the lock is held, and
            # the progress before it counted these deliveries unfinished).
            if all(persisted.get(ref) == p for ref, p in progress.items()):
                logger.warning(
                    "group=%s a transaction reported failed had committed: %d result(s) applied",
                    self._name,
                    len(_refs(results)),
                )
                self._on_applied(self._engine.settle_held(results, now_ms(), progress))
            else:
                self._engine.unhold(results)
        return True

    @staticmethod
    def _error_for(call: _Call, exc: BaseException) -> BaseException:
        if not isinstance(exc, QueueNotOwned):
            return exc
        lost = set(exc.refs)
        refs = [ref for ref in _refs(call.results) if (ref[0], ref[1]) in lost]
        if refs:
            return StaleResults(refs)
        return StoreError("a queue of another call in the same transaction was lost; retry")
