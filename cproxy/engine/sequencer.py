"""Per-order-value chains and the ready queues (DDMQ's UpstreamJobBlockingQueue).

A *chain* holds the messages of one order value that are in memory: the *head* (the one
message that may be ready, in flight, retrying or exhausted) and the messages *waiting* behind
it in arrival order. Only the head is ever handed out, which is what keeps per-key order; a
message with no order value joins no chain and is ready at once.

When the head finishes, the next waiting message goes to the *reactivation* queue, which pulls
drain before the *fresh* queue of new work: a key that was already in progress keeps moving
ahead of keys not yet started, like DDMQ's reactivation queue.

*Parking* bounds memory without head-of-line blocking (guarantees.md §7): when stuck keys fill the
buffer with waiting messages, those messages are dropped from memory and the chain remembers,
per queue, the earliest offset it dropped. Messages of a parked chain that arrive later are
dropped too. When the chain runs dry it asks to be *reloaded* from the store from that offset.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterator

from cproxy.model import Message


class State(enum.IntEnum):
    WAITING = 0
    READY = 1
    IN_FLIGHT = 2
    RETRYING = 3
    #: Out of attempts with ``on_exhausted = "block"``: waits for an operator.
    EXHAUSTED = 4
    #: Acked, dead-lettered or dropped (seek); stale references to it are ignored.
    DONE = 5


class Entry:
    """One message held in memory by one group."""

    __slots__ = (
        "attempt",
        "blocked_since_ms",
        "chain",
        "deadline_ms",
        "due_ms",
        "last_error",
        "message",
        "redriven",
        "state",
    )

    def __init__(self, message: Message, chain: Chain | None, redriven: bool = False) -> None:
        self.message = message
        self.chain = chain
        #: Deliveries so far; the next delivery is attempt ``attempt + 1``.
        self.attempt = 0
        self.state = State.WAITING
        self.deadline_ms = 0
        self.due_ms = 0
        self.last_error: str | None = None
        #: Redriven dead letters are outside offset tracking (their offset is committed).
        self.redriven = redriven
        self.blocked_since_ms = 0


class Chain:
    """The in-memory messages of one (topic, order value)."""

    __slots__ = ("head", "parked", "reloading", "topic", "value", "waiting")

    def __init__(self, topic: str, value: str) -> None:
        self.topic = topic
        self.value = value
        self.head: Entry | None = None
        self.waiting: deque[Entry] = deque()
        #: qid -> earliest offset dropped from memory and not yet reloaded.
        self.parked: dict[int, int] = {}
        #: Reloads in progress; while any runs, arrivals stay parked to keep offset order.
        self.reloading = 0

    @property
    def is_parked(self) -> bool:
        return bool(self.parked) or self.reloading > 0


class ReadyQueue:
    """Ready entries of one topic: reactivated chains first, then fresh work."""

    __slots__ = ("fresh", "reactivated", "size")

    def __init__(self) -> None:
        self.reactivated: deque[Entry] = deque()
        self.fresh: deque[Entry] = deque()
        self.size = 0

    def push(self, entry: Entry, *, reactivated: bool) -> None:
        entry.state = State.READY
        (self.reactivated if reactivated else self.fresh).append(entry)
        self.size += 1

    def pop(self) -> Entry | None:
        # Entries dropped by a seek stay in the deques as DONE; skip them lazily.
        for queue in (self.reactivated, self.fresh):
            while queue:
                entry = queue.popleft()
                if entry.state is State.READY:
                    self.size -= 1
                    return entry
        return None

    def discard(self, entry: Entry) -> None:
        """Account for a READY entry removed elsewhere (its state becomes DONE)."""
        entry.state = State.DONE
        self.size -= 1


class Sequencer:
    """Chains of one group, keyed by (topic, order value)."""

    __slots__ = ("chains", "waiting")

    def __init__(self) -> None:
        self.chains: dict[tuple[str, str], Chain] = {}
        #: Total entries waiting behind heads (in memory).
        self.waiting = 0

    def admit(self, entry: Entry, value: str | None) -> bool:
        """Add a newly read message; True when it became a head (ready to hand out).

        Returns False when it waits behind its chain's head. A parked chain does not take the
        entry at all: the caller must check ``parked_chain`` first and drop it.
        """
        if value is None:
            return True
        topic = entry.message.topic
        chain = self.chains.get((topic, value))
        if chain is None:
            chain = Chain(topic, value)
            self.chains[(topic, value)] = chain
        entry.chain = chain
        if chain.head is None:
            chain.head = entry
            return True
        chain.waiting.append(entry)
        self.waiting += 1
        return False

    def parked_chain(self, topic: str, value: str | None) -> Chain | None:
        if value is None:
            return None
        chain = self.chains.get((topic, value))
        return chain if chain is not None and chain.is_parked else None

    def advance(self, chain: Chain) -> Entry | None:
        """The head finished: promote the next waiting entry (None if there is none).

        A chain with nothing in memory and nothing parked is forgotten.
        """
        if chain.waiting:
            nxt = chain.waiting.popleft()
            self.waiting -= 1
            chain.head = nxt
            return nxt
        chain.head = None
        if not chain.is_parked:
            del self.chains[(chain.topic, chain.value)]
        return None

    def park(self, chain: Chain) -> list[Entry]:
        """Drop the waiting entries of ``chain`` from memory; returns them."""
        dropped = list(chain.waiting)
        chain.waiting.clear()
        self.waiting -= len(dropped)
        for entry in dropped:
            message = entry.message
            current = chain.parked.get(message.qid)
            if current is None or message.offset < current:
                chain.parked[message.qid] = message.offset
            entry.state = State.DONE
        return dropped

    def most_waiting(self) -> Iterator[Chain]:
        """Chains with waiting entries, most waiting first."""
        candidates = [c for c in self.chains.values() if c.waiting]
        candidates.sort(key=lambda c: len(c.waiting), reverse=True)
        return iter(candidates)

    def forget_if_idle(self, chain: Chain) -> None:
        if chain.head is None and not chain.waiting and not chain.is_parked:
            self.chains.pop((chain.topic, chain.value), None)
