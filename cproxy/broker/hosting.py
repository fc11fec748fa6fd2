"""The broker's side of cluster mode: which queues it serves, and keeping up with peers.

``QueueHosting``, a collaborator the ``Broker`` owns: ``cproxy.cluster.node`` calls it (through
the broker's facade) as ownership moves; a single proxy never calls it, and pays nothing for it
(``owned`` is None: all queues).

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
    """Which queues the broker's groups serve, and catching up with peers' changes.

    It shares the broker's ``groups`` (the live runners by name, which it replaces on a
    refresh) and ``group_lock``; ``open_runner`` is how the broker opens one."""

    def __init__(
        self,
        store: Store,
        topics: Topics,
        groups: dict[str, GroupRunner],
        group_lock: Lock,
        open_runner: Callable[[str, GroupConfig], Awaitable[GroupRunner]],
        owned: set[QueueRef] | None = None,
    ) -> None:
        self._store = store
        self._topics = topics
        self._groups = groups
        self._group_lock = group_lock
        self._open_runner = open_runner
        #: Cluster mode: the queues this proxy owns (runners serve only these); None: all.
        self.owned = owned
        #: Cluster mode: owned queues being released (drained before the hand-over).
        self.releasing: set[QueueRef] = set()

    def _readers(self, topic: str) -> Iterator[GroupRunner]:
        return (r for r in list(self._groups.values()) if r.reads(topic))

    async def serve_queue(self, topic: str, qid: int) -> None:
        """Start serving a newly owned queue in every group that reads its topic."""
        if self.owned is not None:
            self.owned.add((topic, qid))
        for runner in self._readers(topic):
            await runner.queues.add_queue(topic, qid)

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
                await runner.queues.add_queue(topic, qid)  # a no-op for queues it serves already
                if (topic, qid) in self.releasing:
                    runner.queues.pause_queue(topic, qid)
            for topic in runner.config.topics:
                for stats in await self._store.queue_stats(topic):
                    if (topic, stats.qid) not in owned:
                        runner.queues.drop_queue(topic, stats.qid)
            if (owned, self.releasing) == before:
                return

    def pause_queue(self, topic: str, qid: int) -> None:
        """The queue is being released: hand out nothing new from it, take results."""
        self.releasing.add((topic, qid))
        for runner in self._readers(topic):
            runner.queues.pause_queue(topic, qid)

    def in_flight_on(self, topic: str, qid: int) -> int:
        """Messages of the queue handed out and not answered, over all groups."""
        return sum(r.queues.in_flight_on(topic, qid) for r in self._readers(topic))

    def drop_queue(self, topic: str, qid: int) -> None:
        """Stop serving the queue in every group (handed over, or lost)."""
        if self.owned is not None:
            self.owned.discard((topic, qid))
        self.releasing.discard((topic, qid))
        for runner in self._readers(topic):
            runner.queues.drop_queue(topic, qid)

    def note_end(self, topic: str, qid: int, end_offset: int) -> None:
        """Another proxy appended to the queue; its owner (maybe us) reads the news."""
        if self.owned is not None and (topic, qid) not in self.owned:
            return
        for runner in self._readers(topic):
            runner.queues.note_end(topic, qid, end_offset)

    async def know_topic(self, name: str) -> None:
        """A topic this proxy has not seen may have been created through another one
        moments ago: read the topics again before calling it unknown."""
        if name not in self._topics.names():
            await self._topics.load()

    async def refresh(self) -> None:
        """Catch up with topics and groups that other proxies created, changed or deleted."""
        await self._topics.load()
        stored = await self._store.load_groups()
        async with self._group_lock:
            for name in [n for n in self._groups if n not in stored]:
                runner = self._groups.pop(name)
                await runner.close(commit=False)
                logger.info("group=%s deleted through another proxy", name)
            for name, raw in sorted(stored.items()):
                config = GroupConfig.from_dict(orjson.loads(raw))
                old = self._groups.get(name)
                if old is not None and old.config == config:
                    continue
                if any(t not in self._topics.names() for t in config.topics):
                    continue  # a topic not seen yet: next time
                if old is not None:
                    await old.close()
                self._groups[name] = await self._open_runner(name, config)
                logger.info(
                    "group=%s %s through another proxy", name, "updated" if old else "created"
                )
