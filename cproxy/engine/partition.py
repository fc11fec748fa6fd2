"""Per-queue state of one group: where reading stands and what is finished."""

from __future__ import annotations

from dataclasses import dataclass

from cproxy.engine.offsets import OffsetTracker
from cproxy.model import QueueProgress


class Partition:
    """One (topic, qid) as seen by one group.

    ``fetch_offset`` is the next offset to read from the store; ``end_offset`` the store's
    next offset as last heard. ``epoch`` changes on seek so that reads planned before the seek
    are recognised as stale when they complete.
    """

    __slots__ = ("end_offset", "epoch", "fetch_offset", "qid", "topic", "tracker")

    def __init__(self, topic: str, qid: int, progress: QueueProgress, end_offset: int) -> None:
        self.topic = topic
        self.qid = qid
        self.tracker = OffsetTracker(progress.committed, progress.finished)
        self.fetch_offset = self.tracker.base
        self.end_offset = end_offset
        self.epoch = 0

    @property
    def lag(self) -> int:
        return max(0, self.end_offset - self.tracker.base)

    def progress(self) -> QueueProgress:
        return QueueProgress(self.tracker.base, self.tracker.ranges())

    def reset(self, offset: int) -> None:
        self.tracker.reset(offset)
        self.fetch_offset = offset
        self.epoch += 1


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

    @property
    def is_reload(self) -> bool:
        return self.chain_value is not None
