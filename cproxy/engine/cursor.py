# cproxy: compiled (mypyc), see cproxy/_native.py
"""Per-queue state of one group (where reading stands) and the reads the engine plans."""

from __future__ import annotations

from dataclasses import dataclass

from cproxy.engine.delays import DelayWindow
from cproxy.engine.offsets import OffsetTracker
from cproxy.engine.work import Entry
from cproxy.model import QueueProgress


class QueueCursor:
    """One (topic, qid) as seen by one group: where reading stands.

    ``fetch_offset`` is the next offset to read from the store; ``end_offset`` the store's
    next offset as last heard. Below ``fetch_offset`` a message is finished, held in memory,
    or parked (its chain remembers it): so the committed offset (the lowest unfinished) is
    derived from those, not kept here. ``epoch`` changes on seek so that reads planned before
    the seek are recognised as stale when they complete.

    After a restart, ``restore`` lists ranges that were held in memory when progress was
    committed: they are read back whole before anything new of this queue is admitted, so
    order within a chain holds. ``legacy`` answers "finished?" for progress written in the
    older range form.

    Messages below ``reread_until`` may have been handed out before they were read this time
    (before a restart, by a former owner, before a seek back): their delivery numbers start
    above ``reread_base``, which is at least every number handed out for them before.
    """

    __slots__ = (
        "delays",
        "end_offset",
        "epoch",
        "fetch_offset",
        "legacy",
        "lost",
        "qid",
        "reread_base",
        "reread_until",
        "restore",
        "scan",
        "scan_from",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        qid: int,
        progress: QueueProgress,
        end_offset: int,
        sample: int = 1000,
        reread_base: int = 0,
    ) -> None:
        """``sample``: how many released delayed messages a rescan aims to admit;
        ``reread_base``: the delivery numbers that may have been handed out before for the
        messages stored now (below ``end_offset``)."""
        self.topic = topic
        self.qid = qid
        self.end_offset = end_offset
        self.reread_base = reread_base
        self.reread_until = end_offset if reread_base else 0
        self.epoch = 0
        #: Messages this group never got because retention deleted them first.
        self.lost = 0
        self.legacy: OffsetTracker | None = None
        self.restore: list[tuple[int, int]] = []
        #: After a restart: order value -> its first unfinished offset in this queue, for the
        #: chains that were stuck (parked, or waiting behind a blocked head). One scan from
        #: ``scan_from`` up to ``fetch_offset`` reads them all back, after ``restore``.
        self.scan: dict[str, int] = {}
        self.scan_from = 0
        #: Unordered delayed messages released from memory (``cproxy.engine.delays``).
        self.delays = DelayWindow(progress.delayed, sample)
        if progress.read_to is None and progress.finished:
            self.legacy = OffsetTracker(progress.committed, progress.finished)
            self.fetch_offset = self.legacy.base
        elif progress.read_to is None:
            # No finished ranges (a new group's start offset): nothing at or above
            # ``committed`` is finished, so no tracker needs asking on every message read.
            self.fetch_offset = progress.committed
        else:
            self.fetch_offset = max(progress.read_to, progress.committed)
            self.restore = [(s, e) for s, e in progress.open if e > s]
            self.scan = dict(progress.parked)
            self.scan_from = min(self.scan.values(), default=self.fetch_offset)

    def is_finished(self, offset: int) -> bool:
        """Finished before a restart (only progress in the range form says so)."""
        return self.legacy is not None and self.legacy.is_finished(offset)

    def reset(self, offset: int, reread_base: int) -> None:
        """Restart at ``offset`` (a seek): everything held before is forgotten; what was
        read before may have been handed out with numbers up to ``reread_base``."""
        self.reread_until = max(self.reread_until, self.fetch_offset)
        self.reread_base = max(self.reread_base, reread_base)
        self.legacy = None
        self.restore = []
        self.scan = {}
        self.delays.reset()
        self.fetch_offset = offset
        self.epoch += 1

    def renumber(self, entry: Entry, floor: int = 0) -> None:
        """``entry`` was read again: its next delivery number is above every one it may have
        had before (``reread_base`` below ``reread_until``; ``floor``: its chain's)."""
        base = self.reread_base if entry.message.offset < self.reread_until else 0
        base = max(base, floor)
        entry.attempt = max(entry.attempt, base)

    @property
    def catching_up(self) -> bool:
        """Reading back what was held before a restart: nothing new is admitted meanwhile."""
        return bool(self.restore) or bool(self.scan)

    def scan_pairs(self) -> list[tuple[str, int]]:
        """(order value, first unread offset) of the chains the scan has still to read."""
        return [(v, max(first, self.scan_from)) for v, first in self.scan.items()]

    def skip_to(self, offset: int) -> int:
        """Retention deleted everything below ``offset``: skip unread messages there.

        Returns how many messages this group lost (unread ones not finished before).
        """
        lost = 0
        kept: list[tuple[int, int]] = []
        for start, end in self.restore:
            lost += max(0, min(end, offset) - start)
            if end > offset:
                kept.append((max(start, offset), end))
        self.restore = kept
        if self.fetch_offset < offset:
            gap = offset - self.fetch_offset
            if self.legacy is not None:
                gap -= self.legacy.count_finished(self.fetch_offset, offset)
            lost += gap
            self.fetch_offset = offset
        if self.scan:
            self.scan_from = max(self.scan_from, offset)
        self.delays.skip_to(offset)
        self.end_offset = max(self.end_offset, self.fetch_offset)
        self.lost += lost
        return lost


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """A read the driver makes from the store and hands back unchanged: at most
    ``max_count`` messages from ``from_offset`` on, in offset order.

    A *reload* (``chain_value`` set) reads part of ``[from_offset, upto)`` for one parked
    chain; the engine keeps that chain's messages and plans the rest of the range itself.
    """

    topic: str
    qid: int
    from_offset: int
    max_count: int
    epoch: int
    chain_value: str | None = None
    upto: int = 0
    #: Reads back a range that was held in memory before a restart (see ``QueueCursor``).
    restore: bool = False
    #: Scans for the stuck chains of before a restart (see ``QueueCursor.scan``).
    scan: bool = False
    #: Rescans released unordered delayed messages (see ``cproxy.engine.delays``).
    delayed: bool = False

    @property
    def is_reload(self) -> bool:
        return self.chain_value is not None
