"""One message held in memory by one group, and the single place its state changes.

An ``Entry`` is the engine's work container (parallel-consumer's ``WorkContainer``): a stored
message plus its delivery state. Its ``state`` is changed only by ``Tally.move``, which keeps
the per-topic count of entries in every state; every count the engine reports (buffered,
ready, in flight, waiting, retrying, exhausted) derives from those counts, so no caller keeps a
counter by hand.

States, and who moves an entry between them::

    OUT -admit-> READY (heads its chain) or WAITING -head finished-> READY
    OUT/WAITING -becomes head, ``deliver_at_ms`` still ahead-> DELAYED -due-> READY
    READY -pull-> IN_FLIGHT -ack or dead letter-> OUT
    IN_FLIGHT -fail or timeout-> RETRYING -due-> READY
    IN_FLIGHT -out of attempts, on_exhausted "block"-> EXHAUSTED -skip/release-> OUT/READY
    any held state -parked or dropped by a seek-> OUT

``OUT`` means "not held": not admitted yet, finished (acked or dead-lettered), or dropped from
memory (parked, or discarded by a seek). References to an ``OUT`` entry that linger in a heap
or a ready deque are stale and skipped.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from typing import TYPE_CHECKING, Final

from cproxy.model import Message

if TYPE_CHECKING:
    from cproxy.engine.chains import Chain


class State(enum.IntEnum):
    WAITING = 0
    READY = 1
    IN_FLIGHT = 2
    RETRYING = 3
    #: Out of attempts with ``on_exhausted = "block"``: waits for an operator.
    EXHAUSTED = 4
    #: Heads its chain (or is unordered) but its ``deliver_at_ms`` has not come yet.
    DELAYED = 5
    #: Not held in memory (see the module docstring).
    OUT = 6


_OUT: Final = State.OUT

#: Every state an entry held in memory can be in: what ``max_buffered`` bounds.
HELD = (
    State.WAITING,
    State.READY,
    State.IN_FLIGHT,
    State.RETRYING,
    State.EXHAUSTED,
    State.DELAYED,
)


class Entry:
    """One message held in memory by one group. Read its fields; never assign ``state``."""

    __slots__ = (
        "attempt",
        "blocked_since_ms",
        "body_json",
        "chain",
        "deadline_ms",
        "due_ms",
        "last_error",
        "message",
        "redriven",
        "state",
    )

    def __init__(
        self, message: Message, chain: Chain | None = None, redriven: bool = False
    ) -> None:
        self.message = message
        #: The chain of the entry's order value; None for unordered messages.
        self.chain = chain
        #: Deliveries so far; the next delivery is attempt ``attempt + 1``.
        self.attempt = 0
        self.state = State.OUT
        #: Ack deadline of the current delivery (ms since the epoch, the driver's clock).
        self.deadline_ms = 0
        #: When a retrying or delayed entry becomes ready (ms).
        self.due_ms = 0
        self.last_error: str | None = None
        #: Redriven dead letters are outside offset tracking (their offset is committed).
        self.redriven = redriven
        #: When the first delivery of this entry was handed out (ms).
        self.blocked_since_ms = 0
        #: The body to deliver when the group transforms it (JSON); None: the stored body.
        self.body_json: bytes | None = None


class Tally:
    """Per-topic counts of entries by state; ``move`` is the only way to change a state."""

    __slots__ = ("_counts", "_offsets", "held")

    def __init__(self, topics: list[str]) -> None:
        self._counts: dict[str, list[int]] = {topic: [0] * len(State) for topic in topics}
        #: Entries held in memory in any state: what ``max_buffered`` bounds. Read on every
        #: admitted message, so it is kept here rather than summed.
        self.held = 0
        #: Offsets held per queue (redriven dead letters excepted: their offsets are
        #: committed already): the committed offset is never above the lowest of them.
        self._offsets: dict[str, defaultdict[int, set[int]]] = {
            topic: defaultdict(set) for topic in topics
        }

    def move(self, entry: Entry, state: State) -> None:
        # The hottest function of the engine (3-4 calls per message): kept lean on purpose.
        old = entry.state
        if old is state:
            return
        entry.state = state
        message = entry.message
        counts = self._counts[message.topic]
        counts[old] -= 1
        counts[state] += 1
        if old is _OUT:
            self.held += 1
            if not entry.redriven:
                self._offsets[message.topic][message.qid].add(message.offset)
        elif state is _OUT:
            self.held -= 1
            if not entry.redriven:
                self._offsets[message.topic][message.qid].discard(message.offset)

    def held_offsets(self, topic: str, qid: int) -> set[int]:
        """Offsets of the queue held in memory (do not modify)."""
        return self._offsets[topic][qid]

    def count(self, state: State, topic: str | None = None) -> int:
        if topic is not None:
            return self._counts[topic][state]
        return sum(counts[state] for counts in self._counts.values())
