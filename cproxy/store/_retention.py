"""Retention rules shared by every store: what a message weighs and where a queue is cut.

A topic may bound how long (``retention_ms``) and how much (``retention_bytes``, per queue) it
keeps. ``apply_retention`` of each store asks ``cut`` for the lowest offset to keep on each
queue, deletes everything below it, and the queue's ``min_offset`` becomes that offset.

``retention_bytes`` counts stored message bytes: body + headers + key + id (UTF-8), the same
size the produce call checks against ``max_message_bytes``. Summing a whole queue on every run
would read the whole log, so ``ByteCounter`` keeps a running total per queue and only reads what
changed since the last run: the messages appended since (to add them) and the messages cut
(to subtract them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from cproxy.errors import InvalidRequest

#: Offsets read per size query while counting: bounds one query's result.
SIZE_SCAN_BATCH = 5000

#: ``sizes(lo, hi)``: (offset, bytes) of the stored messages with ``lo <= offset < hi``.
Sizes = Callable[[int, int], Awaitable[list[tuple[int, int]]]]


def message_bytes(body: bytes, headers: bytes | None, key: str | None, msg_id: str | None) -> int:
    """The bytes one stored message counts for ``retention_bytes``."""
    size = len(body) + len(headers or b"")
    size += len(key.encode()) if key is not None else 0
    size += len(msg_id.encode()) if msg_id is not None else 0
    return size


def check_retention(retention_ms: int | None, retention_bytes: int | None) -> None:
    """``InvalidRequest`` unless each bound is None (unbounded) or a positive integer."""
    for name, value in (("retention_ms", retention_ms), ("retention_bytes", retention_bytes)):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            raise InvalidRequest(f"{name} must be a positive integer or null, got {value!r}")


@dataclasses.dataclass(slots=True)
class _Window:
    """Stored bytes of the offsets ``[floor, upto)`` of one queue."""

    floor: int
    upto: int
    total: int = 0


class ByteCounter:
    """Running totals of stored bytes per queue, for ``retention_bytes``.

    Keyed by any hashable queue id the store chooses. Only the store's retention pass uses it
    (one at a time), and offsets below ``floor`` never come back, so a total stays exact as
    long as the floor the store reports is the one it last cut at; if not (another process cut
    the queue, or the store restarted), the queue is counted again from its floor.
    """

    def __init__(self) -> None:
        self._queues: dict[object, _Window] = {}

    def forget(self, key: object) -> None:
        """Drop a queue's total (its topic was deleted or lost its byte bound)."""
        self._queues.pop(key, None)

    async def cut(self, key: object, floor: int, next_offset: int, bound: int, sizes: Sizes) -> int:
        """The lowest offset to keep so that ``[cut, next_offset)`` holds at most ``bound``
        bytes; ``floor`` if nothing needs to go."""
        w = self._queues.get(key)
        if w is None or w.floor != floor or w.upto > next_offset:
            w = _Window(floor, floor)
            self._queues[key] = w
        while w.upto < next_offset:
            hi = min(next_offset, w.upto + SIZE_SCAN_BATCH)
            w.total += sum(size for _, size in await sizes(w.upto, hi))
            w.upto = hi
        excess = w.total - bound
        at = floor
        while excess > 0 and at < w.upto:
            hi = min(w.upto, at + SIZE_SCAN_BATCH)
            rows = await sizes(at, hi)
            for off, size in rows:
                if excess <= 0:
                    break
                excess -= size
                at = off + 1
            if not rows:
                at = hi  # nothing stored there (offsets are contiguous, but never loop on it)
        return at

    async def advance(self, key: object, new_floor: int, sizes: Sizes) -> None:
        """The queue was cut at ``new_floor``: subtract the bytes of what was deleted.

        Call it with the sizes read *before* the delete, or right after ``cut`` (which reads
        only committed, still stored messages)."""
        w = self._queues.get(key)
        if w is None or new_floor <= w.floor:
            return
        if new_floor >= w.upto:
            self._queues[key] = _Window(new_floor, new_floor)
            return
        at = w.floor
        while at < new_floor:
            hi = min(new_floor, at + SIZE_SCAN_BATCH)
            w.total -= sum(size for _, size in await sizes(at, hi))
            at = hi
        w.floor = new_floor


async def queue_cut(
    counter: ByteCounter,
    key: object,
    floor: int,
    next_offset: int,
    bounds: tuple[int | None, int | None],
    now_ms: int,
    offset_for_time: Callable[[int], Awaitable[int]],
    sizes: Sizes,
) -> int:
    """The lowest offset a queue keeps under ``bounds`` (``(retention_ms,
    retention_bytes)``); ``floor`` when nothing needs to go. Keeps ``counter`` in step: the
    caller deletes below the returned offset."""
    retention_ms, retention_bytes = bounds
    cut = floor
    if retention_ms is not None:
        cut = await offset_for_time(now_ms - retention_ms)
    if retention_bytes is None:
        counter.forget(key)
    else:
        cut = max(cut, await counter.cut(key, floor, next_offset, retention_bytes, sizes))
        await counter.advance(key, cut, sizes)
    return cut
