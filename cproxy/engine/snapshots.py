# cproxy: compiled (mypyc), see cproxy/_native.py
"""Views the engine hands out: what callers may read, never a live container. Frozen, but for
``Handout``, one per delivered message, which is read-only by convention (its ``__init__``
written out: the record idiom of ``cproxy/_native.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from cproxy.model import MessageRef, Record


@dataclass(slots=True, unsafe_hash=True)
class Handout:
    """One hand-out of a stored message to a consumer (the SDK's ``Delivery`` is the
    consumer's own record of one): ``attempt`` numbers its deliveries (1 for the
    first delivery of a fresh message; every hand-out gets the next number, never reused),
    ``charged`` counts those that failed or timed out (what ``max_attempts`` counts).
    Treat it as read-only.

    ``run`` is the position, in the same pull's answer, of the first message of the
    same-key run this message belongs to (its own position when it is not in a run).
    """

    message: Record
    attempt: int
    run: int = 0
    #: The body to deliver (JSON) when the group transforms it; None: the stored body.
    body_json: bytes | None = None
    #: Charged deliveries before this one (fails and ack timeouts since the last fresh
    #: budget).
    charged: int = 0
    #: Delivered again by a replay of its order value (it was finished before).
    replay: bool = False

    # Written out, and not frozen, as ``Record.__init__`` (the record idiom of the compiled
    # core, ``cproxy/_native.py``): one is built per delivered message.
    def __init__(
        self,
        message: Record,
        attempt: int,
        run: int = 0,
        body_json: bytes | None = None,
        charged: int = 0,
        replay: bool = False,
    ) -> None:
        self.message = message
        self.attempt = attempt
        self.run = run
        self.body_json = body_json
        self.charged = charged
        self.replay = replay


class Outcome(NamedTuple):
    """What a batch of results (acks, fails, extends) did."""

    #: Results that changed an in-flight message.
    applied: int
    #: Results for messages not in flight (finished, timed out and redelivered, never
    #: delivered): they changed nothing.
    unknown: list[MessageRef]


@dataclass(frozen=True, slots=True)
class QueuePosition:
    """Where a group stands on one queue: ``lag = next_offset - committed_offset``."""

    topic: str
    qid: int
    committed_offset: int
    next_offset: int
    lag: int
    #: The next offset the group reads from the store (above it nothing is held yet).
    fetch_offset: int
    #: Unfinished messages not counting those behind a blocked or parked head.
    lag_excluding_parked: int
    #: Messages retention deleted before this group read them.
    lost_to_retention: int


@dataclass(frozen=True, slots=True)
class TopicCounts:
    """Per-topic gauges (ready, in flight, lag) and monotonic counters since start."""

    topic: str
    ready: int
    in_flight: int
    lag: int
    delivered: int
    acked: int
    failed: int
    timed_out: int
    retried: int
    dead_lettered: int
    lost_to_retention: int
    #: Messages the group's filter finished without delivery.
    filtered: int


@dataclass(frozen=True, slots=True)
class GroupStats:
    """Counts of one group's held messages, by state, and its positions."""

    queues: tuple[QueuePosition, ...]
    topics: tuple[TopicCounts, ...]
    #: Unfinished messages, not counting those behind a blocked or parked chain head.
    lag_excluding_parked: int
    #: Messages retention deleted before the group read them (since the group started).
    lost_to_retention: int
    #: Messages the group's filter finished without delivery (since the group started).
    filtered: int
    ready: int
    in_flight: int
    waiting: int
    retrying: int
    exhausted: int
    #: Messages held in memory in any state: bounded by ``max_buffered``.
    buffered: int
    #: Stuck order values: the head waits for its retry, is exhausted, or has been in flight
    #: past ``stuck_after_ms``; and exhausted unordered messages.
    blocked_keys: int
    parked_keys: int
    #: Dead letters decided but not yet persisted (the next commit writes them).
    pending_dead_letters: int
    #: Delayed messages not due yet: held in memory, heading a sleeping chain (one per
    #: key), or released from memory (unordered; exact after each rescan).
    delayed: int = 0
    #: Messages a replay of an order value still has to deliver (held in memory).
    replaying: int = 0
    #: Order values whose head is in flight and not stuck yet (being handled).
    in_flight_keys: int = 0


@dataclass(frozen=True, slots=True)
class BlockedKey:
    """A stuck order value: its head waits for a retry, is exhausted, or has been in flight
    past the group's ``stuck_after_ms``."""

    topic: str
    #: None for an unordered message that is exhausted.
    order_value: str | None
    qid: int
    #: The head's offset.
    offset: int
    #: "in_flight", "retrying" or "exhausted".
    state: str
    #: Charged deliveries (fails and ack timeouts), what ``max_attempts`` counts.
    attempts: int
    last_error: str | None
    #: When the head was first handed out (ms since the epoch).
    blocked_since_ms: int
    #: Messages of this order value waiting in memory behind the head.
    waiting: int
    #: True when later messages of this order value were released from memory.
    parked: bool
    #: The head's stored body (JSON).
    body_json: bytes
