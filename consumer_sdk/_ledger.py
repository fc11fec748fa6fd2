"""Book-keeping of a consumer: deliveries not yet finished, results not yet sent.

Handlers finish on worker threads (sync consumer) or tasks (async consumer) while the pull
loop runs on an event loop, so every method here is thread-safe behind one lock. Results are
kept per server because an ack only means something to the server that handed the message out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

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


#: One recorded result: the message and its handler's error (None: acked).
_Outcome = tuple[Message, "str | None"]


def _group(restored: list[QueueResult], outcomes: list[_Outcome]) -> list[QueueResult]:
    """Results per queue: ``restored`` (from a failed send, older) first, then ``outcomes``."""
    queues: dict[tuple[str, int], tuple[list[int], list[tuple[int, str | None]], list[Any]]] = {}
    for r in restored:
        q = queues.get((r.topic, r.qid))
        if q is None:
            q = queues[(r.topic, r.qid)] = ([], [], [])
        q[0].extend(r.acks)
        q[1].extend(r.fails)
        q[2].extend(r.attempts)
    for msg, error in outcomes:
        q = queues.get((msg.topic, msg.qid))
        if q is None:
            q = queues[(msg.topic, msg.qid)] = ([], [], [])
        if error is None:
            q[0].append(msg.offset)
        else:
            q[1].append((msg.offset, error))
        q[2].append((msg.offset, msg.attempt))
    return [
        # An offset settled twice (a redelivery) is fenced by its latest attempt.
        QueueResult(topic, qid, tuple(acks), tuple(fails), tuple(dict(attempts).items()))
        for (topic, qid), (acks, fails, attempts) in queues.items()
    ]


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
        # Per server: results recorded since the last send, in order (grouped per queue only
        # when sent: settling a message is on every message's path), and results whose
        # sending failed, to go first next time.
        self._pending: list[list[_Outcome]] = [[] for _ in range(servers)]
        self._restored: list[list[QueueResult]] = [[] for _ in range(servers)]
        #: monotonic time the oldest pending result of each server was recorded
        self._pending_since: list[float | None] = [None] * servers
        #: some pending result of each server may let the server release a chain's next message
        self._urgent = [False] * servers
        self._counts: dict[str, int] = {f.name: 0 for f in fields(ConsumerStats)}

    def add_server(self) -> int:
        """Room for one more server; returns its index (servers are never removed)."""
        with self._lock:
            self._pending.append([])
            self._restored.append([])
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
            server = delivery.server
            pending = self._pending[server]
            if self._pending_since[server] is None:
                self._pending_since[server] = time.monotonic()
            if error is None:
                pending.append((delivery.message, None))
                self._counts["acked"] += 1
            else:
                pending.append((delivery.message, error[:_MAX_ERROR_CHARS]))
                self._counts["failed"] += 1
            if urgent:
                self._urgent[server] = True
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
            outcomes, restored = self._pending[server], self._restored[server]
            if not outcomes and not restored:
                return []
            self._pending[server] = []
            self._restored[server] = []
            self._pending_since[server] = None
            self._urgent[server] = False
        return _group(restored, outcomes)

    def restore_results(self, server: int, results: Iterable[QueueResult]) -> None:
        """Put back results whose sending failed, so a later pull or ack carries them."""
        with self._lock:
            self._restored[server].extend(results)
            if self._restored[server] or self._pending[server]:
                self._urgent[server] = True  # not known any more: assume so
                if self._pending_since[server] is None:
                    self._pending_since[server] = time.monotonic()

    def _pending_results(self, server: int) -> int:
        restored = self._restored[server]
        return len(self._pending[server]) + sum(len(r.acks) + len(r.fails) for r in restored)

    def pending_since(self, server: int) -> float | None:
        return self._pending_since[server]

    def urgent(self, server: int) -> bool:
        """Whether a pending result of ``server`` may release a chain (see :meth:`settle`)."""
        return self._urgent[server]

    def has_pending(self) -> bool:
        return any(self._pending) or any(self._restored)

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
            counts["pending_results"] = sum(map(self._pending_results, range(len(self._pending))))
        return ConsumerStats(**counts)
