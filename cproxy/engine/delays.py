# cproxy: compiled (mypyc), see cproxy/_native.py
"""Unordered delayed messages that are far off: kept out of memory, found again by rescans.

A delayed message with an order value holds its chain (``cproxy.engine.sequencer``): a far
delayed head puts its chain to sleep, remembered as one parked-chain record. A delayed message
*without* an order value holds nothing, so nothing per message may be remembered for it at all
(a million of them must cost disk, not memory). The reader therefore *releases* such a message
when it reads one due later than the queue's *horizon*: it is not held, and the queue's
``DelayWindow`` only notes the offset range it lies in.

The window is a short list of *segments* ``(start, end, horizon_ms)``: in ``[start, end)``
every unordered message with a ``deliver_at_ms`` above ``horizon_ms`` was released and is still
unread; every other message there was handled as usual. That rule is exact because a message
is released exactly when its due time is above the horizon in force when it was read, and a
segment is only extended while that horizon stays the same. So the window is a handful of
integers, persisted with the group's progress (``QueueProgress.delayed``), and survives a
restart.

Shortly before the earliest released message is due, a *rescan* reads the window back from
its first offset to the fetch position (``RELOAD_SCAN_BATCH`` messages per read) with a new,
later horizon: released messages due by then are admitted (DELAYED until their time), later
ones stay released and the window shrinks to ``[first still released, fetch position)`` under
the new horizon. To keep a rescan from admitting more than memory allows, its horizon is the
due time of about the ``max_buffered // 4``-th earliest message the previous rescan saw (at
least ``RELEASE_BEYOND_MS`` ahead); a rescan that finds the buffer full pauses and resumes when
there is room. The price of holding nothing per message is that each rescan rereads the window:
about (messages in the window / admitted per rescan) reads per message, all sequential.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from cproxy.model import Record

#: An unordered message due further than this (ms) from now is released, not held.
RELEASE_BEYOND_MS: Final = 3000
#: A rescan starts this long (ms) before the earliest released message is due (over a
#: second, like ``sequencer.WAKE_LEAD_MS``, so what it admits is handed out on time).
RESCAN_LEAD_MS: Final = 1500
#: At most this many segments: the horizon for new reads stops moving at the cap (until a
#: rescan merges what it scanned into one segment).
MAX_SEGMENTS: Final = 8

#: (start offset, end offset, horizon ms).
Segment = tuple[int, int, int]


@dataclass(slots=True)
class _Rescan:
    """A rescan under way: ``[pos, upto)`` still to read, everything below ``pos`` done."""

    target_ms: int
    pos: int
    upto: int
    #: The first offset below ``pos`` still released under ``target_ms``, if any.
    first: int | None = None
    #: Messages found still released (due after ``target_ms``).
    kept: int = 0
    #: Messages released by new reads meanwhile (beyond ``upto``), and the earliest due.
    fresh: int = 0
    fresh_due_ms: int | None = None
    #: The earliest due times seen among those kept, as a bounded max-heap (negated).
    dues: list[int] = field(default_factory=list)


class DelayWindow:
    """The released unordered delayed messages of one queue of one group."""

    __slots__ = ("_hint_ms", "_live_ms", "_sample", "next_due_ms", "released", "scan", "segments")

    def __init__(self, segments: tuple[Segment, ...] = (), sample: int = 1000) -> None:
        """``segments`` as persisted; ``sample``: how many messages a rescan aims to admit."""
        self.segments: list[Segment] = [s for s in segments if s[1] > s[0]]
        #: The horizon of new reads (ms): an unordered message due later is released.
        self._live_ms = max((h for _, _, h in self.segments), default=0)
        #: The earliest due time of a released message (ms); 0 when unknown (after a
        #: restart: the first rescan finds it); None when nothing is released.
        self.next_due_ms: int | None = 0 if self.segments else None
        #: Released messages not yet admitted (exact after each rescan).
        self.released = 0
        self.scan: _Rescan | None = None
        self._hint_ms = 0
        self._sample = max(1, sample)

    # -- reading new messages ------------------------------------------------------------------
    def note_now(self, now_ms: int) -> None:
        """Move the horizon of new reads to ``now_ms + RELEASE_BEYOND_MS`` when allowed."""
        target = now_ms + RELEASE_BEYOND_MS
        if target > self._live_ms and len(self.segments) < MAX_SEGMENTS:
            self._live_ms = target

    def releases(self, due_ms: int) -> bool:
        """Whether a newly read unordered message due at ``due_ms`` is released."""
        return due_ms > self._live_ms

    def release(self, offset: int, due_ms: int) -> None:
        """A newly read unordered message at ``offset`` was released (not held)."""
        segments = self.segments
        if segments and segments[-1][2] == self._live_ms and segments[-1][1] <= offset:
            start, _, horizon = segments[-1]
            segments[-1] = (start, offset + 1, horizon)
        else:
            segments.append((offset, offset + 1, self._live_ms))
        if self.next_due_ms is None or (self.next_due_ms and due_ms < self.next_due_ms):
            self.next_due_ms = due_ms
        self.released += 1
        scan = self.scan
        if scan is not None:
            scan.fresh += 1
            if scan.fresh_due_ms is None or due_ms < scan.fresh_due_ms:
                scan.fresh_due_ms = due_ms

    # -- rescans -------------------------------------------------------------------------------
    def rescan_at_ms(self) -> int | None:
        """When the next rescan should start (ms), or None (nothing released, or under way)."""
        if not self.segments or self.scan is not None or self.next_due_ms is None:
            return None
        return self.next_due_ms - RESCAN_LEAD_MS

    def next_read(self, now_ms: int, fetch_offset: int, batch: int) -> tuple[int, int, int] | None:
        """The rescan's next read ``(from offset, count, upto)``, starting a rescan when
        one is due; None when no rescan reads now. Also moves the horizon of new reads."""
        self.note_now(now_ms)
        start_at = self.rescan_at_ms()
        if start_at is not None and now_ms >= start_at:
            self.start_rescan(now_ms, fetch_offset)
        scan = self.scan
        if scan is None:
            return None
        if scan.pos >= scan.upto:
            self.finish_rescan()
            return None
        return scan.pos, min(batch, scan.upto - scan.pos), scan.upto

    def start_rescan(self, now_ms: int, fetch_offset: int) -> None:
        """Begin a rescan of everything released below ``fetch_offset``."""
        target = max(now_ms + RELEASE_BEYOND_MS, self._hint_ms)
        self.scan = _Rescan(target, self.segments[0][0], fetch_offset)
        self.note_now(now_ms)

    def horizon_at(self, offset: int) -> int | None:
        """The horizon of the (old) segment holding ``offset``, or None outside every one."""
        for start, end, horizon in self.segments:
            if start <= offset < end:
                return horizon
            if start > offset:
                break
        return None

    def take_rescan(
        self,
        from_offset: int,
        max_count: int,
        upto: int,
        messages: Sequence[Record],
        candidate: Callable[[Record], bool],
        admit: Callable[[Record], bool],
    ) -> None:
        """Take what a rescan read (``max_count`` asked from ``from_offset``, range end
        ``upto``): admit the released messages due by the rescan's target, keep the later
        ones released. ``candidate(m)``: unordered and not held; ``admit(m)`` holds ``m``,
        or answers False when there is no room (the rescan resumes there later)."""
        scan = self.scan
        if scan is None or scan.pos != from_offset or scan.upto != upto:
            return  # stale
        pos = upto if len(messages) < max_count else from_offset
        for message in messages:
            offset = message.offset
            if offset >= upto:
                pos = upto
                break
            due = message.deliver_at_ms
            horizon = None if due is None else self.horizon_at(offset)
            if due is None or horizon is None or due <= horizon or not candidate(message):
                pos = offset + 1
                continue  # not released: handled when it was read
            if due > scan.target_ms:
                self.keep(offset, due)
            elif admit(message):
                self.released = max(0, self.released - 1)
            else:
                pos = offset  # no room: resume here when there is
                break
            pos = offset + 1
        scan.pos = max(scan.pos, pos)
        if scan.pos >= scan.upto:
            self.finish_rescan()

    def keep(self, offset: int, due_ms: int) -> None:
        """The rescan found a message still released (due after its target)."""
        scan = self.scan
        assert scan is not None
        if scan.first is None:
            scan.first = offset
        scan.kept += 1
        if len(scan.dues) < self._sample:
            heapq.heappush(scan.dues, -due_ms)
        elif -scan.dues[0] > due_ms:
            heapq.heapreplace(scan.dues, -due_ms)

    def finish_rescan(self) -> None:
        """The rescan read up to its end: the window shrinks to what is still released."""
        scan = self.scan
        assert scan is not None
        self.segments = self._merged(scan, scan.upto)
        self.scan = None
        self.released = scan.kept + scan.fresh
        dues = [d for d in (-max(scan.dues) if scan.dues else None, scan.fresh_due_ms) if d]
        # An old segment kept past ``upto`` (extended by new reads) has an unknown earliest
        # due: 0 rescans again soon, which finds it.
        self.next_due_ms = min(dues, default=0) if self.segments else None
        # The next rescan admits about ``sample`` messages: up to the last due time sampled.
        self._hint_ms = -scan.dues[0] if len(scan.dues) >= self._sample else 0

    def _merged(self, scan: _Rescan, pos: int) -> list[Segment]:
        """The segments as they stand with the rescan done up to ``pos``."""
        out: list[Segment] = []
        if scan.first is not None:
            out.append((scan.first, pos, scan.target_ms))
        for start, end, horizon in self.segments:
            if end > pos:
                out.append((max(start, pos), end, horizon))
        return out

    # -- persistence and operator actions ------------------------------------------------------
    def persisted(self) -> tuple[Segment, ...]:
        """The segments to persist (a rescan under way counts up to its position)."""
        if self.scan is None:
            return tuple(self.segments)
        return tuple(self._merged(self.scan, self.scan.pos))

    def first_offset(self) -> int | None:
        """The lowest offset that may hold a released message, or None."""
        persisted = self.persisted()
        return persisted[0][0] if persisted else None

    def reset(self) -> None:
        """A seek: nothing below the new position is released any more."""
        self.segments = []
        self.scan = None
        self.next_due_ms = None
        self.released = 0

    def skip_to(self, offset: int) -> None:
        """Retention deleted everything below ``offset``."""
        self.segments = [(max(s, offset), e, h) for s, e, h in self.segments if e > offset]
        if self.scan is not None:
            scan = self.scan
            if scan.first is not None and scan.first < offset:
                scan.first = offset if scan.pos > offset else None
            scan.pos = max(scan.pos, offset)
            scan.upto = max(scan.upto, offset)
