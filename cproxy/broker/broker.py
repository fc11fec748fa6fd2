"""The broker: topics, produce routing and the live consumer groups over one store.

The HTTP layer and the metrics talk only to this class (a facade, as aiokafka's consumer is
over its fetcher and coordinator): every group call takes the group's name, and what comes
back are frozen snapshots. It owns the clock (``clock.now_ms``), the store's lifecycle and one
``GroupRunner`` per consumer group, and it tells runners when a produce lands so that long
polls return promptly without anyone polling the store.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import anyio
import orjson
from anyio.abc import TaskGroup

from cproxy.config import Settings
from cproxy.engine.group_config import GroupConfig
from cproxy.engine.records import Result
from cproxy.engine.snapshots import BlockedKey, GroupStats, Outcome
from cproxy.errors import (
    GroupNotFound,
    InvalidRequest,
    ShuttingDown,
    StoreError,
    TopicNotFound,
)
from cproxy.model import (
    AppendResult,
    DeadLetter,
    Message,
    MessageRef,
    NewMessage,
    QueueStats,
    TopicInfo,
)
from cproxy.placement import queue_for_key
from cproxy.store.base import Store

from .clock import now_ms
from .push import PushStats
from .runner import GroupRunner, PullResult

logger = logging.getLogger(__name__)

#: How long a failed append keeps ``ready()`` false (unless an append succeeds first). The
#: store's probe write can pass while bigger writes fail (a disk with a few pages left); after
#: this long without producer traffic the probe alone decides, so readiness never sticks.
WRITE_FAILURE_HOLD_MS = 10_000


SeekTarget = str | int | dict[str, int]


@dataclass(frozen=True, slots=True)
class GroupSummary:
    name: str
    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GroupView:
    """A group's effective config and state; ``dead_lettered`` counts stored + pending."""

    name: str
    config: GroupConfig
    stats: GroupStats
    dead_lettered: int
    #: Age of the oldest message not yet acked or dead-lettered (ms); None if none.
    oldest_unfinished_age_ms: int | None = None
    #: One entry per topic whose messages are pushed (cproxy.broker.push).
    push: tuple[PushStats, ...] = ()


