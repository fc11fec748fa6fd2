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
from collections.abc import Callable, Iterator

from cproxy.engine.work import Entry

#: Is the item (time, entry) still live?
Validity = Callable[[int, Entry], bool]


class DeadlineHeap:
    """Entries by time. An item holds every entry pushed with one time in one call: a pull
    pushes its whole answer with one deadline as one item, not one heap push per message."""

    __slots__ = ("_count", "_heap", "_is_live", "_seq")

    def __init__(self, is_live: Validity) -> None:
        self._heap: list[tuple[int, int, list[Entry]]] = []
        self._seq = itertools.count()  # ties break by insertion, never by comparing entries
        self._is_live = is_live
        #: Entries referenced by the items (stale ones included): what ``compact`` bounds.
        self._count = 0

    def __len__(self) -> int:
        """Entries referenced, stale ones included."""
        return self._count

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
        is_live = self._is_live
        while heap and heap[0][0] <= now_ms:
            when, _, entries = heapq.heappop(heap)
            self._count -= len(entries)
            for entry in entries:
                if is_live(when, entry):
                    yield entry

    def next_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def live(self) -> list[Entry]:
        is_live = self._is_live
        return [
            entry for when, _, entries in self._heap for entry in entries if is_live(when, entry)
        ]

    def compact(self, live_count: int) -> None:
        """Drop stale entries when there are more than twice as many as live ones."""
        if self._count > 2 * live_count + 64:
            is_live = self._is_live
            heap: list[tuple[int, int, list[Entry]]] = []
            for when, seq, entries in self._heap:
                kept = [entry for entry in entries if is_live(when, entry)]
                if kept:
                    heap.append((when, seq, kept))
            heapq.heapify(heap)
            self._heap = heap
            self._count = sum(len(item[2]) for item in heap)
