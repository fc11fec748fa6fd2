# cproxy: compiled (mypyc), see cproxy/_native.py
"""Deadline heaps: ack timeouts and retry due times.

Entries are never removed from the middle of a heap (that is O(n)); an item whose entry has
moved on (acked, redelivered, extended, dropped) is *stale* and skipped when it surfaces.
Stale items still reference their entry — and its message body — so the heap is rebuilt
once stale items outnumber live ones: otherwise memory would grow with rate x timeout
instead of staying bounded by ``max_buffered``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Literal

from cproxy.engine.work import Entry, State


def earliest(a: int | None, b: int | None) -> int | None:
    """The earlier of two optional times (ms), None if both are None. Written out rather than
    ``min`` over a filtering generator: the engine asks for its next deadline after every pull
    and every batch of results, and compiled, the generator cost ~1 µs a call."""
    if a is None:
        return b
    if b is None or a <= b:
        return a
    return b


class DeadlineHeap:
    """Entries by time. An item holds every entry pushed with one time in one call: a pull
    pushes its whole answer with one deadline as one item, not one heap push per message.

    An entry is live while it is in ``state`` with its ``timed_by`` field (``deadline_ms`` or
    ``due_ms``) still equal to the item's time. That test is written out in ``_live`` rather
    than passed in as a function: compaction runs it about twice per pushed entry, and a call
    per entry cost more than the rest of the compaction.
    """

    __slots__ = ("_by_deadline", "_count", "_heap", "_seq", "_state")

    def __init__(self, state: State, timed_by: Literal["deadline_ms", "due_ms"]) -> None:
        self._heap: list[tuple[int, int, list[Entry]]] = []
        self._seq = itertools.count()  # ties break by insertion, never by comparing entries
        self._state = state
        self._by_deadline = timed_by == "deadline_ms"
        #: Entries referenced by the items (stale ones included): what ``compact`` bounds.
        self._count = 0

    def __len__(self) -> int:
        """Entries referenced, stale ones included."""
        return self._count

    def _live(self, when: int, entries: list[Entry]) -> list[Entry]:
        state, by_deadline = self._state, self._by_deadline
        return [
            e
            for e in entries
            if e.state is state and (e.deadline_ms if by_deadline else e.due_ms) == when
        ]

    def push(self, when_ms: int, entry: Entry) -> None:
        heapq.heappush(self._heap, (when_ms, next(self._seq), [entry]))
        self._count += 1

    def push_all(self, when_ms: int, entries: list[Entry]) -> None:
        """Push every entry of ``entries`` (the list is kept: do not modify it) at ``when_ms``."""
        if entries:
            heapq.heappush(self._heap, (when_ms, next(self._seq), entries))
            self._count += len(entries)

    def pop_due(self, now_ms: int) -> Iterator[Entry]:
        """Live entries whose time is ``<= now_ms``, earliest first."""
        heap = self._heap
        state, by_deadline = self._state, self._by_deadline
        while heap and heap[0][0] <= now_ms:
            when, _, entries = heapq.heappop(heap)
            self._count -= len(entries)
            for e in entries:
                # Checked as each one is reached, not up front: handling one (a timeout that
                # sends a same-key run back) can take the next ones of its item out of play.
                if e.state is state and (e.deadline_ms if by_deadline else e.due_ms) == when:
                    yield e

    def next_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def live(self) -> list[Entry]:
        return [entry for when, _, entries in self._heap for entry in self._live(when, entries)]

    def compact(self, live_count: int) -> None:
        """Drop stale entries when there are more than twice as many as live ones."""
        if self._count > 2 * live_count + 64:
            heap: list[tuple[int, int, list[Entry]]] = []
            count = 0
            for when, seq, entries in self._heap:
                kept = self._live(when, entries)
                if kept:
                    heap.append((when, seq, kept))
                    count += len(kept)
            heapq.heapify(heap)
            self._heap, self._count = heap, count
