"""The broker's side of cluster mode: which queues it serves, and keeping up with peers.

``Broker`` methods (mixed in from here) that ``cproxy.cluster.node`` calls as ownership moves;
a single proxy never calls them, and pays nothing for them (``owned`` is None: all queues).

- ``serve_queue`` / ``pause_queue`` / ``in_flight_on`` / ``drop_queue``: a queue joins, is
  released (hand out nothing new, take results), and leaves every group at once (ownership
  is per queue, for all groups).
- ``note_end``: another proxy appended to a queue (LISTEN/NOTIFY).
- ``refresh``: topics and groups created, changed or deleted through another proxy.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator

import orjson
from anyio import Lock

from cproxy.engine.group_config import GroupConfig
from cproxy.model import QueueRef
from cproxy.store.base import Store

from .runner import GroupRunner
from .topics import Topics

logger = logging.getLogger(__name__)


class QueueHosting:
    """Cluster hooks, mixed into ``Broker`` (which sets this state)."""

    store: Store
    groups: dict[str, GroupRunner]
    _topics: Topics
    _group_lock: Lock
    #: Cluster mode: the queues this proxy owns (runners serve only these); None: all.
    owned: set[QueueRef] | None
    #: Cluster mode: owned queues being released (drained before the hand-over).
    releasing: set[QueueRef]
    #: Cluster mode: raises ``StoreError`` (503) while this proxy cannot be sure it still
    #: owns its queues (its lease ran out locally, e.g. after a pause): pulls, acks and
    #: extends wait, so nothing is handed out or finished on a queue that moved.
    check_lease: Callable[[], None] | None
    #: Cluster mode: tells the peers to redrive the dead letters of their queues too
    #: (group, topic or None for all).
    announce_redrive: Callable[[str, str | None], Awaitable[None]] | None

    _open_runner: Callable[[str, GroupConfig], Awaitable[GroupRunner]]

    def _readers(self, topic: str) -> Iterator[GroupRunner]:
        return (r for r in list(self.groups.values()) if r.reads(topic))

    async def serve_queue(self, topic: str, qid: int) -> None:
        """Start serving a newly owned queue in every group that reads its topic."""
        if self.owned is not None:
            self.owned.add((topic, qid))
        for runner in self._readers(topic):
            await runner.add_queue(topic, qid)

    async def reconcile(self, runner: GroupRunner) -> None:
        """Make a just-opened runner serve exactly the owned queues of its topics: a queue
        claimed or dropped while it was opening is added or dropped now.

        The runner is not among ``groups`` yet, so ``serve_queue`` and ``drop_queue`` pass it
        by: passes repeat until ownership did not change during one. The caller registers the
        runner right after, with no await in between, so no claim falls in the gap."""
        owned = self.owned
        if owned is None:
            return
        while True:
            before = (set(owned), set(self.releasing))
            for topic, qid in sorted(before[0]):
                await runner.add_queue(topic, qid)  # a no-op for queues it serves already
                if (topic, qid) in self.releasing:
                    runner.pause_queue(topic, qid)
            for topic in runner.config.topics:
                for stats in await self.store.queue_stats(topic):
                    if (topic, stats.qid) not in owned:
                        runner.drop_queue(topic, stats.qid)
            if (owned, self.releasing) == before:
                return

    def pause_queue(self, topic: str, qid: int) -> None:
        """The queue is being released: hand out nothing new from it, take results."""
        self.releasing.add((topic, qid))
        for runner in self._readers(topic):
            runner.pause_queue(topic, qid)

    def in_flight_on(self, topic: str, qid: int) -> int:
        """Messages of the queue handed out and not answered, over all groups."""
        return sum(r.in_flight_on(topic, qid) for r in self._readers(topic))

    def drop_queue(self, topic: str, qid: int) -> None:
        """Stop serving the queue in every group (handed over, or lost)."""
        if self.owned is not None:
            self.owned.discard((topic, qid))
        self.releasing.discard((topic, qid))
        for runner in self._readers(topic):
            runner.drop_queue(topic, qid)

    def note_end(self, topic: str, qid: int, end_offset: int) -> None:
        """Another proxy appended to the queue; its owner (maybe us) reads the news."""
        if self.owned is not None and (topic, qid) not in self.owned:
            return
        for runner in self._readers(topic):
            runner.note_end(topic, qid, end_offset)

    async def know_topic(self, name: str) -> None:
        """A topic this proxy has not seen may have been created through another one
        moments ago: read the topics again before calling it unknown."""
        if name not in self._topics.names():
            await self._topics.load()

    async def refresh(self) -> None:
        """Catch up with topics and groups that other proxies created, changed or deleted."""
        await self._topics.load()
        stored = await self.store.load_groups()
        async with self._group_lock:
            for name in [n for n in self.groups if n not in stored]:
                runner = self.groups.pop(name)
                await runner.close(commit=False)
                logger.info("group=%s deleted through another proxy", name)
            for name, raw in sorted(stored.items()):
                config = GroupConfig.from_dict(orjson.loads(raw))
                old = self.groups.get(name)
                if old is not None and old.config == config:
                    continue
                if any(t not in self._topics.names() for t in config.topics):
                    continue  # a topic not seen yet: next time
                if old is not None:
                    await old.close()
                self.groups[name] = await self._open_runner(name, config)
                logger.info(
                    "group=%s %s through another proxy", name, "updated" if old else "created"
                )
