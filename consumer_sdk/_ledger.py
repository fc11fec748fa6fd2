"""Book-keeping of a consumer: deliveries not yet finished, results not yet sent.

Handlers finish on worker threads (sync consumer) or tasks (async consumer) while the pull
loop runs on an event loop, so every method here is thread-safe behind one lock. Results are
kept per server because an ack only means something to the server that handed the message out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, fields

from consumer_sdk.models import Message, QueueResult

_MAX_ERROR_CHARS = 2_000


@dataclass(eq=False, slots=True)
class Delivery:
    """One message handed to this consumer; identity, not value, tells deliveries apart."""

    message: Message
    server: int
    #: ``time.monotonic()`` when the pull answered, and when its lease last started.
    received_at: float
    leased_at: float
    settled: bool = False
    #: its ack with outputs is being sent: the server holds it, an extend would be refused
    sending: bool = False


@dataclass(slots=True)
class _QueueOutcomes:
    acks: list[int] = field(default_factory=list)
    fails: list[tuple[int, str | None]] = field(default_factory=list)
    #: offset -> the attempt each result answers (every result is sent fenced)
    attempts: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """Counters since the consumer was created (a snapshot; never reset)."""

    pulls: int = 0
    pull_errors: int = 0
    received: int = 0
    acked: int = 0
    failed: int = 0
    #: results the server no longer knew (message timed out and was redelivered, or finished)
    unknown_results: int = 0
    extended: int = 0
    #: leases the server no longer knew when extending (the message had already timed out)
    leases_lost: int = 0
    outstanding: int = 0
    pending_results: int = 0


class Ledger:
    """Outstanding deliveries and pending results of one consumer."""

    def __init__(self, servers: int) -> None:
        self._lock = threading.Lock()
        self._outstanding: set[Delivery] = set()
        self._pending: list[dict[tuple[str, int], _QueueOutcomes]] = [{} for _ in range(servers)]
        self._pending_count = [0] * servers
        #: monotonic time the oldest pending result of each server was recorded
        self._pending_since: list[float | None] = [None] * servers
        #: some pending result of each server may let the server release a chain's next message
        self._urgent = [False] * servers
        self._counts: dict[str, int] = {f.name: 0 for f in fields(ConsumerStats)}

    def add_server(self) -> int:
        """Room for one more server; returns its index (servers are never removed)."""
        with self._lock:
            self._pending.append({})
            self._pending_count.append(0)
            self._pending_since.append(None)
            self._urgent.append(False)
            return len(self._pending) - 1

    @property
    def outstanding(self) -> int:
        return len(self._outstanding)

    def add(self, server: int, messages: Iterable[Message]) -> list[Delivery]:
        now = time.monotonic()
        deliveries = [Delivery(m, server, now, now) for m in messages]
        with self._lock:
            self._outstanding.update(deliveries)
            self._counts["received"] += len(deliveries)
        return deliveries

    def settle(self, delivery: Delivery, error: str | None, urgent: bool = True) -> bool:
        """Record an ack (``error is None``) or a fail; False if it was already settled.

        ``urgent``: the result may let the server release the next message of its chain (not
        so for an ack inside a same-key run whose later messages are still here).
        """
        with self._lock:
            if delivery.settled:
                return False
            delivery.settled = True
            self._outstanding.discard(delivery)
            msg = delivery.message
            server = delivery.server
            outcomes = self._pending[server].get((msg.topic, msg.qid))
            if outcomes is None:
                outcomes = self._pending[server][(msg.topic, msg.qid)] = _QueueOutcomes()
            outcomes.attempts[msg.offset] = msg.attempt
            if error is None:
                outcomes.acks.append(msg.offset)
                self._counts["acked"] += 1
            else:
                outcomes.fails.append((msg.offset, error[:_MAX_ERROR_CHARS]))
                self._counts["failed"] += 1
            self._pending_count[server] += 1
            self._urgent[server] = self._urgent[server] or urgent
            if self._pending_since[server] is None:
                self._pending_since[server] = time.monotonic()
            return True

    def drop(self, deliveries: Iterable[Delivery]) -> None:
        """Forget deliveries the server took back (the rest of a failed run): no result."""
        with self._lock:
            for d in deliveries:
                if not d.settled:
                    d.settled = True
                    self._outstanding.discard(d)

    def unsettled(self) -> list[Delivery]:
        with self._lock:
            return list(self._outstanding)

    def take_results(self, server: int) -> list[QueueResult]:
        """Remove and return the pending results of ``server`` (to send them)."""
        with self._lock:
            pending = self._pending[server]
            if not pending:
                return []
            self._pending[server] = {}
            self._pending_count[server] = 0
            self._pending_since[server] = None
            self._urgent[server] = False
        return [
            QueueResult(topic, qid, tuple(o.acks), tuple(o.fails), tuple(o.attempts.items()))
            for (topic, qid), o in pending.items()
        ]

    def restore_results(self, server: int, results: Iterable[QueueResult]) -> None:
        """Put back results whose sending failed, so a later pull or ack carries them."""
        with self._lock:
            pending = self._pending[server]
            for r in results:
                outcomes = pending.get((r.topic, r.qid))
                if outcomes is None:
                    outcomes = pending[(r.topic, r.qid)] = _QueueOutcomes()
                outcomes.acks.extend(r.acks)
                outcomes.fails.extend(r.fails)
                outcomes.attempts.update(r.attempts)
                self._pending_count[server] += len(r.acks) + len(r.fails)
            if pending:
                self._urgent[server] = True  # not known any more: assume so
                if self._pending_since[server] is None:
                    self._pending_since[server] = time.monotonic()

    def pending_since(self, server: int) -> float | None:
        return self._pending_since[server]

    def urgent(self, server: int) -> bool:
        """Whether a pending result of ``server`` may release a chain (see :meth:`settle`)."""
        return self._urgent[server]

    def has_pending(self) -> bool:
        return any(self._pending_count)

    def due_for_extension(self, now: float, after_s: float) -> dict[int, list[Delivery]]:
        """Deliveries whose lease started ``after_s`` or more ago, by server."""
        due: dict[int, list[Delivery]] = {}
        with self._lock:
            for d in self._outstanding:
                if now - d.leased_at >= after_s and not d.sending:
                    due.setdefault(d.server, []).append(d)
        return due

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def stats(self) -> ConsumerStats:
        with self._lock:
            counts = dict(self._counts)
            counts["outstanding"] = len(self._outstanding)
            counts["pending_results"] = sum(self._pending_count)
        return ConsumerStats(**counts)
