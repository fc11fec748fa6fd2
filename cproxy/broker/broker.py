"""The broker: topics, produce routing and the live consumer groups over one store.

The HTTP layer and the metrics talk only to this class (a facade, as aiokafka's consumer is
over its fetcher and coordinator): every group call takes the group's name, and what comes
back are frozen snapshots. It owns the clock (``clock.now_ms``), the store's lifecycle and one
``GroupRunner`` per consumer group, and it tells runners when a produce lands so that long
polls return promptly without anyone polling the store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import NamedTuple

import anyio
import orjson
from anyio.abc import TaskGroup

from cproxy.config import Settings
from cproxy.engine.group_config import GroupConfig
from cproxy.engine.records import Result
from cproxy.engine.snapshots import GroupStats, Outcome
from cproxy.errors import GroupNotFound, InvalidRequest, ShuttingDown, StoreError, TopicInUse
from cproxy.model import (
    AppendResult,
    MessageRef,
    NewMessage,
    QueueRef,
    QueueStats,
    Record,
    TopicInfo,
)
from cproxy.store.base import Store

from .clock import every, now_ms
from .delays import check_delays
from .health import WriteHealth
from .hosting import QueueHosting
from .lease import ClusterLease
from .operator_actions import OperatorActions
from .runner import GroupRunner, Pulled
from .topics import Retention, Topics, retention_of
from .views import GroupSummary, GroupView
from .waiters import WatchGone

logger = logging.getLogger(__name__)


class Output(NamedTuple):
    """Messages an ack stores with its results (``Broker.ack_with_outputs``): one topic's."""

    topic: str
    messages: Sequence[NewMessage]


