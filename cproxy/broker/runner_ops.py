"""Operator calls on a running group (``OperatorCalls``, which its ``GroupRunner`` owns as
``runner.operator``): what the console and the admin API read (dead letters, the oldest
unfinished message) and do (seek, redrive, skip, release), and retention's skips. Rare calls,
kept apart from the hot path in ``runner.py``."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Sequence

from cproxy.engine.group import GroupEngine
from cproxy.engine.snapshots import GroupStats
from cproxy.errors import InvalidRequest, ReplayInProgress, StoreError
from cproxy.model import DeadLetter, MessageRef, Record
from cproxy.store.base import Store

from .clock import now_ms

# The runner's logger: these lines were always logged under it, and log settings name it.
logger = logging.getLogger("cproxy.broker.runner")

#: Messages read per store read while a replay scans a queue.
REPLAY_SCAN_BATCH = 2000


def topics_in_scope(topic: str | None, within: Collection[str] | None) -> Sequence[str | None]:
    """What a dead-letter call for ``topic`` (None: every topic) names within a token's topic
    scope ``within`` (None: any): ``[topic]``, nothing when ``topic`` is outside the scope,
    or, for every topic under a scope, each scoped topic in the store's order (topic names
    compare as bytes)."""
    if topic is not None:
        return [topic] if within is None or topic in within else []
    return [None] if within is None else sorted(within)


class OperatorCalls:
    """Operator verbs on one group's engine and its stored dead letters.

    ``commit()`` persists the group's progress and dead letters now (the runner's);
    ``wake()`` wakes the runner's loops for what the engine calls made due."""

    def __init__(
        self,
        engine: GroupEngine,
        store: Store,
        cluster: bool,
        commit: Callable[[], Awaitable[None]],
        wake: Callable[[], None],
    ) -> None:
        self.name = engine.name
        self._engine = engine
        self._store = store
        #: Cluster mode: dead letters are redriven per owner (those of the served queues).
        self._cluster = cluster
        self._commit = commit
        self._wake = wake
        #: Stored dead letters (the store's count, plus those committed since).
        self.dead_letter_count = 0
        #: Order values (topic, value) whose replay is reading the store now.
        self._replay_scans: set[tuple[str, str]] = set()

    async def count_dead_letters(self) -> None:
        """Count the stored dead letters again (at start; after a delete, as a peer in a
        cluster may delete too)."""
        self.dead_letter_count = await self._store.count_dead_letters(self.name)

    def dead_lettered(self, count: int) -> None:
        """A commit stored ``count`` new dead letters."""
        self.dead_letter_count += count

    async def oldest_unfinished_at_ms(self, stats: GroupStats) -> int | None:
        """When the oldest message not yet acked or dead-lettered was produced (ms), read
        from the store at each queue's committed offset; None when every queue is caught up."""
        oldest: int | None = None
        for q in stats.queues:
            if q.committed_offset < q.next_offset:
                try:
                    first = await self._store.read(q.topic, q.qid, q.committed_offset, 1)
                except StoreError as exc:
                    logger.warning("group=%s oldest unfinished not read: %s", self.name, exc)
                    continue
                if first:
                    at = first[0].produced_at_ms
                    oldest = at if oldest is None else min(oldest, at)
        return oldest

    async def dead_letters(
        self, topic: str | None, limit: int, within: Collection[str] | None
    ) -> list[DeadLetter]:
        """Dead letters (of ``topic``, or all; only topics in ``within`` unless it is None)."""
        # Flush first: a message just dead-lettered is listed at once (read your writes),
        # consistent with the group stats, which count pending dead letters too.
        await self._commit()
        rows: list[DeadLetter] = []
        for scoped in topics_in_scope(topic, within):
            rows += await self._store.list_dead_letters(self.name, scoped, limit - len(rows))
            if len(rows) >= limit:
                break
        return rows

    def note_retention(self, topic: str, qid: int, min_offset: int) -> int:
        """Retention deleted the queue's messages below ``min_offset``: a position behind it
        skips ahead. Returns how many messages the group lost (never read or finished)."""
        lost = self._engine.on_retention(topic, qid, min_offset)
        if lost:
            logger.warning(
                "group=%s topic=%s qid=%d lost_to_retention=%d min_offset=%d",
                self.name,
                topic,
                qid,
                lost,
                min_offset,
            )
        self._wake()  # read from the new position; a skip is persisted at once
        return lost

    # -- operator calls ------------------------------------------------------------------------
    async def seek(self, topic: str, targets: dict[int, int]) -> None:
        self._engine.seek(topic, targets)
        await self._commit()
        self._wake()
        logger.info("group=%s topic=%s seek offsets=%s", self.name, topic, targets)

    async def redrive(self, topic: str | None, refs: Collection[MessageRef] | None = None) -> int:
        """Deliver dead letters again (cluster: those of the queues this proxy owns); with
        ``refs``, only those."""
        owned = self._engine.served_queues() if self._cluster else None
        dead = await self._store.start_redrive(self.name, topic, owned, refs)
        count = self._engine.redrive(dead)
        self.dead_letter_count = max(0, self.dead_letter_count - len(dead))
        self._wake()
        await self._commit()  # dead letters of unsubscribed topics go back
        logger.info("group=%s redriving dead_letters=%d", self.name, count)
        return count

    async def replay(self, topic: str, value: str, starts: dict[int, int]) -> int:
        """Read the order value's messages from ``starts`` (qid -> offset) up to where the
        group may have finished them and deliver the finished ones again (the engine's
        ``replay``); queues this proxy does not serve are left out (cluster)."""
        key = (topic, value)
        if key in self._replay_scans or self._engine.replaying(topic, value):
            raise ReplayInProgress(f"order value {value!r} of topic {topic!r} is being replayed")
        self._replay_scans.add(key)
        try:
            bounds = self._engine.replay_bounds(topic)
            extract = self._engine.config.topics[topic].extract
            found: list[list[Record]] = []
            held = 0
            for qid, start in sorted(starts.items()):
                mine: list[Record] = []
                offset, upto = start, bounds.get(qid, start)
                while offset < upto:
                    batch = await self._store.read(topic, qid, offset, REPLAY_SCAN_BATCH)
                    if not batch:
                        break
                    for message in batch:
                        if message.offset >= upto:
                            break
                        if extract(message) == value:
                            mine.append(message)
                    offset = batch[-1].offset + 1
                held += len(mine)
                if held > self._engine.config.max_buffered:
                    raise InvalidRequest(
                        f"the replay would hold more than max_buffered "
                        f"({self._engine.config.max_buffered}) messages: replay from later"
                    )
                found.append(mine)
            count = self._engine.replay(topic, value, found)
        finally:
            self._replay_scans.discard(key)
        self._wake()
        logger.info("group=%s topic=%s replaying value=%r count=%d", self.name, topic, value, count)
        return count

    async def delete_dead_letters(
        self,
        topic: str | None,
        refs: Collection[MessageRef] | None,
        before_ms: int | None = None,
    ) -> int:
        """Delete stored dead letters (``GroupStateStore.delete_dead_letters``); returns how
        many. Pending ones are committed first, so what was just listed can be deleted."""
        await self._commit()
        deleted = await self._store.delete_dead_letters(self.name, topic, refs, before_ms)
        if deleted:
            # Counted again rather than subtracted: in a cluster a peer may delete too.
            await self.count_dead_letters()
            logger.info("group=%s deleted dead_letters=%d", self.name, deleted)
        return deleted

    def skip(self, topic: str, order_value: str | None, ref: MessageRef | None) -> MessageRef:
        done = self._engine.skip(topic, order_value, ref, now_ms())
        self._wake()
        return done

    def release(self, topic: str, order_value: str | None, ref: MessageRef | None) -> MessageRef:
        done = self._engine.release(topic, order_value, ref)
        self._wake()
        return done
