"""Queues joining and leaving a running group (cluster mode; ``cproxy.cluster.node`` via
``broker.hosting``). ``GroupRunner`` methods, mixed in from here; a single proxy never calls
them."""

from __future__ import annotations

from collections.abc import Callable

import anyio

from cproxy.engine.group import GroupEngine
from cproxy.engine.group_config import GroupConfig
from cproxy.engine.records import CommitBatch
from cproxy.model import QueueProgress
from cproxy.store.base import Store


class QueueHooks:
    """Cluster hooks of ``GroupRunner`` (which sets this state)."""

    name: str
    _engine: GroupEngine
    _store: Store
    _fetch_kick: anyio.Event
    _notify_ready: Callable[[], None]
    reads: Callable[[str], bool]
    queues_changed: Callable[[], None]

    @property
    def config(self) -> GroupConfig:
        return self._engine.config

    def note_end(self, topic: str, qid: int, end_offset: int) -> None:
        """Another proxy appended to a queue this group serves: read up to ``end_offset``."""
        self._engine.note_end(topic, qid, end_offset)
        self._fetch_kick.set()

    async def add_queue(self, topic: str, qid: int) -> None:
        """Serve a queue this proxy now owns, from its persisted progress."""
        if not self.reads(topic) or self._engine.serves(topic, qid):
            return
        stored = (await self._store.load_progress(self.name)).get((topic, qid))
        stats = next(s for s in await self._store.queue_stats(topic) if s.qid == qid)
        if stored is None:
            start = stats.min_offset if self.config.start == "earliest" else stats.next_offset
            stored = QueueProgress(start)
            await self._store.commit(self.name, {(topic, qid): stored})
        self._engine.add_queue(topic, qid, stored, stats.next_offset)
        self.queues_changed()
        # Dead letters a redrive marked and a former owner did not finish: delivered here.
        redriving = await self._store.load_redriving(self.name)
        self._engine.redrive(
            [d for d in redriving if (d.message.topic, d.message.qid) == (topic, qid)]
        )
        self._fetch_kick.set()

    def pause_queue(self, topic: str, qid: int) -> None:
        """Hand out nothing new from the queue; results for it still apply."""
        self._engine.pause_queue(topic, qid)

    def in_flight_on(self, topic: str, qid: int) -> int:
        return self._engine.in_flight_on(topic, qid)

    def queue_progress(self, topic: str, qid: int) -> QueueProgress | None:
        """The queue's progress as it would be persisted now; None when not served."""
        return self._engine.queue_progress(topic, qid)

    def take_commit(self) -> CommitBatch:
        """Everything to persist now (the hand-over commits it in its own transaction)."""
        return self._engine.take_commit()

    def requeue(self, batch: CommitBatch) -> None:
        """A batch from ``take_commit`` was not written: keep it for the next commit."""
        self._engine.requeue(batch)

    def drop_queue(self, topic: str, qid: int) -> None:
        """Forget the queue (handed over or lost): results for it answer unknown."""
        self._engine.drop_queue(topic, qid)
        self.queues_changed()
        self._notify_ready()
