# cproxy: compiled (mypyc), see cproxy/_native.py
"""Deliveries handed out and not answered yet: by message, with their ack deadlines, and those
held while a transaction persists their results (``GroupEngine.hold``).

``InFlight`` is a collaborator of ``GroupEngine`` (``cproxy.engine.group``), which moves the
entries' states (``Tally.move``); this keeps which delivery of a message is current, so a
fenced result, extend or give-back answers only that one (docs/guarantees.md, fenced
deliveries).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Final

from cproxy.engine.deadlines import DeadlineHeap
from cproxy.engine.records import Result
from cproxy.engine.snapshots import Outcome
from cproxy.engine.work import IN_FLIGHT, Entry, State, pop_queues
from cproxy.model import MessageRef

#: ``deadline_ms`` of a held delivery (``hold``): no ack-timeout heap item ever matches it.
_HELD_DEADLINE: Final = -1


class InFlight:
    """In-flight deliveries of one group and their ack deadlines."""

    def __init__(self) -> None:
        self._by_ref: dict[MessageRef, Entry] = {}
        self._timeouts = DeadlineHeap(State.IN_FLIGHT, "deadline_ms")
        #: Deliveries set aside by ``hold`` while their results are persisted with outputs,
        #: with the ack deadline each had.
        self._held: dict[MessageRef, tuple[Entry, int]] = {}

    # -- the hot path --------------------------------------------------------------------------
    def add_all(self, deadline_ms: int, entries: list[Entry], consumer: str | None) -> None:
        """``entries`` (just moved to IN_FLIGHT) were handed out to ``consumer`` (None: a
        push), due by ``deadline_ms``: one ack-timeout heap item for all (the list is kept)."""
        by_ref = self._by_ref
        for entry in entries:
            message = entry.message
            by_ref[(message.topic, message.qid, message.offset)] = entry
            entry.consumer = consumer
        self._timeouts.push_all(deadline_ms, entries)

    def take(self, result: Result, offset: int) -> Entry | None:
        """The in-flight entry a result answers, removed from flight; None if unknown.

        A fenced result (its attempt named) answers only that delivery: after a timeout
        and redelivery, a late result for the old attempt must not finish the message
        while another consumer works on it.
        """
        ref = (result.topic, result.qid, offset)
        if result.attempts is None:  # unfenced: whatever delivery is current
            return self._by_ref.pop(ref, None)
        entry = self.current(ref, result.attempts.get(offset))
        if entry is not None:
            del self._by_ref[ref]
        return entry

    def current(self, ref: MessageRef, attempt: int | None) -> Entry | None:
        """The in-flight entry of ``ref``, if ``attempt`` (when named) is its current one."""
        entry = self._by_ref.get(ref)
        if entry is None or attempt is None or attempt == entry.attempt:
            return entry
        return None

    def pop(self, ref: MessageRef) -> None:
        """``ref`` left flight some other way (sent back, given back, dropped)."""
        self._by_ref.pop(ref, None)

    def extend(
        self,
        refs: Iterable[MessageRef],
        deadline_ms: int,
        attempts: Mapping[MessageRef, int] | None,
    ) -> Outcome:
        """Move the ack deadline of the current deliveries of ``refs`` to ``deadline_ms``."""
        applied = 0
        unknown: list[MessageRef] = []
        for ref in refs:
            entry = self.current(ref, attempts.get(ref) if attempts else None)
            if entry is None:
                unknown.append(ref)
                continue
            entry.deadline_ms = deadline_ms
            self._timeouts.push(deadline_ms, entry)
            applied += 1
        return Outcome(applied, unknown)

    def expired(self, now_ms: int) -> Iterator[Entry]:
        """Deliveries whose ack deadline passed, each removed from flight as it is reached:
        the caller charges each before the next is checked (``DeadlineHeap.pop_due``)."""
        for entry in self._timeouts.pop_due(now_ms):
            del self._by_ref[entry.message.ref]
            yield entry

    def compact(self) -> None:
        self._timeouts.compact(len(self._by_ref))

    def next_ms(self) -> int | None:
        """The earliest ack deadline, or None."""
        return self._timeouts.next_ms()

    # -- reads ---------------------------------------------------------------------------------
    def on(self, topic: str, qid: int) -> int:
        """Deliveries of the queue not yet answered (held ones included)."""
        in_flight = sum(1 for t, q, _ in self._by_ref if t == topic and q == qid)
        return in_flight + sum(1 for t, q, _ in self._held if t == topic and q == qid)

    def by_consumer(self) -> dict[str | None, int]:
        """Messages in flight per consumer id (None: pushed)."""
        counts: dict[str | None, int] = {}
        for entry in self._by_ref.values():
            counts[entry.consumer] = counts.get(entry.consumer, 0) + 1
        return counts

    def drop(self, topic: str, qids: Collection[int]) -> list[Entry]:
        """Forget the deliveries of those queues (a seek); returns the unordered ones (no
        chain holds them, so the caller drops them itself)."""
        return pop_queues(self._by_ref, topic, qids)

    # -- results persisted with outputs --------------------------------------------------------
    def hold(self, results: Iterable[Result]) -> list[MessageRef]:
        """Set aside the deliveries ``results`` answer (``GroupEngine.hold``): all, or none
        and the refs that are not current (or answer a run member whose head is unfinished)."""
        found: list[tuple[MessageRef, Entry]] = []
        stale: list[MessageRef] = []
        seen: set[MessageRef] = set()
        for result in results:
            offsets = [*result.acks, *(offset for offset, _ in result.fails)]
            for offset in offsets:
                ref = (result.topic, result.qid, offset)
                attempt = result.attempts.get(offset) if result.attempts else None
                entry = self.current(ref, attempt)
                chain = entry.chain if entry is not None else None
                if entry is None or ref in seen or (chain is not None and chain.head is not entry):
                    stale.append(ref)
                    continue
                seen.add(ref)
                found.append((ref, entry))
        if stale:
            return stale
        for ref, entry in found:
            del self._by_ref[ref]
            self._held[ref] = (entry, entry.deadline_ms)
            entry.deadline_ms = _HELD_DEADLINE  # its ack-timeout heap item is now stale
        return stale

    def held_redrives(self, results: Iterable[Result]) -> list[MessageRef]:
        """The redriven dead letters that held ``results`` ack."""
        out: list[MessageRef] = []
        for result in results:
            for offset in result.acks:
                ref = (result.topic, result.qid, offset)
                held = self._held.get(ref)
                if held is not None and held[0].redriven and not held[0].replay:
                    out.append(ref)
        return out

    def settle(self, results: Iterable[Result]) -> None:
        """The held deliveries of ``results`` are in flight again, for their results to be
        applied now; one an operator dropped meanwhile (seek) stays out."""
        for result in results:
            for offset in [*result.acks, *(offset for offset, _ in result.fails)]:
                ref = (result.topic, result.qid, offset)
                held = self._held.pop(ref, None)
                if held is not None and held[0].state is IN_FLIGHT:
                    self._by_ref[ref] = held[0]

    def unhold(self, results: Iterable[Result]) -> None:
        """The held deliveries of ``results`` are in flight again with the ack deadlines
        they had (the next expiry times out those now past)."""
        for result in results:
            for offset in [*result.acks, *(offset for offset, _ in result.fails)]:
                ref = (result.topic, result.qid, offset)
                held = self._held.pop(ref, None)
                if held is None or held[0].state is not IN_FLIGHT:
                    continue
                entry, deadline_ms = held
                entry.deadline_ms = deadline_ms
                self._by_ref[ref] = entry
                self._timeouts.push(deadline_ms, entry)
