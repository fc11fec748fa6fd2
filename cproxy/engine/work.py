# cproxy: compiled (mypyc), see cproxy/_native.py
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
    IN_FLIGHT -sent back uncharged (run tail, give-back, push transport error)-> WAITING/READY
    IN_FLIGHT -out of attempts, on_exhausted "block"-> EXHAUSTED -skip/release-> OUT/READY
    any held state -parked or dropped by a seek-> OUT

``OUT`` means "not held": not admitted yet, finished (acked or dead-lettered), or dropped from
memory (parked, or discarded by a seek). References to an ``OUT`` entry that linger in a heap
or a ready deque are stale and skipped.

A ``Chain`` (the in-memory messages of one order value) lives here too: an entry knows its
chain and a chain holds its entries, so the two types belong to one module. The ``Sequencer``
(``cproxy.engine.sequencer``) owns chains; read them only outside it.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Collection
from typing import Final

from mypy_extensions import mypyc_attr

from cproxy.model import MessageRef, Record

#: Delivery numbers a group reserves ahead in the store (``QueueProgress.attempt_ceiling``):
#: every number it hands out stays at or below the persisted ceiling, so after a restart or a
#: change of owner numbering resumes above it and a late result from before cannot match a
#: delivery after. When half the reserve is used the engine asks for a commit at once
#: (``GroupEngine.needs_reserve``), which moves the ceiling up; only a message handed out more
#: than half this many times before that commit is written could pass it
#: (docs/guarantees.md, fenced deliveries).
ATTEMPT_RESERVE: Final = 1000


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


# The states as ``Final`` names, the one way engine code names a state in hot code
# (``cproxy/_native.py``). Interpreted, ``State.READY`` is a class attribute lookup, ~0.11 µs
# more per comparison than a module global (five times the cost of the check); compiled, a
# ``Final`` read from another compiled module is a C static, as fast as a local alias.
OUT: Final = State.OUT
WAITING: Final = State.WAITING
READY: Final = State.READY
IN_FLIGHT: Final = State.IN_FLIGHT
RETRYING: Final = State.RETRYING
EXHAUSTED: Final = State.EXHAUSTED
DELAYED: Final = State.DELAYED

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
        "charged",
        "consumer",
        "deadline_ms",
        "due_ms",
        "last_error",
        "message",
        "redriven",
        "replay",
        "state",
    )

    def __init__(self, message: Record, chain: Chain | None = None, redriven: bool = False) -> None:
        self.message = message
        #: The chain of the entry's order value; None for unordered messages.
        self.chain = chain
        #: The delivery number (fencing token) of the latest hand-out; the next hand-out is
        #: ``attempt + 1``, whatever ended the last one, so a number is never reused. Above 0
        #: before the first hand-out when the message may have been delivered before this
        #: entry was made (read again after a restart, a seek, a park or a redrive).
        self.attempt = 0
        #: Charged deliveries (fails and ack timeouts) since the last fresh budget (redrive,
        #: release): what ``max_attempts``, the backoff and a dead letter's ``attempts`` count.
        self.charged = 0
        self.state = State.OUT
        #: Ack deadline of the current delivery (ms since the epoch, the driver's clock).
        self.deadline_ms = 0
        #: When a retrying or delayed entry becomes ready (ms).
        self.due_ms = 0
        self.last_error: str | None = None
        #: Redriven dead letters and replayed messages are outside offset tracking (they
        #: were finished already).
        self.redriven = redriven
        #: A finished message delivered again by a replay of its order value (delivered
        #: with ``"replay": true``).
        self.replay = False
        #: When the first delivery of this entry was handed out (ms); -1: not yet.
        self.blocked_since_ms = -1
        #: The body to deliver when the group transforms it (JSON); None: the stored body.
        self.body_json: bytes | None = None
        #: Who the current (or last) delivery went to: the pull's consumer id; None: a push.
        self.consumer: str | None = None


def pop_queues(by_ref: dict[MessageRef, Entry], topic: str, qids: Collection[int]) -> list[Entry]:
    """Remove the entries of those queues from ``by_ref`` (a seek); return the unordered ones
    (no chain holds them, so the caller drops them itself)."""
    dropped: list[Entry] = []
    for ref in [r for r in by_ref if r[0] == topic and r[1] in qids]:
        entry = by_ref.pop(ref)
        if entry.chain is None:
            dropped.append(entry)
    return dropped


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


class _TopicTally:
    """One topic's entries: how many are in each held state, and the offsets held per queue.

    A native class with a field per state rather than a list indexed by ``State``: compiled,
    ``counts[state] += 1`` is three generic calls and a boxed int per update, a field update
    is one machine add (``move`` runs 3-4 times per message)."""

    __slots__ = ("delayed", "exhausted", "in_flight", "offsets", "ready", "retrying", "waiting")

    def __init__(self) -> None:
        self.waiting = 0
        self.ready = 0
        self.in_flight = 0
        self.retrying = 0
        self.exhausted = 0
        self.delayed = 0
        #: Offsets held per queue (redriven dead letters excepted: their offsets are
        #: committed already): the committed offset is never above the lowest of them.
        self.offsets: dict[int, set[int]] = {}

    def add(self, state: State, delta: int) -> int:
        """Count ``delta`` more entries in ``state``; the count after (``OUT`` is not
        counted: 0)."""
        if state is READY:
            self.ready += delta
            return self.ready
        if state is IN_FLIGHT:
            self.in_flight += delta
            return self.in_flight
        if state is WAITING:
            self.waiting += delta
            return self.waiting
        if state is RETRYING:
            self.retrying += delta
            return self.retrying
        if state is DELAYED:
            self.delayed += delta
            return self.delayed
        if state is EXHAUSTED:
            self.exhausted += delta
            return self.exhausted
        return 0

    def get(self, state: State) -> int:
        """Entries in ``state`` (0 for ``OUT``: not held is not counted)."""
        return self.add(state, 0)

    def held(self, qid: int) -> set[int]:
        offsets = self.offsets.get(qid)
        if offsets is None:
            offsets = self.offsets[qid] = set()
        return offsets


class Tally:
    """Per-topic counts of entries by state; ``move`` is the only way to change a state."""

    __slots__ = ("_topics", "held")

    def __init__(self, topics: list[str]) -> None:
        self._topics: dict[str, _TopicTally] = {topic: _TopicTally() for topic in topics}
        #: Entries held in memory in any state: what ``max_buffered`` bounds. Read on every
        #: admitted message, so it is kept here rather than summed.
        self.held = 0

    def move(self, entry: Entry, state: State) -> None:
        # The hottest function of the engine (3-4 calls per message): kept lean on purpose.
        old = entry.state
        if old is state:
            return
        entry.state = state
        message = entry.message
        tally = self._topics[message.topic]
        if old is OUT:
            tally.add(state, 1)
            self.held += 1
            if not entry.redriven:
                tally.held(message.qid).add(message.offset)
        elif state is OUT:
            tally.add(old, -1)
            self.held -= 1
            if not entry.redriven:
                tally.held(message.qid).discard(message.offset)
        else:
            tally.add(old, -1)
            tally.add(state, 1)

    def held_offsets(self, topic: str, qid: int) -> set[int]:
        """Offsets of the queue held in memory (do not modify)."""
        return self._topics[topic].held(qid)

    def count(self, state: State, topic: str | None = None) -> int:
        """Entries in ``state``, of ``topic`` or of all topics (0 for ``OUT``)."""
        if topic is not None:
            return self._topics[topic].get(state)
        return sum(t.get(state) for t in self._topics.values())
