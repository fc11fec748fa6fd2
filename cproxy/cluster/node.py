"""One proxy's part in a cluster: heartbeat, claim, release and hand over its queues.

``ClusterNode`` runs beside the broker (``start``/``leave``) over the store's cluster interface
(``cproxy.store.cluster_base.ClusterStore``: membership, ownership and fencing are the
store's). Every ``heartbeat_interval_ms``, or at once when a peer frees a queue or joins (the
store's ``notify_peers``), one *round*:

1. heartbeat the membership row and renew the lease of every owned queue, both at the
   database clock; a queue missing from the renewal was taken over: its state is dropped
   (``lose``), so late results for it answer ``unknown``;
2. catch up with topics and groups changed through other proxies (``Broker.refresh``);
3. compute the assignment over the live members (``assignment.assign``); claim each queue
   assigned here that is claimable, and start serving it; mark each owned queue assigned
   elsewhere *releasing* (hand out nothing new, take results);
4. hand over each releasing queue whose in-flight messages are all answered (or whose
   ``handover_timeout_ms`` passed): its groups' final progress and the freeing of the row are
   one transaction (``ClusterStore.hand_over``). Between rounds, while a queue is releasing, its
   in-flight count is checked every ``DRAIN_POLL_S``: a planned hand-over completes as soon as
   the last delivered message is answered, not at the next heartbeat.

The lease is also checked locally on every consumer result (``check_lease``): when the last
successful renewal began more than ``lease_ms`` ago (a pause, a lost database) results are
refused with 503 until a round confirms what is still owned, so a proxy that woke from a
SIGSTOP answers ``unknown`` for queues taken meanwhile instead of acknowledging them.

New data on other proxies: the store's listener (``ClusterStore.listen``) tells the broker
(``Broker.note_end``), so a long poll answers within milliseconds.
"""

from __future__ import annotations

import logging
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
from anyio.abc import TaskGroup

from cproxy.broker import Broker
from cproxy.cluster import assignment
from cproxy.config import ClusterSettings
from cproxy.engine.records import CommitBatch
from cproxy.errors import CproxyError, QueueNotOwned, StoreError, TopicNotFound
from cproxy.store.cluster_base import ClusterStore, FinalCommit, Listener, Member, OwnerRow, TidQid

logger = logging.getLogger(__name__)

#: How often a releasing queue's in-flight count is checked between rounds (in memory, cheap).
DRAIN_POLL_S = 0.02
#: Notification payload prefix: a peer redrove a group's dead letters (JSON [node, group,
#: topic]).
_REDRIVE = "redrive:"


