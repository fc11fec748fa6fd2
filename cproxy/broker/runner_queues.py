"""Queues joining and leaving a running group (cluster mode; ``cproxy.cluster.node`` via
``broker.hosting``): ``QueueHooks``, which its ``GroupRunner`` owns as ``runner.queues``; a
single proxy never calls it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from cproxy.engine.group import GroupEngine
from cproxy.model import QueueProgress
from cproxy.store.base import Store


class QueueHooks:
    """The queues one group's engine serves, as ownership moves.

    ``commit()`` persists the group's progress now (the runner's); ``wake()`` wakes the
    runner's loops for what the engine calls made due; ``queues_changed()`` tells the runner
    its share of the group's queues changed (its rate limit follows it)."""

    def __init__(
        self,
        engine: GroupEngine,
        store: Store,
        commit: Callable[[], Awaitable[None]],
        wake: Callable[[], None],
        queues_changed: Callable[[], None],
    ) -> None:
        self._engine = engine
        self._store = store
        self._name = engine.name
        self._commit = commit
        self._wake = wake
        self._queues_changed = queues_changed

    def note_end(self, topic: str, qid: int, end_offset: int) -> None:
        """Another proxy appended to a queue this group serves: read up to ``end_offset``."""
        self._engine.note_end(topic, qid, end_offset)
        self._wake()

    async def add_queue(self, topic: str, qid: int) -> None:
        """Serve a queue this proxy now owns, from its persisted progress."""
        if not self._engine.reads(topic) or self._engine.serves(topic, qid):
            return
        stored = (await self._store.load_progress(self._name)).get((topic, qid))
        stats = next(s for s in await self._store.queue_stats(topic) if s.qid == qid)
        if stored is None:
            start = (
                stats.min_offset if self._engine.config.start == "earliest" else stats.next_offset
            )
            stored = QueueProgress(start)
            await self._store.commit(self._name, {(topic, qid): stored})
        self._engine.add_queue(topic, qid, stored, stats.next_offset)
        self._queues_changed()
        # Dead letters a redrive marked and a former owner did not finish: delivered here.
        redriving = await self._store.load_redriving(self._name)
        self._engine.redrive(
            [d for d in redriving if (d.message.topic, d.message.qid) == (topic, qid)]
        )
        # The delivery numbers reserved above the former owner's are persisted before the
        # fetcher reads anything of the queue to hand out.
        await self._commit()
        self._wake()

    def pause_queue(self, topic: str, qid: int) -> None:
        """Hand out nothing new from the queue; results for it still apply."""
        self._engine.pause_queue(topic, qid)

    def in_flight_on(self, topic: str, qid: int) -> int:
        return self._engine.in_flight_on(topic, qid)

    def drop_queue(self, topic: str, qid: int) -> None:
        """Forget the queue (handed over or lost): results for it answer unknown."""
        self._engine.drop_queue(topic, qid)
        self._queues_changed()
        self._wake()
