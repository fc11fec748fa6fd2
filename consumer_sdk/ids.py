"""Message ids that are cheap for the server to deduplicate: UUIDv7 strings (RFC 9562).

A produce call whose messages all have an ``id`` is safe to retry: the server stores each id
once per topic within ``dedup_window_ms``. It keeps those ids in an index ordered by id, and
each commit writes every page of that index that one of its ids lands on. A random id (a
UUID4) lands on a page of its own, so a call of 100 random ids rewrites ~100 pages; ids that
grow with time all land at the end of the index, on the same few pages (docs/guarantees.md
§6 has the figures). A UUIDv7 starts with the time in milliseconds, and as a string it sorts
in time order, so its index pages are shared.

``new_message_id`` keeps the ids of one process strictly increasing: within one millisecond
its 12-bit ``rand_a`` field counts up (RFC 9562 §6.2, method 1), starting from a random value
below 2048; past 4,095 in one millisecond, or when the clock steps back, the ids carry on
from the last id's millisecond. The 62 bits of ``rand_b`` are random for every id, so ids of
different processes (or of a forked child) do not collide.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable

__all__ = ["IdGenerator", "new_message_id"]

_COUNTER_MAX = 0xFFF


def _clock_ms() -> int:
    return time.time_ns() // 1_000_000


class IdGenerator:
    """UUIDv7 strings, strictly increasing per generator; thread-safe. ``clock_ms``: the
    Unix time in milliseconds (tests give a fake one)."""

    def __init__(self, clock_ms: Callable[[], int] = _clock_ms) -> None:
        self._clock_ms = clock_ms
        self._lock = threading.Lock()
        self._ms = -1
        self._counter = 0

    def new(self) -> str:
        """A new id, greater (as a string too) than every id this generator gave before."""
        with self._lock:
            now = self._clock_ms()
            if now > self._ms:
                self._ms, self._counter = now, secrets.randbelow(0x800)
            elif self._counter < _COUNTER_MAX:
                self._counter += 1
            else:  # 4,096 ids in one millisecond: borrow the next one
                self._ms, self._counter = self._ms + 1, 0
            ms, counter = self._ms, self._counter
        value = (ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | counter << 64
        value |= 0b10 << 62 | secrets.randbits(62)
        digits = f"{value:032x}"
        return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


_default = IdGenerator()


def new_message_id() -> str:
    """A new message id for ``send``/``submit``/``Produce`` (``id=``): a UUIDv7 string,
    increasing within this process, which the server deduplicates at a fraction of the cost
    of a random one. Give each message its own id once, and reuse it only to retry that
    message."""
    return _default.new()
