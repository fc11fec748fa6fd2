# cproxy: compiled (mypyc), see cproxy/_native.py
"""Plain records the group engine takes and hands back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cproxy.model import DeadLetter, MessageRef, QueueProgress, QueueRef


@dataclass(slots=True)
class Result:
    """Acks and fails for messages of one queue; a fail may carry the handler's error.
    Treat it as read-only.

    ``attempts`` fences results (offset -> the delivery attempt the result answers): a
    result naming an attempt that is no longer the current delivery of its message is
    unknown and changes nothing. Offsets not named there are unfenced: they answer whatever
    delivery is current.
    """

    topic: str
    qid: int
    acks: Sequence[int] = ()
    fails: Sequence[tuple[int, str | None]] = ()
    attempts: Mapping[int, int] | None = None

    # Written out, and not frozen, for the reason of ``Record.__init__``: the ``__init__``
    # ``dataclass`` generates is interpreted Python, and a frozen one sets each field through
    # ``object.__setattr__`` (~650 ns per Result; every pull with acks builds one per queue).
    def __init__(
        self,
        topic: str,
        qid: int,
        acks: Sequence[int] = (),
        fails: Sequence[tuple[int, str | None]] = (),
        attempts: Mapping[int, int] | None = None,
    ) -> None:
        self.topic = topic
        self.qid = qid
        self.acks = acks
        self.fails = fails
        self.attempts = attempts


@dataclass(slots=True)
class Counters:
    """Monotonic per-topic counters, exported as Prometheus counters."""

    delivered: int = 0
    acked: int = 0
    failed: int = 0
    timed_out: int = 0
    retried: int = 0
    dead_lettered: int = 0
    lost_to_retention: int = 0
    filtered: int = 0


@dataclass(slots=True)
class CommitBatch:
    """What the driver must persist in one transaction (``Store.commit``)."""

    progress: dict[QueueRef, QueueProgress] = field(default_factory=dict)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    redrive_done: list[MessageRef] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.progress or self.dead_letters or self.redrive_done)