@dataclass(slots=True)
class Held:
    """A queue this node owns: at which epoch, and since when it is releasing (monotonic s)."""

    topic: str
    qid: int
    epoch: int
    releasing_since: float | None = None


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What ``GET /v1/cluster`` shows: live members and every queue with its owner."""

    members: list[Member]
    queues: list[OwnerRow]


class ClusterNode:
    """Build before the broker, and give it to the broker's constructor (``cluster=``: its
    groups then open with no queue, and it checks the lease and announces redrives through
    this node); ``start(broker, ...)`` after the broker started; ``leave()`` on shutdown,
    before the broker stops."""

    def __init__(self, settings: ClusterSettings, store: ClusterStore) -> None:
        self.settings = settings
        self._store = store
        self._broker: Broker | None = None
        self.node_id = settings.node_id
        self.held: dict[TidQid, Held] = {}
        self._lease_s = settings.lease_ms / 1000
        #: Monotonic time until which the lease is surely ours (start of the last renewal
        #: that succeeded + lease).
        self._valid_until = 0.0
        self._wake = anyio.Event()
        self._round_lock = anyio.Lock()
        self._leaving = False
        self._listener: Listener | None = None
        self._scope: anyio.CancelScope | None = None
        #: Peers' redrives to do here: (group, topic or None).
        self._redrives: list[tuple[str, str | None]] = []

    @property
    def broker(self) -> Broker:
        if self._broker is None:
            raise RuntimeError("the cluster node has not started")
        return self._broker

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self, broker: Broker, task_group: TaskGroup) -> None:
        """Join (the store's cluster tables, fencing and notifications on), the first round,
        then the loop; ``broker`` is the one built with ``cluster=self`` and started."""
        self._broker = broker
        await self._store.join_cluster(self.node_id)
        await self._listen()
        await self.round()
        # Peers release what the new assignment gives us now, not at their next heartbeat.
        await self._store.notify_peers(f"join:{self.node_id}")
        self._scope = anyio.CancelScope()
        task_group.start_soon(self._loop, name=f"cluster:{self.node_id}")
        logger.info("node=%s joined the cluster queues=%d", self.node_id, len(self.held))

    async def leave(self, timeout_s: float | None = None) -> None:
        """Hand every owned queue over (drain first), then leave the membership.

        Waits at most ``timeout_s`` (default: the handover timeout, else the longest ack
        timeout) for in-flight messages; queues still busy then are handed over anyway.
        """
        self._leaving = True
        limit = timeout_s if timeout_s is not None else self._handover_timeout_s()
        deadline = time.monotonic() + limit
        try:
            async with self._round_lock:
                # Out of the membership first (rounds stop heartbeating; queue leases are
                # still renewed): peers' assignment then leaves this node out, so each queue
                # is claimed the moment it is freed, not a heartbeat later.
                await self._store.leave_cluster()
                await self._store.notify_peers(f"leave:{self.node_id}")
                await self._release_all()
            while self.held:
                async with self._round_lock:
                    await self._hand_over_ready(force=time.monotonic() >= deadline)
                if self.held:
                    await anyio.sleep(0.02)
            await self._store.leave_cluster()  # a round may have raced
        except StoreError as exc:
            logger.warning("node=%s could not hand over everything: %s", self.node_id, exc)
        finally:
            if self._scope is not None:
                self._scope.cancel()
            await self._unlisten()
        logger.info("node=%s left the cluster", self.node_id)

    async def _loop(self) -> None:
        assert self._scope is not None
        with self._scope:
            while True:
                await self._until_round()
                self._wake = anyio.Event()
                try:
                    while self._redrives:
                        await self._redrive_mine(*self._redrives.pop(0))
                    await self.round()
                except StoreError as exc:
                    logger.warning("node=%s cluster round failed: %s", self.node_id, exc)
                except Exception:
                    logger.exception("node=%s cluster round crashed", self.node_id)

    async def _until_round(self) -> None:
        """Wait for the next heartbeat or a peer's wake-up; meanwhile hand over each releasing
        queue as soon as it drained (checked every ``DRAIN_POLL_S``)."""
        deadline = time.monotonic() + self.settings.heartbeat_interval_ms / 1000
        while (left := deadline - time.monotonic()) > 0:
            draining = any(h.releasing_since is not None for h in self.held.values())
            with anyio.move_on_after(min(left, DRAIN_POLL_S) if draining else left):
                await self._wake.wait()
            if self._wake.is_set():
                return
            if draining:
                try:
                    async with self._round_lock:
                        await self._hand_over_ready(force=False)
                except StoreError as exc:
                    logger.warning("node=%s hand-over failed: %s", self.node_id, exc)

    # -- the lease -----------------------------------------------------------------------------
    def lease_valid(self) -> bool:
        return time.monotonic() < self._valid_until

    def check_lease(self) -> None:
        """Raise ``StoreError`` (503) while ownership is unconfirmed; wakes a round."""
        if not self.lease_valid():
            self._wake.set()
            raise StoreError(
                "this proxy is re-checking which queues it owns (its lease ran out); retry"
            )

    # -- one round -----------------------------------------------------------------------------
    def _grace_ms(self) -> int:
        groups = {} if self._broker is None else self._broker.groups  # leave() before start
        return max((r.config.ack_timeout_ms for r in groups.values()), default=0)

    def _handover_timeout_s(self) -> float:
        ms = self.settings.handover_timeout_ms
        return (self._grace_ms() if ms is None else ms) / 1000

    async def round(self) -> None:
        """Heartbeat, renew, catch up, claim, release, hand over (see the module docstring)."""
        async with self._round_lock:
            began = time.monotonic()
            if not self._leaving:
                await self._store.heartbeat(self.settings.advertise_url, self.settings.lease_ms)
            renewed = await self._store.renew(self.settings.lease_ms, self._grace_ms())
            self._valid_until = began + self._lease_s
            for queue, held in list(self.held.items()):
                if renewed.get(queue) != held.epoch:
                    self._lose(queue, "taken over by another proxy")
            await self.broker.refresh()
            if self._listener is None or self._listener.is_closed():
                await self._listen()  # the database restarted: notifications resume
            await self._catch_up()
            if not self._leaving:
                await self._rebalance()
            await self._hand_over_ready(force=False)

    async def _catch_up(self) -> None:
        """Tell the groups each owned queue's end as the store has it: a safety net for
        notifications lost while the LISTEN connection was down (one query per topic)."""
        for topic in sorted({h.topic for h in self.held.values()}):
            try:
                queues = await self._store.queue_stats(topic)
            except TopicNotFound:
                continue  # deleted meanwhile; its queues leave with the next rows
            for stats in queues:
                self.broker.note_end(topic, stats.qid, stats.next_offset)

    async def _rebalance(self) -> None:
        members = [m.node_id for m in await self._store.live_members()]
        rows = await self._store.owner_rows()
        if self.node_id not in members:
            members.append(self.node_id)  # our heartbeat just committed; a clock race
        wanted = assignment.assign([r.ref for r in rows], members)
        for row in rows:
            queue = (row.tid, row.qid)
            mine = wanted.get(row.ref) == self.node_id
            held = self.held.get(queue)
            if mine and held is None and row.claimable:
                await self._claim(queue, row.topic, row.qid)
            elif not mine and held is not None and held.releasing_since is None:
                await self._release(queue, held)

    async def _claim(self, queue: TidQid, topic: str, qid: int) -> None:
        epoch = await self._store.claim(queue, self.settings.lease_ms, self._grace_ms())
        if epoch is None:
            return
        self.held[queue] = Held(topic, qid, epoch)
        await self.broker.serve_queue(topic, qid)
        logger.info("node=%s claimed topic=%s qid=%d epoch=%d", self.node_id, topic, qid, epoch)

    async def _release(self, queue: TidQid, held: Held) -> None:
        if not await self._store.release(queue, held.epoch):
            self._lose(queue, "not owned when releasing")
            return
        held.releasing_since = time.monotonic()
        self.broker.pause_queue(held.topic, held.qid)
        logger.info("node=%s releasing topic=%s qid=%d", self.node_id, held.topic, held.qid)

    async def _release_all(self) -> None:
        for queue, held in list(self.held.items()):
            if held.releasing_since is None:
                await self._release(queue, held)

    async def _hand_over_ready(self, *, force: bool) -> None:
        timeout_s = self._handover_timeout_s()
        now = time.monotonic()
        for queue, held in list(self.held.items()):
            if held.releasing_since is None:
                continue
            busy = self.broker.in_flight_on(held.topic, held.qid)
            if busy and not force and now - held.releasing_since < timeout_s:
                continue
            await self._hand_over(queue, held, busy)

    async def _hand_over(self, queue: TidQid, held: Held, busy: int) -> None:
        # Every group's progress writes wait meanwhile: an ack with outputs that committed
        # between our snapshot and our write would be undone by it (the final progress
        # would say its inputs are unfinished, and the new owner would deliver them again).
        async with AsyncExitStack() as stack:
            runners = list(self.broker.groups.values())
            for runner in runners:
                await stack.enter_async_context(runner.commit_lock)
            for runner in runners:
                if not await runner.resolve_outputs():
                    logger.warning(
                        "node=%s hand-over of topic=%s qid=%d waits: group=%s has a "
                        "transaction whose outcome is not known yet",
                        self.node_id, held.topic, held.qid, runner.name,
                    )  # fmt: skip
                    return
            await self._hand_over_locked(queue, held, busy)

    async def _hand_over_locked(self, queue: TidQid, held: Held, busy: int) -> None:
        batches: list[tuple[Any, CommitBatch]] = []
        for runner in list(self.broker.groups.values()):
            batch = runner.take_commit()
            # Always the queue's final progress, even when unchanged since the runner's last
            # take: that commit may still be in flight, and it will be fenced once we free
            # the queue.
            final = runner.queue_progress(held.topic, held.qid)
            if final is not None:
                batch.progress[(held.topic, held.qid)] = final
            batches.append((runner, batch))

        finals = [
            FinalCommit(runner.name, batch.progress, batch.dead_letters, batch.redrive_done)
            for runner, batch in batches
            if batch
        ]
        try:
            await self._store.hand_over(queue, held.epoch, finals)
        except QueueNotOwned as exc:
            for runner, batch in batches:
                runner.requeue(batch)
            lost = exc.refs or [(held.topic, held.qid)]
            for topic, qid in lost:
                for q, h in list(self.held.items()):
                    if (h.topic, h.qid) == (topic, qid):
                        self._lose(q, "fenced at hand-over")
            return
        except BaseException:
            for runner, batch in batches:
                runner.requeue(batch)
            raise
        self._forget(queue)
        logger.info(
            "node=%s handed over topic=%s qid=%d epoch=%d in_flight_abandoned=%d",
            self.node_id, held.topic, held.qid, held.epoch, busy,
        )  # fmt: skip

    def _forget(self, queue: TidQid) -> None:
        held = self.held.pop(queue)
        self._store.disown(queue)
        self.broker.drop_queue(held.topic, held.qid)

    def _lose(self, queue: TidQid, why: str) -> None:
        held = self.held[queue]
        logger.warning(
            "node=%s lost topic=%s qid=%d epoch=%d: %s", self.node_id, held.topic, held.qid,
            held.epoch, why,
        )  # fmt: skip
        self._forget(queue)

    # -- notifications -------------------------------------------------------------------------
    async def _listen(self) -> None:
        await self._unlisten()
        self._listener = await self._store.listen(self._on_append, self._on_peer)

    async def _unlisten(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.close()

    def _on_append(self, topic: str, qid: int, end: int) -> None:
        self.broker.note_end(topic, qid, end)

    def _on_peer(self, text: str) -> None:
        if text.startswith(_REDRIVE):
            node, group, topic = orjson.loads(text[len(_REDRIVE) :])
            if node != self.node_id:
                self._redrives.append((group, topic))  # run by the loop, in a task
        self._wake.set()

    # -- redrive -------------------------------------------------------------------------------
    # Dead letters are redriven by the owner of their queue: a redrive on any proxy redrives
    # that proxy's queues and tells the peers, which redrive theirs (a queue that moves while
    # some are redriving: its new owner picks them up when it starts serving it).
    async def announce_redrive(self, group: str, topic: str | None) -> None:
        await self._store.notify_peers(
            _REDRIVE + orjson.dumps([self.node_id, group, topic]).decode()
        )

    async def _redrive_mine(self, group: str, topic: str | None) -> None:
        runner = self.broker.groups.get(group)
        if runner is None:
            return  # not started here (yet): its queues' owners are elsewhere
        try:
            count = await runner.operator.redrive(topic)
        except CproxyError as exc:  # the database, or the topic went away meanwhile
            logger.warning(
                "node=%s group=%s redrive for a peer failed: %s", self.node_id, group, exc
            )
            return
        logger.info(
            "node=%s group=%s redriving dead_letters=%d (for a peer)", self.node_id, group, count
        )

    # -- the view ------------------------------------------------------------------------------
    async def view(self) -> ClusterView:
        """Live members (by node id) and every queue with its owner (by topic, qid)."""
        return ClusterView(await self._store.live_members(), await self._store.owner_rows())
