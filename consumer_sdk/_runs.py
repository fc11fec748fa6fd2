"""Same-key runs (``max_per_key`` > 1): the messages of one run are handled one at a time.

A pull answer may carry several consecutive messages of one order value; each names the
position of its run's first message (``Message.run``). The first of each run is dispatched at
once; the next only after the previous one acked. A fail ends the run: the server has sent the
rest back behind the failed message, so they get no result here. Thread-safe: handlers settle
on worker threads.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from consumer_sdk.models import Message

from ._ledger import Delivery


def several_runs(messages: Sequence[Message]) -> bool:
    """Whether a pull answer holds more than one run (order value); a message without ``run``
    is one. Stops at the second run's first message: the second message, without runs."""
    return any(i > 0 and (m.run is None or m.run == i) for i, m in enumerate(messages))


class Runs:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: A dispatched delivery -> the messages of its run that come after it.
        self._rest: dict[Delivery, list[Delivery]] = {}

    def split(self, deliveries: list[Delivery]) -> list[Delivery]:
        """The deliveries to dispatch now (the first of each run); remember the rest."""
        runs: dict[int, list[Delivery]] = {}
        for i, d in enumerate(deliveries):
            run = d.message.run
            runs.setdefault(i if run is None else run, []).append(d)
        with self._lock:
            for members in runs.values():
                if len(members) > 1:
                    self._rest[members[0]] = members[1:]
        return [members[0] for members in runs.values()]

    def has_rest(self, delivery: Delivery) -> bool:
        """True if later messages of ``delivery``'s run wait here for it to finish."""
        with self._lock:
            return delivery in self._rest

    def settled(self, delivery: Delivery, acked: bool) -> tuple[Delivery | None, list[Delivery]]:
        """``delivery`` finished: ``(next to dispatch, deliveries the server took back)``."""
        with self._lock:
            rest = self._rest.pop(delivery, None)
            if not rest:
                return None, []
            if not acked:
                return None, rest
            if len(rest) > 1:
                self._rest[rest[0]] = rest[1:]
            return rest[0], []
