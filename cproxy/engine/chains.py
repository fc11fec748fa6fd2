# cproxy: compiled (mypyc), see cproxy/_native.py
"""A chain's containers (``Chain``) and a topic's ready queues (``ReadyQueue``): the state the
``Sequencer`` owns (``cproxy.engine.sequencer``, whose docstring tells how chains work). Read
only outside the sequencer."""

from __future__ import annotations

from collections import deque
from typing import Final

from mypy_extensions import mypyc_attr

from cproxy.engine.work import READY, Entry


# Subclasses of built-in containers stay ordinary Python classes when mypyc compiles the
# engine (``cproxy/_native.py``): native classes cannot extend ``deque`` or ``dict``.
@mypyc_attr(native_class=False)
class _NoEntries(deque[Entry]):
    """The shared, always empty ``run``/``waiting`` of chains that hold nothing there: an
    empty deque costs ~600 B, which a parked or sleeping key should not pay. Writing to it
    is a bug (the sequencer gives a chain its own deque first)."""

    def append(self, entry: Entry, /) -> None:
        raise AssertionError("a chain's shared empty deque was written to")

    def appendleft(self, entry: Entry, /) -> None:
        raise AssertionError("a chain's shared empty deque was written to")


NO_ENTRIES: Final = _NoEntries()


@mypyc_attr(native_class=False)
class _NoOffsets(dict[int, int]):
    """The shared, always empty ``parked``/``reloading`` of chains with nothing parked (nearly
    all of them): a chain is created per key coming into memory, and two empty dicts each
    time cost allocations for nothing. Writing to it is a bug (``note_parked`` and
    ``start_reload`` give the chain its own dict first)."""

    def __setitem__(self, key: int, value: int, /) -> None:
        raise AssertionError("a chain's shared empty offsets were written to")


NO_OFFSETS: Final = _NoOffsets()


class Chain:
    """The in-memory messages of one (topic, order value). Read-only outside the sequencer."""

    __slots__ = (
        "attempt_floor",
        "head",
        "parked",
        "reloading",
        "run",
        "topic",
        "value",
        "waiting",
        "wake_ms",
    )

    def __init__(self, topic: str, value: str) -> None:
        self.topic = topic
        self.value = value
        self.head: Entry | None = None
        #: Messages handed out together with the head (a same-key run), in offset order.
        self.run: deque[Entry] = NO_ENTRIES
        self.waiting: deque[Entry] = NO_ENTRIES
        #: qid -> earliest offset dropped from memory and not yet reloaded.
        self.parked: dict[int, int] = NO_OFFSETS
        #: qid -> where a reload under way started; while one runs, arrivals stay parked to
        #: keep offset order.
        self.reloading: dict[int, int] = NO_OFFSETS
        #: Set while the chain sleeps (its delayed head released too): when to reload it (ms).
        self.wake_ms: int | None = None
        #: The highest delivery number of the messages released from memory (parked): what
        #: they are numbered above when read back.
        self.attempt_floor = 0

    @property
    def is_parked(self) -> bool:
        return bool(self.parked) or bool(self.reloading)

    def lowest_unread(self, qid: int) -> int | None:
        """The lowest offset of this chain in queue ``qid`` that is not in memory, if any."""
        offsets = [o for o in (self.parked.get(qid), self.reloading.get(qid)) if o is not None]
        return min(offsets) if offsets else None

    def note_parked(self, qid: int, offset: int) -> None:
        """Remember that ``offset`` of queue ``qid`` was dropped and must be reloaded."""
        current = self.parked.get(qid)
        if current is None or offset < current:
            if self.parked is NO_OFFSETS:
                self.parked = {}
            self.parked[qid] = offset

    def start_reload(self, qid: int) -> None:
        """A reload of queue ``qid`` is planned: its parked offset is now being read back."""
        start = self.parked.pop(qid)
        if self.reloading is NO_OFFSETS:
            self.reloading = {}
        self.reloading[qid] = start


class ReadyQueue:
    """Ready entries of one topic: reactivated chains first, then fresh work."""

    __slots__ = ("fresh", "reactivated")

    def __init__(self) -> None:
        self.reactivated: deque[Entry] = deque()
        self.fresh: deque[Entry] = deque()

    def pop(self) -> Entry | None:
        # Entries that left READY elsewhere (seek) stay in the deques; skip them lazily.
        for queue in (self.reactivated, self.fresh):
            while queue:
                entry = queue.popleft()
                if entry.state is READY:
                    return entry
        return None
