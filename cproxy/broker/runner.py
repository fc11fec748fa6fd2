"""Drives one ``GroupEngine`` with a store: reading, timers, long polls and commits.

Three background tasks per group, all on the broker's event loop:

- the *fetcher* reads what the engine plans (``plan_fetches``) whenever it is kicked: a
  produce landed, acks freed buffer space for unread messages, a chain asked to be
  reloaded, a seek happened;
- the *timer* fires ack timeouts and due retries at the engine's next deadline;
- the *committer* persists progress and dead letters every ``commit_interval_ms``.

A pull that finds nothing waits in the group's FIFO of waiters (``waiters.py``): whenever
work becomes ready, a hand-out (``hand_out``, a loop callback scheduled by
``_notify_ready``) gives it to the oldest waiters, one engine pull each, and wakes only
those; idle waiters cost nothing.

Who wakes what: every engine verb records what its change made due (``cproxy.engine.effects``:
ready work, a fetch, a commit, an earlier deadline), and the runner takes those bits after
its engine calls and wakes its loops in one place, ``_wake``.

Two collaborators the runner owns carry the rare calls: ``operator`` (``runner_ops.py``: seek,
redrive, replay, skip, release, dead letters, retention skips) and ``queues``
(``runner_queues.py``: queues joining and leaving in cluster mode).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from typing import NamedTuple

import anyio
from anyio.abc import TaskGroup

from cproxy.engine.effects import COMMIT, DEADLINE, FETCH, READY
from cproxy.engine.group import GroupEngine
from cproxy.engine.group_config import GroupConfig
from cproxy.engine.records import CommitBatch, Result
from cproxy.engine.snapshots import BlockedKey, GroupStats, Handout, Outcome
from cproxy.errors import QueueNotOwned, StoreError
from cproxy.model import AppendResult, MessageRef, QueueProgress, QueueRef, Record
from cproxy.push_targets import PushTargets
from cproxy.store.base import Store

from .activity import Activity, ConsumerSeen
from .clock import monotonic_s, now_ms
from .drive import fetch_round
from .push import PushLane, PushStats
from .rate import Rate
from .runner_ops import OperatorCalls
from .runner_queues import QueueHooks
from .waiters import Waiter, Waiters, WatchGone
from .with_outputs import Append, OutputCommits

logger = logging.getLogger(__name__)


class Pulled(NamedTuple):
    """Messages handed out by a pull, and what the results sent with it did (the SDK's
    ``PullResult`` is the decoded answer on the consumer's side). A named tuple: one is
    made per pull, and a frozen dataclass's ``__init__`` costs ~1 % of the server's CPU at
    batch 10."""

    deliveries: list[Handout]
    applied: int
    unknown: list[MessageRef]


class GroupRunner:
    """The live side of one consumer group. Create with ``open``; stop with ``close``."""

    def __init__(
        self,
        store: Store,
        engine: GroupEngine,
        commit_interval_ms: int,
        push_targets: PushTargets | None = None,
        cluster: bool = False,
    ) -> None:
        """``push_targets``: where its push lanes may connect (default: no listed prefix).
        ``cluster``: serves only owned queues (dead letters are redriven per owner)."""
        self._store = store
        self._engine = engine
        self.name = engine.name
        self.cluster = cluster
        self.commit_interval_ms = commit_interval_ms
        #: Operator calls: seek, redrive, replay, skip, release, dead letters, retention.
        self.operator = OperatorCalls(engine, store, cluster, self.commit, self._wake)
        #: Cluster mode: queues joining and leaving the group.
        self.queues = QueueHooks(engine, store, self.commit, self._wake, self.queues_changed)
        self._waiters = Waiters()
        self._hand_out_due = False  # a hand-out is scheduled (``_notify_ready``)
        self._fetch_kick = anyio.Event()
        self._timer_kick = anyio.Event()
        #: When the timer task wakes next by itself (ms); 0 while it is not asleep.
        self._timer_due_ms = 0
        self._commit_kick = anyio.Event()
        #: Progress writes one at a time (a cluster hand-over holds it too): a commit's
        #: snapshot must never land after, and undo, what an ack with outputs wrote
        #: (``with_outputs``).
        self.commit_lock = anyio.Lock()
        self._outputs = OutputCommits(self.name, engine, store, self.commit_lock, self._after_apply)
        self._scope: anyio.CancelScope | None = None
        self._closed = anyio.Event()
        self._stopping = False
        #: One pusher per topic entry with ``push`` settings (cproxy.broker.push).
        targets = push_targets or PushTargets()
        self._push_lanes = [PushLane(self, t, p, targets) for t, p in engine.config.push.items()]
        #: Who pulls, and the delivery and ack rates (sampled by the timer task).
        self.activity = Activity()
        #: ``max_per_second`` (cproxy.broker.rate); None: unlimited, no cost per pull.
        per_second = engine.config.max_per_second
        self._rate = None if per_second is None else Rate(per_second)
        #: Every queue of the group's topics, owned here or not (the cluster share).
        self._total_queues = 0
        self._rate_timer: asyncio.TimerHandle | None = None

    @classmethod
    async def open(
        cls,
        store: Store,
        name: str,
        config: GroupConfig,
        task_group: TaskGroup,
        commit_interval_ms: int,
        on_ack_latency_s: Callable[[list[float]], None] | None = None,
        queues: Collection[QueueRef] | None = None,
        push_targets: PushTargets | None = None,
    ) -> GroupRunner:
        """Load progress (choosing start offsets for new queues) and start the tasks.

        ``queues`` (cluster mode) limits the group to the queues this proxy owns; None: all.
        """
        stored = await store.load_progress(name)
        progress: dict[QueueRef, QueueProgress] = {}
        ends: dict[QueueRef, int] = {}
        total_queues = 0
        for topic in config.topics:
            for stats in await store.queue_stats(topic):
                total_queues += 1
                ref = (topic, stats.qid)
                if queues is not None and ref not in queues:
                    continue
                ends[ref] = stats.next_offset
                if ref in stored:
                    progress[ref] = stored[ref]
                else:
                    start = stats.min_offset if config.start == "earliest" else stats.next_offset
                    progress[ref] = QueueProgress(start)
        engine = GroupEngine(name, config, progress, ends, on_ack_latency_s)
        runner = cls(store, engine, commit_interval_ms, push_targets, queues is not None)
        # The rates' first sample: work done before the timer's first second counts too.
        runner.activity.sample(now_ms(), *engine.delivered_and_acked())
        runner._total_queues = total_queues
        runner.queues_changed()
        redriving = await store.load_redriving(name)
        if queues is not None:  # the others' owners pick theirs up (``add_queue``)
            redriving = [d for d in redriving if (d.message.topic, d.message.qid) in progress]
        engine.redrive(redriving)
        # Before anything is handed out: persist start offsets (so "latest" means the moment
        # the group was created) and the delivery numbers this load reserves (so a late
        # result from before a restart never matches a delivery after it).
        batch = engine.take_commit()
        await store.commit(name, batch.progress, batch.dead_letters, batch.redrive_done)
        await runner.operator.count_dead_letters()
        task_group.start_soon(runner._run, name=f"group:{name}")
        logger.info(
            "group=%s started queues=%d buffered=%d",
            name,
            len(progress),
            engine.stats(now_ms()).buffered,
        )
        return runner

    async def _run(self) -> None:
        with anyio.CancelScope() as scope:
            self._scope = scope
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._supervise, "fetcher", self._fetcher)
                    tg.start_soon(self._supervise, "timer", self._timer)
                    tg.start_soon(self._supervise, "committer", self._committer)
                    for lane in self._push_lanes:
                        tg.start_soon(self._supervise, f"push:{lane.topic}", lane.run)
            finally:
                self._closed.set()

    async def _supervise(self, task: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Keep a background loop alive: a bug in one group must not stop the server."""
        while not self._stopping:
            try:
                await loop()
            except Exception:
                logger.exception("group=%s task=%s crashed; restarting in 1s", self.name, task)
                await anyio.sleep(1)

    @property
    def stopping(self) -> bool:
        """Pulls return at once: the group is being stopped."""
        return self._stopping

    def stop_pulls(self) -> None:
        """Make waiting and future long polls return at once."""
        self._stopping = True
        self._waiters.wake_all()

    async def close(self, *, commit: bool = True) -> None:
        """Stop the tasks and, unless told otherwise, persist progress one last time."""
        if self._rate_timer is not None:
            self._rate_timer.cancel()
            self._rate_timer = None
        if self._scope is not None:
            self._scope.cancel()
            await self._closed.wait()
        self.stop_pulls()
        if commit:
            await self.commit()

    # -- background tasks ----------------------------------------------------------------------
    async def _fetcher(self) -> None:
        while True:
            self._fetch_kick = anyio.Event()
            try:
                read = await fetch_round(self._engine, self._store, now_ms())
            except StoreError as exc:
                logger.warning("group=%s read failed, retrying in 1s: %s", self.name, exc)
                await anyio.sleep(1)
                continue
            self._wake()
            if not read and not self._fetch_kick.is_set():
                await self._fetch_kick.wait()

    async def _timer(self) -> None:
        while True:
            self._timer_kick = anyio.Event()
            deadline = self._engine.next_deadline_ms()
            now = now_ms()
            delay = 1.0 if deadline is None else min(1.0, max(0.0, (deadline - now) / 1000))
            self._timer_due_ms = now + int(delay * 1000)
            with anyio.move_on_after(delay):
                await self._timer_kick.wait()
            self._timer_due_ms = 0
            now = now_ms()
            self._engine.tick(now)
            self.activity.sample(now, *self._engine.delivered_and_acked())
            self._wake()

    def hand_out(self) -> int:
        """Hand ready work to waiting pulls now, oldest first; returns how many were served.

        The woken pulls return their messages when they next run; one cancelled before
        that gives them back (``Waiters.wait``)."""
        if self._stopping or not self._waiters:
            return 0
        has_work = self._engine.has_ready if self._rate is None else self._has_work_in_rate
        served = self._waiters.hand_out(has_work, self._take_for)
        if served:
            self._wake()
        return served

    def _wake(self, also: int = 0) -> None:
        """The one place the runner's loops are woken: from what the engine calls since the
        last wake made due (``GroupEngine.take_effects``), plus ``also`` (the runner's own)."""
        effects = self._engine.take_effects() | also
        if effects & READY:
            self._notify_ready()
        if effects & FETCH:
            self._fetch_kick.set()
        if effects & COMMIT:
            self._commit_kick.set()
        if effects & DEADLINE:
            self._kick_timer()

    def _kick_timer(self) -> None:
        """Wake the timer task when a deadline now falls before its planned wake-up.

        Deliveries and results usually add deadlines far in the future (ack timeouts), which
        the timer's next regular wake-up covers: waking it for each pull would cost a task
        switch and a cancel scope per call for nothing."""
        deadline = self._engine.next_deadline_ms()
        if deadline is not None and deadline < self._timer_due_ms:
            self._timer_kick.set()

    async def _committer(self) -> None:
        while True:
            self._commit_kick = anyio.Event()
            if not self._engine.needs_reserve:  # (a kick for it may predate this event)
                with anyio.move_on_after(self.commit_interval_ms / 1000):
                    await self._commit_kick.wait()
            await self.commit()

    async def commit(self) -> None:
        """Persist progress, dead letters and finished redrives now."""
        async with self.commit_lock:
            # First the acks with outputs whose transaction's outcome is unknown: a progress
            # write before that is known could undo one that did commit.
            if await self._outputs.resolve():
                await self._commit()

    async def _commit(self) -> None:
        batch = self._engine.take_commit()
        if not batch:
            return
        try:
            await self._store.commit(
                self.name, batch.progress, batch.dead_letters, batch.redrive_done
            )
        except QueueNotOwned as exc:
            # Cluster mode: another proxy took these queues over. Their state here is lost
            # (late results answer unknown); the rest of the batch goes with the next commit.
            lost = set(exc.refs)
            logger.warning("group=%s lost queues %s: their state is dropped", self.name, exc.refs)
            for topic, qid in lost:
                self._engine.drop_queue(topic, qid)
            batch.dead_letters = [
                d for d in batch.dead_letters if (d.message.topic, d.message.qid) not in lost
            ]
            self._engine.requeue(batch)
            self._wake(COMMIT)  # the rest of the batch, now
            return
        except StoreError as exc:
            logger.warning("group=%s commit failed, will retry: %s", self.name, exc)
            self._engine.requeue(batch)
            return
        self.operator.dead_lettered(len(batch.dead_letters))
        for dead in batch.dead_letters:
            logger.info(
                "group=%s topic=%s qid=%d offset=%d dead-lettered attempts=%d error=%s",
                self.name,
                dead.message.topic,
                dead.message.qid,
                dead.message.offset,
                dead.attempts,
                dead.last_error,
            )

    # -- signals -------------------------------------------------------------------------------
    def _notify_ready(self) -> None:
        """Work may be ready: hand it to waiting pulls, oldest first, in the next turn of
        the loop. Not in place, so that everything made ready in one turn (a produce batch
        over many queues, a fetch round) goes out in one pass, in as few answers as
        possible; a loop callback rather than a task woken by an event, which cost ~4 µs
        more per hand-out (a task switch)."""
        if self._waiters and not self._hand_out_due:
            self._hand_out_due = True
            asyncio.get_running_loop().call_soon(self._scheduled_hand_out)

    def _scheduled_hand_out(self) -> None:
        self._hand_out_due = False
        try:
            self.hand_out()
        except Exception:  # a bug here must not stop the server; the next produce retries
            logger.exception("group=%s hand-out to waiting pulls failed", self.name)

    def _take_for(self, waiter: Waiter) -> list[Handout]:
        return self._take(
            waiter.max_messages, waiter.topics, waiter.max_per_key, waiter.consumer, now_ms()
        )

    def _take(
        self,
        max_messages: int,
        topics: Collection[str] | None,
        max_per_key: int,
        consumer: str | None,
        now: int,
    ) -> list[Handout]:
        """One engine pull at ``now`` (ms), within ``max_per_second`` when the group has one."""
        rate = self._rate
        if rate is None:
            return self._engine.pull(max_messages, topics, now, max_per_key, consumer)
        at_s = monotonic_s()
        allowed = rate.allowance(max_messages, at_s)
        if allowed == 0:
            if self._engine.has_ready(topics):
                self._hand_out_after(rate.held_back(at_s))
            return []
        deliveries = self._engine.pull(allowed, topics, now, max_per_key, consumer)
        rate.spend(len(deliveries), at_s)
        return deliveries

    def _has_work_in_rate(self, topics: Collection[str] | None) -> bool:
        """``has_ready`` for a rate-limited group: ready work *and* a token for it; when only
        the token is missing, a hand-out is scheduled for when the next one is due."""
        if not self._engine.has_ready(topics):
            return False
        assert self._rate is not None
        now = monotonic_s()
        if self._rate.allowance(1, now):
            return True
        self._hand_out_after(self._rate.held_back(now))
        return False

    def _hand_out_after(self, delay_s: float) -> None:
        if self._rate_timer is None:
            self._rate_timer = asyncio.get_running_loop().call_later(delay_s, self._rate_due)

    def _rate_due(self) -> None:
        self._rate_timer = None
        self._scheduled_hand_out()

    def queues_changed(self) -> None:
        """The queues served here changed (cluster): the rate follows the owned share."""
        if self._rate is not None and self._total_queues:
            owned = len(self._engine.served_queues())
            self._rate.set_share(owned / self._total_queues if self.cluster else 1.0)

    def throttled_seconds(self) -> float:
        """Time ``max_per_second`` held ready messages back (0 without a limit)."""
        return 0.0 if self._rate is None else self._rate.throttled_seconds(monotonic_s())

    @property
    def waiting_pulls(self) -> int:
        """Long polls waiting for work now."""
        return len(self._waiters)

    def offer(self, topic: str, stored: Mapping[int, Sequence[Record]]) -> None:
        """A produce's just-stored messages, per queue (qid -> consecutive messages): taken
        directly by caught-up queues, else read by the fetcher. One hand-off for the whole
        batch: waiting pulls are woken once, and the fetcher kicked once."""
        for qid, messages in stored.items():
            self._engine.offer(topic, qid, messages)
        self._wake()

    # -- commits of a cluster hand-over (``cproxy.cluster.node``) -------------------------------
    def queue_progress(self, topic: str, qid: int) -> QueueProgress | None:
        """The queue's progress as it would be persisted now; None when not served."""
        return self._engine.queue_progress(topic, qid)

    def take_commit(self) -> CommitBatch:
        """Everything to persist now (the hand-over commits it in its own transaction)."""
        return self._engine.take_commit()

    def requeue(self, batch: CommitBatch) -> None:
        """A batch from ``take_commit`` was not written: keep it for the next commit."""
        self._engine.requeue(batch)

    # -- views ---------------------------------------------------------------------------------
    @property
    def config(self) -> GroupConfig:
        return self._engine.config

    @property
    def dead_letter_count(self) -> int:
        """Stored dead letters (pending ones are in ``stats()``)."""
        return self.operator.dead_letter_count

    def reads(self, topic: str) -> bool:
        """Whether the group subscribes to ``topic``."""
        return self._engine.reads(topic)

    def stats(self) -> GroupStats:
        return self._engine.stats(now_ms())

    def blocked_keys(self, topic: str | None) -> list[BlockedKey]:
        return self._engine.blocked_keys(now_ms(), topic)

    def consumers(self) -> list[ConsumerSeen]:
        """Consumers that pulled in the last five minutes, with their messages in flight."""
        return self.activity.consumers(now_ms(), self._engine.in_flight_by_consumer())

    def push_stats(self) -> list[PushStats]:
        """The state of each topic's pusher (none when no topic entry has ``push``)."""
        return [lane.stats() for lane in self._push_lanes]

    # -- consumer calls ------------------------------------------------------------------------
    def apply(self, results: Iterable[Result]) -> Outcome:
        outcome = self._engine.apply_results(results, now_ms())
        self._after_apply(outcome)
        return outcome

    def _after_apply(self, outcome: Outcome) -> None:
        self._wake()

    async def resolve_outputs(self) -> bool:
        """With ``commit_lock`` held: settle acks with outputs whose transaction's outcome
        was unknown (``with_outputs``); False while one still is."""
        return await self._outputs.resolve()

    async def apply_with(
        self, results: Sequence[Result], outputs: Sequence[Append], dedup_window_ms: int
    ) -> tuple[Outcome, list[list[AppendResult]]]:
        """Apply ``results`` and store ``outputs`` in one store transaction (guarantee 10;
        ``with_outputs``): ``StaleResults`` when a result is not current, the store's error
        when the transaction fails; nothing happens in either case."""
        outcome, stored = await self._outputs.commit(results, outputs, dedup_window_ms)
        self._after_apply(outcome)
        return outcome, stored

    async def pull(
        self,
        max_messages: int,
        wait_ms: int,
        topics: Collection[str] | None,
        results: Sequence[Result],
        max_per_key: int = 1,
        gone: WatchGone | None = None,
        consumer: str | None = None,
    ) -> Pulled:
        """Apply ``results``, then hand out up to ``max_messages``, waiting up to ``wait_ms``.

        ``consumer`` names the puller (the group's stats list it); None: the proxy's own
        pusher.

        ``gone``, when given, tells when the caller is gone (its client disconnected;
        ``waiters.WatchGone``): a pull waiting then leaves the line and answers nothing;
        messages handed to it at that moment go back, uncharged.
        """
        applied, unknown = self.apply(results) if results else Outcome(0, [])
        if self._stopping:
            return Pulled([], applied, unknown)
        now = now_ms()
        if consumer is not None:
            self.activity.pulled(consumer, now)
        deliveries = self._take(max_messages, topics, max_per_key, consumer, now)
        if not deliveries and wait_ms > 0:
            waiter = Waiter(max_messages, topics, max_per_key, consumer)
            deliveries = await self._waiters.wait(waiter, wait_ms / 1000, gone, self._give_back)
        if deliveries:
            self._wake()
        return Pulled(deliveries, applied, unknown)

    def _give_back(self, deliveries: list[Handout]) -> None:
        if not deliveries:
            return
        refs = [d.message.ref for d in deliveries]
        self.release_uncharged(refs, {d.message.ref: d.attempt for d in deliveries})
        logger.info("group=%s pull cancelled: %d handed message(s) back", self.name, len(refs))

    def release_uncharged(
        self, refs: Iterable[MessageRef], attempts: Mapping[MessageRef, int]
    ) -> Outcome:
        """Deliveries that never reached their consumer go back, no attempt charged."""
        outcome = self._engine.release_uncharged(refs, attempts)
        self._wake()
        return outcome

    def extend(
        self,
        refs: Iterable[MessageRef],
        ack_timeout_ms: int,
        attempts: Mapping[MessageRef, int] | None = None,
    ) -> Outcome:
        return self._engine.extend(refs, ack_timeout_ms, now_ms(), attempts)
