# cproxy: compiled (mypyc), see cproxy/_native.py
"""A topic's ready queues (``ReadyQueue``): state the ``Sequencer`` owns
(``cproxy.engine.sequencer``, whose docstring tells how chains work). Read only outside the
sequencer. ``Chain`` lives with ``Entry`` in ``cproxy.engine.work``: each refers to the other."""

from __future__ import annotations

from collections import deque

from cproxy.engine.work import READY, Entry


class ReadyQueue:
    """Ready entries of one topic: reactivated chains first, then fresh work."""

    __slots__ = ("fresh", "reactivated")

    def __init__(self) -> None:
        self.reactivated: deque[Entry] = deque()
        self.fresh: deque[Entry] = deque()

    def pop(self) -> Entry | None:
        # Entries that left READY elsewhere (seek) stay in the deques; skip them lazily.
        for queue in (self.reactivated, self.fresh):
            while queue:
                entry = queue.popleft()
                if entry.state is READY:
                    return entry
        return None
