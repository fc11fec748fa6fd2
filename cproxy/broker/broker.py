"""The broker: topics, produce routing and the live consumer groups over one store.

The HTTP layer talks only to this class. It owns the store's lifecycle and one
``GroupRunner`` per consumer group, and it tells runners when a produce lands so that long
polls return promptly without anyone polling the store.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import orjson
from anyio.abc import TaskGroup

from cproxy.config import Settings
from cproxy.engine import operations
from cproxy.engine.config import GroupConfig
from cproxy.errors import GroupNotFound, InvalidRequest, ShuttingDown, TopicNotFound
from cproxy.model import AppendResult, DeadLetter, Message, NewMessage, QueueStats, TopicInfo
from cproxy.partitioner import partition_for_key
from cproxy.store.base import Store

from .runner import GroupRunner

logger = logging.getLogger(__name__)


SeekTarget = str | int | dict[str, int]


class Broker:
    """Start with ``start(task_group)``; stop with ``stop()``."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        ack_latency_for: Callable[[str], Callable[[float], None]] | None = None,
        on_produced: Callable[[str, int], None] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.groups: dict[str, GroupRunner] = {}
        self._topics: dict[str, TopicInfo] = {}
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._task_group: TaskGroup | None = None
        self._group_lock = anyio.Lock()
        self._ack_latency_for = ack_latency_for
        self._on_produced = on_produced
        self.accepting = False

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self, task_group: TaskGroup) -> None:
        """Open the store, apply declared topics and groups, start every stored group."""
        self._task_group = task_group
        await self.store.open()
        for topic in await self.store.list_topics():
            self._topics[topic.name] = topic
        for name, queues in self.settings.topics.items():
            await self.create_topic(name, queues)
        stored = await self.store.load_groups()
        for name, config in self.settings.groups.items():
            stored[name] = orjson.dumps(config.to_dict())
            await self.store.save_group(name, stored[name])
        for name, raw in sorted(stored.items()):
            config = GroupConfig.from_dict(orjson.loads(raw))
            missing = [t for t in config.topics if t not in self._topics]
            if missing:
                logger.error("group=%s not started: unknown topic(s) %s", name, missing)
                continue
            self.groups[name] = await self._open_runner(name, config)
        self.accepting = True
        logger.info("broker started topics=%d groups=%d", len(self._topics), len(self.groups))

    def begin_shutdown(self) -> None:
        """Refuse new work and release waiting long polls (called on SIGTERM/SIGINT)."""
        self.accepting = False
        for runner in self.groups.values():
            runner.stop_pulls()

    async def stop(self) -> None:
        """Stop taking work, persist every group's progress, close the store."""
        self.accepting = False
        for runner in list(self.groups.values()):
            await runner.close()
        self.groups.clear()
        await self.store.close()
        logger.info("broker stopped")

    async def _open_runner(self, name: str, config: GroupConfig) -> GroupRunner:
        assert self._task_group is not None, "broker not started"
        return await GroupRunner.open(
            self.store,
            name,
            config,
            self._task_group,
            self.settings.commit_interval_ms,
            self._ack_latency_for(name) if self._ack_latency_for else None,
        )

    def _check_open(self) -> None:
        if not self.accepting:
            raise ShuttingDown("the server is shutting down")

    # -- topics --------------------------------------------------------------------------------
    async def create_topic(self, name: str, queues: int) -> tuple[TopicInfo, bool]:
        info, created = await self.store.create_topic(name, queues)
        self._topics[name] = info
        if created:
            logger.info("topic=%s created queues=%d", name, queues)
        return info, created

    def list_topics(self) -> list[TopicInfo]:
        return sorted(self._topics.values(), key=lambda t: t.name)

    def topic(self, name: str) -> TopicInfo:
        info = self._topics.get(name)
        if info is None:
            raise TopicNotFound(f"topic {name!r} does not exist")
        return info

    async def queue_stats(self, name: str) -> list[QueueStats]:
        self.topic(name)
        return await self.store.queue_stats(name)

    # -- produce -------------------------------------------------------------------------------
    async def produce(
        self, topic: str, messages: Sequence[NewMessage], now_ms: int
    ) -> list[AppendResult]:
        """Store ``messages`` atomically and wake the groups that read ``topic``.

        A message without a ``qid`` gets one here, in place: by key, else round robin.
        """
        self._check_open()
        queues = self.topic(topic).queues
        rr = self._round_robin.setdefault(topic, itertools.count())
        for i, m in enumerate(messages):
            if m.qid is not None:
                if not 0 <= m.qid < queues:
                    raise InvalidRequest(
                        f"messages[{i}].qid {m.qid} is out of range: topic {topic!r} has "
                        f"queues 0..{queues - 1}"
                    )
            elif m.key is not None:
                m.qid = partition_for_key(m.key, queues)
            else:
                m.qid = next(rr) % queues
        results = await self.store.append(topic, messages, now_ms, self.settings.dedup_window_ms)
        stored: dict[int, list[Message]] = {}
        for result in results:
            if result.message is not None:
                stored.setdefault(result.qid, []).append(result.message)
        if stored:
            # Hand the new messages to caught-up groups directly: no store read needed.
            for runner in self.groups.values():
                if topic in runner.engine.config.topics:
                    for qid, batch in stored.items():
                        runner.offer(topic, qid, batch)
        if self._on_produced is not None:
            self._on_produced(topic, sum(not r.duplicate for r in results))
        return results

    # -- groups --------------------------------------------------------------------------------
    def group(self, name: str) -> GroupRunner:
        self._check_open()
        runner = self.groups.get(name)
        if runner is None:
            raise GroupNotFound(f"group {name!r} does not exist")
        return runner

    async def put_group(self, name: str, config: GroupConfig) -> tuple[GroupConfig, bool]:
        """Create or update a group; returns ``(config, created)``.

        Updating a live group restarts it from its committed progress: messages in flight
        are delivered again, and acks for the old deliveries are reported as unknown.
        """
        self._check_open()
        for topic in config.topics:
            self.topic(topic)
        async with self._group_lock:
            old = self.groups.get(name)
            if old is not None and old.engine.config == config:
                return config, False
            await self.store.save_group(name, orjson.dumps(config.to_dict()))
            if old is not None:
                await old.close()
            self.groups[name] = await self._open_runner(name, config)
            logger.info("group=%s %s", name, "updated" if old else "created")
            return config, old is None

    async def delete_group(self, name: str) -> None:
        async with self._group_lock:
            runner = self.group(name)
            del self.groups[name]
            await runner.close(commit=False)
            await self.store.delete_group(name)
            logger.info("group=%s deleted", name)

    def describe_group(self, name: str) -> dict[str, Any]:
        runner = self.group(name)
        stats = operations.stats(runner.engine)
        stats["dead_lettered"] = runner.dead_letter_count + len(runner.engine.pending.dead_letters)
        return {"name": name, "config": runner.engine.config.to_dict(), "stats": stats}

    async def seek(self, name: str, topic: str, qid: int | None, to: SeekTarget) -> dict[int, int]:
        """Move a group's position on one queue (or all queues) of ``topic``."""
        runner = self.group(name)
        self.topic(topic)
        if topic not in runner.engine.config.topics:
            raise InvalidRequest(f"group {name!r} does not read topic {topic!r}")
        stats = {s.qid: s for s in await self.store.queue_stats(topic)}
        if qid is not None and qid not in stats:
            raise InvalidRequest(f"qid {qid} is out of range for topic {topic!r}")
        targets: dict[int, int] = {}
        for q in [qid] if qid is not None else sorted(stats):
            s = stats[q]
            if to == "earliest":
                targets[q] = s.min_offset
            elif to == "latest":
                targets[q] = s.next_offset
            elif isinstance(to, int):
                targets[q] = min(max(to, s.min_offset), s.next_offset)
            elif isinstance(to, dict):
                targets[q] = await self.store.offset_for_time(topic, q, to["timestamp_ms"])
            else:
                raise InvalidRequest(
                    "'to' must be 'earliest', 'latest', an offset or {'timestamp_ms': n}"
                )
        await runner.seek(topic, targets)
        return targets

    async def dead_letters(self, name: str, topic: str | None, limit: int) -> list[DeadLetter]:
        # Flush first: a message just dead-lettered is listed at once (read your writes),
        # consistent with the group stats, which count pending dead letters too.
        await self.group(name).commit()
        return await self.store.list_dead_letters(name, topic, limit)
