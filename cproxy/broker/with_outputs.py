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
deliveries are in flight again as they were (``unhold``). On PostgreSQL with a fence, a
queue lost to another proxy fails the transaction (``QueueNotOwned``): the calls with results
on a lost queue answer ``StaleResults`` (its new owner delivers those messages again), the
others ``StoreError`` (nothing stored: the caller may retry).
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from cproxy.engine.group import GroupEngine
from cproxy.engine.records import Result
from cproxy.engine.snapshots import Outcome
from cproxy.errors import QueueNotOwned, StaleResults, StoreError
from cproxy.model import AppendResult, MessageRef, NewMessage
from cproxy.store.base import Store

from .clock import now_ms

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

    def __init__(self, name: str, engine: GroupEngine, store: Store, lock: anyio.Lock) -> None:
        self._name = name
        self._engine = engine
        self._store = store
        self._lock = lock
        self._waiting: list[_Call] = []
        self._leading = False

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
                progress = self._engine.progress_after(results)
                redrives = self._engine.held_redrives(results)
                stored = await self._store.commit_with_outputs(
                    self._name, progress, outputs, now_ms(), dedup_window_ms, redrives
                )
        except BaseException as exc:
            self._engine.unhold(results)
            for call in batch:
                call.error = self._error_for(call, exc)
                call.wake.set()
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

    @staticmethod
    def _error_for(call: _Call, exc: BaseException) -> BaseException:
        if not isinstance(exc, QueueNotOwned):
            return exc
        lost = set(exc.refs)
        refs = [ref for ref in _refs(call.results) if (ref[0], ref[1]) in lost]
        if refs:
            return StaleResults(refs)
        return StoreError("a queue of another call in the same transaction was lost; retry")