class Broker:
    """Start with ``start(task_group)``; stop with ``stop()``.

    Two collaborators it owns carry their own verbs: ``operator`` (``OperatorActions``: seek,
    dead letters, blocked keys, browse) and ``hosting`` (``QueueHosting``: which queues this
    proxy serves in cluster mode; the broker's methods of the same names pass on to it)."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        ack_latency_for: Callable[[str], Callable[[list[float]], None]] | None = None,
        on_produced: Callable[[str, int], None] | None = None,
        on_pull: Callable[[str, float], None] | None = None,
        cluster: ClusterLease | None = None,
    ) -> None:
        """``ack_latency_for(group)`` gives an observer of produce-to-ack seconds (a list per
        pull that acked something);
        ``on_produced(topic, count)`` and ``on_pull(group, seconds)`` feed metrics;
        ``cluster`` (cluster mode): groups serve only the queues claimed (``serve_queue``),
        and results wait on its lease."""
        self.store = store
        self.settings = settings
        #: Where groups may push (``[push] allowed_urls``); tests may stub its resolver.
        self.push_targets = settings.push_targets()
        self.groups: dict[str, GroupRunner] = {}
        self._topics = Topics(store)
        self._task_group: TaskGroup | None = None
        self._group_lock = anyio.Lock()
        self._ack_latency_for = ack_latency_for
        self._on_produced = on_produced
        self._on_pull = on_pull
        self.accepting = False
        self._writes = WriteHealth(store)
        self._retention_scope: anyio.CancelScope | None = None
        # Cluster mode (``cluster`` given): groups open serving no queue until the node
        # claims some (``hosting.QueueHosting``).
        self.hosting = QueueHosting(
            store,
            self._topics,
            self.groups,
            self._group_lock,
            self._open_runner,
            owned=None if cluster is None else set(),
        )
        self.operator = OperatorActions(
            self._topics, self.groups, self._runner, self._check_open, self._announce_redrive
        )
        #: Cluster mode: raises ``StoreError`` (503) while this proxy cannot be sure it still
        #: owns its queues (its lease ran out locally, e.g. after a pause): pulls, acks and
        #: extends wait, so nothing is handed out or finished on a queue that moved.
        self.check_lease: Callable[[], None] | None = (
            None if cluster is None else cluster.check_lease
        )
        #: Cluster mode: tells the peers to redrive the dead letters of their queues too
        #: (group, topic or None for all).
        self.announce_redrive: Callable[[str, str | None], Awaitable[None]] | None = (
            None if cluster is None else cluster.announce_redrive
        )

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self, task_group: TaskGroup) -> None:
        """Open the store, apply declared topics and groups, start every stored group."""
        self._task_group = task_group
        await self.store.open()
        await self._topics.load()
        for name, queues in self.settings.topics.items():
            info, _ = await self.create_topic(name, queues)
            declared = self.settings.topic_retention.get(name)
            if declared is not None and declared != retention_of(info):
                await self.update_topic(name, *declared)
        stored = await self.store.load_groups()
        for name, config in self.settings.groups.items():
            stored[name] = orjson.dumps(config.to_dict())
            await self.store.save_group(name, stored[name])
        for name, raw in sorted(stored.items()):
            config = GroupConfig.from_dict(orjson.loads(raw))
            missing = [t for t in config.topics if t not in self._topics.names()]
            if missing:
                logger.error("group=%s not started: unknown topic(s) %s", name, missing)
                continue
            self.groups[name] = await self._open_runner(name, config)
        self.accepting = True
        self._retention_scope = anyio.CancelScope()
        task_group.start_soon(
            every,
            self.settings.retention_interval_ms,
            self.apply_retention,
            "retention pass",
            self._retention_scope,
            name="retention",
        )
        logger.info(
            "broker started topics=%d groups=%d", len(self._topics.names()), len(self.groups)
        )

    def begin_shutdown(self) -> None:
        """Refuse new work and release waiting long polls (called on SIGTERM/SIGINT)."""
        self.accepting = False
        for runner in self.groups.values():
            runner.stop_pulls()

    async def stop(self) -> None:
        """Stop taking work, persist every group's progress, close the store."""
        self.accepting = False
        if self._retention_scope is not None:
            self._retention_scope.cancel()
        for runner in list(self.groups.values()):
            await runner.close()
        self.groups.clear()
        await self.store.close()
        logger.info("broker stopped")

    async def _open_runner(self, name: str, config: GroupConfig) -> GroupRunner:
        assert self._task_group is not None, "broker not started"
        runner = await GroupRunner.open(
            self.store,
            name,
            config,
            self._task_group,
            self.settings.commit_interval_ms,
            self._ack_latency_for(name) if self._ack_latency_for else None,
            None if self.owned is None else set(self.owned),
            self.push_targets,
        )
        if self.owned is not None:
            await self.hosting.reconcile(runner)  # ownership may have moved while it opened
        return runner

    async def ready(self) -> bool:
        """The broker takes work and writes succeed (``/readyz``; see ``health.py``)."""
        return self.accepting and await self._writes.writable()

    def _check_open(self) -> None:
        if not self.accepting:
            raise ShuttingDown("the server is shutting down")

    async def _announce_redrive(self, name: str, topic: str | None) -> None:
        if self.announce_redrive is not None:
            await self.announce_redrive(name, topic)

    # -- cluster mode (``hosting.QueueHosting``; ``cproxy.cluster.node`` calls these) ----------
    @property
    def owned(self) -> set[QueueRef] | None:
        """The queues this proxy serves in cluster mode; None: all (a single proxy)."""
        return self.hosting.owned

    async def serve_queue(self, topic: str, qid: int) -> None:
        await self.hosting.serve_queue(topic, qid)

    def pause_queue(self, topic: str, qid: int) -> None:
        self.hosting.pause_queue(topic, qid)

    def in_flight_on(self, topic: str, qid: int) -> int:
        return self.hosting.in_flight_on(topic, qid)

    def drop_queue(self, topic: str, qid: int) -> None:
        self.hosting.drop_queue(topic, qid)

    def note_end(self, topic: str, qid: int, end_offset: int) -> None:
        self.hosting.note_end(topic, qid, end_offset)

    async def refresh(self) -> None:
        await self.hosting.refresh()

    # -- topics --------------------------------------------------------------------------------
    async def create_topic(
        self, name: str, queues: int, retention: Retention | None = None
    ) -> tuple[TopicInfo, bool]:
        """Create a topic (idempotent). ``retention`` (``(retention_ms, retention_bytes)``)
        None means not given: an existing topic keeps its own; given and different from an
        existing topic's, it is a ``TopicConflict`` (change it with ``update_topic``)."""
        return await self._topics.create(name, queues, retention)

    async def update_topic(
        self, name: str, retention_ms: int | None, retention_bytes: int | None
    ) -> TopicInfo:
        """Set a topic's retention (None: unbounded); applied by the next retention pass."""
        return await self._topics.update(name, retention_ms, retention_bytes)

    async def delete_topic(self, name: str) -> None:
        """Delete a topic and its messages; ``TopicInUse`` (409) while a group reads it."""
        self._check_open()
        self._topics.get(name)
        async with self._group_lock:  # no group starts reading it meanwhile
            readers = sorted(g for g, runner in self.groups.items() if runner.reads(name))
            if readers:
                raise TopicInUse(
                    f"topic {name!r} is read by group(s) {readers}: delete them, or change "
                    "them to read other topics, first"
                )
            await self._topics.delete(name)

    async def apply_retention(self) -> int:
        """One retention pass over every topic with a bound; returns the messages groups lost.

        Each group that reads a trimmed queue is told its new ``min_offset``
        (``GroupRunner.note_retention``), so a group that had not read that far skips ahead
        and counts what it lost. Dead letters past their group's
        ``dead_letter_retention_ms`` are deleted in the same pass.
        """
        lost = 0
        for topic, moved in await self._topics.apply_retention(now_ms()):
            for runner in list(self.groups.values()):
                if runner.reads(topic):
                    for qid, min_offset in moved.items():
                        lost += runner.operator.note_retention(topic, qid, min_offset)
        await self.operator.expire_dead_letters()
        return lost

    def list_topics(self) -> list[TopicInfo]:
        return self._topics.all()

    def topic(self, name: str) -> TopicInfo:
        return self._topics.get(name)

    async def queue_stats(self, name: str) -> list[QueueStats]:
        return await self._topics.queue_stats(name)

    # -- produce -------------------------------------------------------------------------------
    async def produce(
        self,
        topic: str,
        messages: Sequence[NewMessage],
    ) -> list[AppendResult]:
        """Store ``messages`` atomically and wake the groups that read ``topic``.

        A message without a ``qid`` gets one here, in place: by key, else round robin.
        A message's ``delay_ms`` sets its ``deliver_at_ms`` from this clock, in place.
        A message due more than ``limits.max_delay_ms`` from now is refused (InvalidRequest).
        """
        self._check_open()
        if self.owned is not None:
            await self.hosting.know_topic(topic)
        now = now_ms()
        self._place(topic, messages, now)
        try:
            results = await self.store.append(topic, messages, now, self.settings.dedup_window_ms)
        except StoreError:
            self._writes.append_failed()
            raise
        self._writes.append_succeeded()
        self._stored(topic, results)
        return results

    def _place(
        self,
        topic: str,
        messages: Sequence[NewMessage],
        now: int,
    ) -> None:
        """Check and place messages to produce (the rules of every produce path); in
        cluster mode the caller has made sure this proxy knows the topic (``know_topic``)."""
        check_delays(messages, now, self.settings.limits.max_delay_ms)
        self._topics.place(topic, messages)

    def _stored(self, topic: str, results: Sequence[AppendResult]) -> None:
        """Messages were stored: hand them to the groups that read ``topic``."""
        stored: dict[int, list[Record]] = {}
        for result in results:
            message = result.message
            if message is not None:  # not a duplicate
                group = stored.get(result.qid)
                if group is None:
                    stored[result.qid] = [message]
                else:
                    group.append(message)
        if stored:
            # Hand the new messages to caught-up groups directly: no store read needed.
            for runner in self.groups.values():
                if runner.reads(topic):
                    runner.offer(topic, stored)
        if self._on_produced is not None:
            self._on_produced(topic, sum(map(len, stored.values())))

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

    async def put_group(
        self, name: str, config: GroupConfig, *, privileged: bool = True
    ) -> tuple[GroupConfig, bool]:
        """Create or update a group; returns ``(config, created)``. ``privileged``: the
        caller may push outside ``[push] allowed_urls`` (``cproxy.push_targets``).

        Updating a live group restarts it from its committed progress: messages in flight
        are delivered again, and acks for the old deliveries are reported as unknown.
        """
        self._check_open()
        for push in config.push.values():
            await self.push_targets.check(push.url, privileged=privileged)
        for topic in config.topics:
            if self.owned is not None:
                await self.hosting.know_topic(topic)
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
        oldest = await runner.operator.oldest_unfinished_at_ms(stats)
        now = now_ms()
        age = None if oldest is None else max(0, now - oldest)
        activity = runner.activity
        last = activity.last_pull_ms
        delivered_per_s, acked_per_s = activity.rates(now)
        return GroupView(
            name,
            runner.config,
            stats,
            dead,
            age,
            tuple(runner.push_stats()),
            consumers=tuple(runner.consumers()),
            last_pull_ms_ago=None if last is None else max(0, now - last),
            delivered_per_s=delivered_per_s,
            acked_per_s=acked_per_s,
            throttled_ms=int(runner.throttled_seconds() * 1000),
        )

    def group_stats(self) -> list[tuple[str, GroupStats]]:
        """A snapshot of every live group (for metrics)."""
        return [(name, runner.stats()) for name, runner in list(self.groups.items())]

    def throttled_seconds(self) -> list[tuple[str, float]]:
        """Per live group, the time ``max_per_second`` held ready messages back (metrics)."""
        return [(name, runner.throttled_seconds()) for name, runner in list(self.groups.items())]

    # -- consuming -----------------------------------------------------------------------------
    async def pull(
        self,
        name: str,
        max_messages: int,
        wait_ms: int,
        topics: Sequence[str] | None,
        results: Sequence[Result],
        max_per_key: int = 1,
        gone: WatchGone | None = None,
        consumer: str | None = None,
    ) -> Pulled:
        """Apply ``results``, then hand out up to ``max_messages`` (long poll up to ``wait_ms``).

        ``max_per_key`` > 1 allows same-key runs (see ``GroupEngine.pull``). ``gone`` tells
        when the caller's client disconnected (``waiters.WatchGone``): a waiting pull then
        leaves at once (``GroupRunner.pull``). ``consumer`` (the consumer's id, else its
        address) is listed in the group's stats.
        """
        limits = self.settings.limits
        if max_messages > limits.max_pull_messages:
            raise InvalidRequest(f"max_messages must be at most {limits.max_pull_messages}")
        if max_per_key > limits.max_pull_messages:
            raise InvalidRequest(f"max_per_key must be at most {limits.max_pull_messages}")
        if wait_ms > limits.max_wait_ms:
            raise InvalidRequest(f"wait_ms must be at most {limits.max_wait_ms}")
        if self.owned is not None and name not in self.groups:
            await self.refresh()  # created through another proxy moments ago?
        runner = self._runner(name)
        if self.check_lease is not None:
            # Cluster: neither take results nor hand out while ownership is unconfirmed.
            self.check_lease()
        if topics is not None:
            unknown = [t for t in topics if not runner.reads(t)]
            if unknown:
                raise InvalidRequest(f"group {name!r} does not read topic(s) {unknown}")
        started = time.perf_counter()
        result = await runner.pull(
            max_messages, wait_ms, topics, results, max_per_key, gone, consumer
        )
        if self._on_pull is not None:
            self._on_pull(name, time.perf_counter() - started)
        return result

    def ack(self, name: str, results: Sequence[Result]) -> Outcome:
        """Apply acks and fails without pulling."""
        runner = self._runner(name)
        if self.check_lease is not None:
            self.check_lease()
        return runner.apply(results)

    async def ack_with_outputs(
        self,
        name: str,
        results: Sequence[Result],
        outputs: Sequence[Output],
    ) -> tuple[Outcome, list[list[AppendResult]]]:
        """Apply ``results`` and store ``outputs`` in one store transaction (guarantee 10).

        Every result must name its attempt (``InvalidRequest`` otherwise). All of them
        current: they are applied and durable, and the outputs stored (each as ``produce``
        stores messages: placement, delays, dedup), before this returns; else
        ``StaleResults`` and nothing happens. ``StoreError``: nothing happened either, and
        the deliveries are in flight again as they were.
        """
        self._check_open()
        for result in results:
            named = result.attempts or {}
            if any(o not in named for o in [*result.acks, *(f for f, _ in result.fails)]):
                raise InvalidRequest(
                    'with produce, every result must name its attempt ({"offset", "attempt"})'
                )
        runner = self._runner(name)
        if self.check_lease is not None:
            self.check_lease()
        now = now_ms()
        for out in outputs:
            if self.owned is not None:
                await self.hosting.know_topic(out.topic)
            self._place(out.topic, out.messages, now)
        appends = [(out.topic, out.messages) for out in outputs]
        try:
            outcome, stored = await runner.apply_with(
                results, appends, self.settings.dedup_window_ms
            )
        except StoreError:
            self._writes.append_failed()
            raise
        self._writes.append_succeeded()
        for out, appended in zip(outputs, stored, strict=True):
            self._stored(out.topic, appended)
        return outcome, stored

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
        runner = self._runner(name)
        if self.check_lease is not None:
            self.check_lease()
        return runner.extend(refs, ack_timeout_ms, attempts)
