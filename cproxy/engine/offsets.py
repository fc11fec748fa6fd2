# cproxy: compiled (mypyc), see cproxy/_native.py
"""Per-queue completion tracking: the committable offset is the lowest unfinished one.

Messages finish out of order (different keys flow in parallel), so a queue's progress is the
base offset below which everything is finished plus the set of finished offsets above it. The
set is kept as sorted half-open ranges: finishing is mostly in order, so there are few ranges
even when millions of messages finish behind one stuck message, and the ranges are what gets
persisted (``QueueProgress.finished``), so a restart does not replay finished work.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable


class OffsetTracker:
    """Tracks finished offsets of one queue for one group."""

    __slots__ = ("_ends", "_starts", "base", "dirty")

    def __init__(self, committed: int, finished: Iterable[tuple[int, int]] = ()) -> None:
        #: Lowest unfinished offset: everything below is finished.
        self.base = committed
        self._starts: list[int] = []
        self._ends: list[int] = []
        #: True when the state changed since the last ``snapshot``.
        self.dirty = False
        for first, end in sorted(finished):
            start = max(first, self.base)
            if end <= start:
                continue
            if start == self.base:
                self.base = end
            elif self._ends and self._ends[-1] >= start:
                self._ends[-1] = max(self._ends[-1], end)
            else:
                self._starts.append(start)
                self._ends.append(end)
        # A loaded range may now touch the base: fold it in.
        while self._starts and self._starts[0] <= self.base:
            self.base = max(self.base, self._ends[0])
            del self._starts[0]
            del self._ends[0]

    def is_finished(self, offset: int) -> bool:
        if offset < self.base:
            return True
        i = bisect_right(self._starts, offset) - 1
        return i >= 0 and offset < self._ends[i]

    def count_finished(self, start: int, end: int) -> int:
        """How many offsets in ``[start, end)`` are finished."""
        count = max(0, min(end, self.base) - start)
        for first, last in zip(self._starts, self._ends, strict=True):
            count += max(0, min(end, last) - max(start, first))
        return count

    def finish(self, offset: int) -> bool:
        """Mark ``offset`` finished; returns False when it already was."""
        if offset < self.base:
            return False
        self.dirty = True
        if offset == self.base:
            self.base += 1
            if self._starts and self._starts[0] == self.base:
                self.base = self._ends[0]
                del self._starts[0]
                del self._ends[0]
            return True
        starts, ends = self._starts, self._ends
        i = bisect_right(starts, offset) - 1
        if i >= 0 and offset < ends[i]:
            return False
        joins_left = i >= 0 and ends[i] == offset
        joins_right = i + 1 < len(starts) and starts[i + 1] == offset + 1
        if joins_left and joins_right:
            ends[i] = ends[i + 1]
            del starts[i + 1]
            del ends[i + 1]
        elif joins_left:
            ends[i] = offset + 1
        elif joins_right:
            starts[i + 1] = offset
        else:
            starts.insert(i + 1, offset)
            ends.insert(i + 1, offset + 1)
        return True

    def ranges(self) -> tuple[tuple[int, int], ...]:
        """Finished ranges above ``base``, sorted and disjoint."""
        return tuple(zip(self._starts, self._ends, strict=True))

    def reset(self, committed: int) -> None:
        """Forget everything (used by seek): ``committed`` becomes the lowest unfinished."""
        self.base = committed
        self._starts.clear()
        self._ends.clear()
        self.dirty = True