class Broker:
    """Start with ``start(task_group)``; stop with ``stop()``."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        ack_latency_for: Callable[[str], Callable[[float], None]] | None = None,
        on_produced: Callable[[str, int], None] | None = None,
        on_pull: Callable[[str, float], None] | None = None,
    ) -> None:
        """``ack_latency_for(group)`` gives an observer of produce-to-ack seconds;
        ``on_produced(topic, count)`` and ``on_pull(group, seconds)`` feed metrics."""
        self.store = store
        self.settings = settings
        self.groups: dict[str, GroupRunner] = {}
        self._topics: dict[str, TopicInfo] = {}
        self._round_robin: dict[str, itertools.count[int]] = {}
        self._task_group: TaskGroup | None = None
        self._group_lock = anyio.Lock()
        self._ack_latency_for = ack_latency_for
        self._on_produced = on_produced
        self._on_pull = on_pull
        self.accepting = False
        #: ``now_ms()`` of the last append that failed with ``StoreError``, None after a success.
        self._append_failed_at_ms: int | None = None

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

    async def ready(self) -> bool:
        """The broker takes work and writes succeed (``/readyz``).

        False while shutting down, when the store's ping (a real write for SQLite) fails, and
        for ``WRITE_FAILURE_HOLD_MS`` after an append failed with ``StoreError`` (unless an
        append succeeded since).
        """
        failed_at = self._append_failed_at_ms
        if failed_at is not None and now_ms() - failed_at < WRITE_FAILURE_HOLD_MS:
            return False
        return self.accepting and await self.store.ping()

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
    async def produce(self, topic: str, messages: Sequence[NewMessage]) -> list[AppendResult]:
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
                m.qid = queue_for_key(m.key, queues)
            else:
                m.qid = next(rr) % queues
        try:
            results = await self.store.append(
                topic, messages, now_ms(), self.settings.dedup_window_ms
            )
        except StoreError:
            self._append_failed_at_ms = now_ms()
            raise
        self._append_failed_at_ms = None
        stored: dict[int, list[Message]] = {}
        for result in results:
            if result.message is not None:
                stored.setdefault(result.qid, []).append(result.message)
        if stored:
            # Hand the new messages to caught-up groups directly: no store read needed.
            for runner in self.groups.values():
                if runner.reads(topic):
                    for qid, batch in stored.items():
                        runner.offer(topic, qid, batch)
        if self._on_produced is not None:
            self._on_produced(topic, sum(not r.duplicate for r in results))
        return results

    # -- groups --------------------------------------------------------------------------------
    def _runner(self, name: str) -> GroupRunner:
        self._check_open()
        runner = self.groups.get(name)
        if runner is None:
            raise GroupNotFound(f"group {name!r} does not exist")
        return runner

    def list_groups(self) -> list[GroupSummary]:
        """Every live group with the topics it reads, by name."""
        return [
            GroupSummary(name, tuple(sorted(self.groups[name].config.topics)))
            for name in sorted(self.groups)
        ]

    def group_topics(self, name: str) -> list[str] | None:
        """The topics a group reads, or None for an unknown group (for scope checks)."""
        runner = self.groups.get(name)
        return None if runner is None else list(runner.config.topics)

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
            if old is not None and old.config == config:
                return config, False
            await self.store.save_group(name, orjson.dumps(config.to_dict()))
            if old is not None:
                await old.close()
            self.groups[name] = await self._open_runner(name, config)
            logger.info("group=%s %s", name, "updated" if old else "created")
            return config, old is None

    async def delete_group(self, name: str) -> None:
        async with self._group_lock:
            runner = self._runner(name)
            del self.groups[name]
            await runner.close(commit=False)
            await self.store.delete_group(name)
            logger.info("group=%s deleted", name)

    async def describe_group(self, name: str) -> GroupView:
        """A group's effective config and a snapshot of its state.

        ``oldest_unfinished_age_ms`` is read from the store: the produce time of the message
        at each queue's committed offset (None when every queue is caught up).
        """
        runner = self._runner(name)
        stats = runner.stats()
        dead = runner.dead_letter_count + stats.pending_dead_letters
        oldest: int | None = None
        for q in stats.queues:
            if q.committed_offset < q.next_offset:
                try:
                    first = await self.store.read(q.topic, q.qid, q.committed_offset, 1)
                except StoreError as exc:
                    logger.warning("group=%s oldest unfinished not read: %s", name, exc)
                    continue
                if first:
                    at = first[0].produced_at_ms
                    oldest = at if oldest is None else min(oldest, at)
        age = None if oldest is None else max(0, now_ms() - oldest)
        return GroupView(name, runner.config, stats, dead, age, tuple(runner.push_stats()))

    def group_stats(self) -> list[tuple[str, GroupStats]]:
        """A snapshot of every live group (for metrics)."""
        return [(name, runner.stats()) for name, runner in list(self.groups.items())]

    # -- consuming -----------------------------------------------------------------------------
    async def pull(
        self,
        name: str,
        max_messages: int,
        wait_ms: int,
        topics: Sequence[str] | None,
        results: Sequence[Result],
        max_per_key: int = 1,
    ) -> PullResult:
        """Apply ``results``, then hand out up to ``max_messages`` (long poll up to ``wait_ms``).

        ``max_per_key`` > 1 allows same-key runs (see ``GroupEngine.pull``).
        """
        limits = self.settings.limits
        if max_messages > limits.max_pull_messages:
            raise InvalidRequest(f"max_messages must be at most {limits.max_pull_messages}")
        if max_per_key > limits.max_pull_messages:
            raise InvalidRequest(f"max_per_key must be at most {limits.max_pull_messages}")
        if wait_ms > limits.max_wait_ms:
            raise InvalidRequest(f"wait_ms must be at most {limits.max_wait_ms}")
        runner = self._runner(name)
        if topics is not None:
            unknown = [t for t in topics if not runner.reads(t)]
            if unknown:
                raise InvalidRequest(f"group {name!r} does not read topic(s) {unknown}")
        started = time.perf_counter()
        result = await runner.pull(max_messages, wait_ms, topics, results, max_per_key)
        if self._on_pull is not None:
            self._on_pull(name, time.perf_counter() - started)
        return result

    def ack(self, name: str, results: Sequence[Result]) -> Outcome:
        """Apply acks and fails without pulling."""
        return self._runner(name).apply(results)

    def extend(
        self,
        name: str,
        refs: Sequence[MessageRef],
        ack_timeout_ms: int,
        attempts: Mapping[MessageRef, int] | None = None,
    ) -> Outcome:
        """Push the ack deadline of in-flight messages to now + ``ack_timeout_ms``.

        ``attempts`` fences the extends (ref -> attempt), as for results.
        """
        return self._runner(name).extend(refs, ack_timeout_ms, attempts)

    # -- operator actions ----------------------------------------------------------------------
    async def seek(self, name: str, topic: str, qid: int | None, to: SeekTarget) -> dict[int, int]:
        """Move a group's position on one queue (or all queues) of ``topic``."""
        runner = self._runner(name)
        self.topic(topic)
        if not runner.reads(topic):
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

    async def commit(self, name: str) -> None:
        """Persist the group's progress and dead letters now (normally every interval)."""
        await self._runner(name).commit()

    async def dead_letters(
        self, name: str, topic: str | None, limit: int, within: Collection[str] | None = None
    ) -> list[DeadLetter]:
        """The group's dead letters (of ``topic``, or all) in (topic, qid, offset) order.

        ``within`` (a token's topic scope; None: any) keeps only dead letters of those
        topics: a group keeps the dead letters of topics it no longer reads.
        """
        # Flush first: a message just dead-lettered is listed at once (read your writes),
        # consistent with the group stats, which count pending dead letters too.
        await self.commit(name)
        if within is None or topic is not None:
            if topic is not None and within is not None and topic not in within:
                return []
            return await self.store.list_dead_letters(name, topic, limit)
        rows: list[DeadLetter] = []
        for scoped in sorted(within):  # the store's order: topic names compare as bytes
            rows += await self.store.list_dead_letters(name, scoped, limit - len(rows))
            if len(rows) >= limit:
                break
        return rows

    async def redrive(
        self, name: str, topic: str | None, within: Collection[str] | None = None
    ) -> int:
        """Deliver the group's dead letters (of ``topic``, or all) again; returns how many.

        ``within`` (a token's topic scope; None: any) leaves dead letters of other topics
        untouched.
        """
        runner = self._runner(name)
        if within is None or topic is not None:
            if topic is not None and within is not None and topic not in within:
                return 0
            return await runner.redrive(topic)
        # Only dead letters of topics the group reads are delivered again; others stay put.
        return sum([await runner.redrive(t) for t in sorted(runner.config.topics) if t in within])

    def blocked_keys(
        self, name: str, topic: str | None, min_blocked_ms: int, limit: int
    ) -> list[BlockedKey]:
        """Heads not finished, blocked at least ``min_blocked_ms``, longest first."""
        cutoff = now_ms() - min_blocked_ms
        rows = self._runner(name).blocked_keys(topic)
        return [r for r in rows if r.blocked_since_ms <= cutoff][:limit]

    def skip(
        self, name: str, topic: str, order_value: str | None, ref: MessageRef | None
    ) -> MessageRef:
        """Dead-letter a retrying or exhausted head (by order value, or by ref if unordered)."""
        return self._runner(name).skip(topic, order_value, ref)

    def release(
        self, name: str, topic: str, order_value: str | None, ref: MessageRef | None
    ) -> MessageRef:
        """Deliver a retrying or exhausted head again now, with a fresh attempt budget."""
        return self._runner(name).release(topic, order_value, ref)
