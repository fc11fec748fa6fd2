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
    __slots__ = ("_heap", "_is_live", "_seq")

    def __init__(self, is_live: Validity) -> None:
        self._heap: list[tuple[int, int, Entry]] = []
        self._seq = itertools.count()  # ties break by insertion, never by comparing entries
        self._is_live = is_live

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, when_ms: int, entry: Entry) -> None:
        heapq.heappush(self._heap, (when_ms, next(self._seq), entry))

    def pop_due(self, now_ms: int) -> Iterator[Entry]:
        """Live entries whose time is ``<= now_ms``, earliest first."""
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            when, _, entry = heapq.heappop(heap)
            if self._is_live(when, entry):
                yield entry

    def next_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def live(self) -> list[Entry]:
        return [entry for when, _, entry in self._heap if self._is_live(when, entry)]

    def compact(self, live_count: int) -> None:
        """Drop stale items when there are more than twice as many items as live entries."""
        if len(self._heap) > 2 * live_count + 64:
            self._heap = [item for item in self._heap if self._is_live(item[0], item[2])]
            heapq.heapify(self._heap)
