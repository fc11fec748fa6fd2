"""Operator actions: seek, dead letters (list, redrive, delete, expire), blocked keys, skip,
release, and the message browser (reading stored messages without any group).

``OperatorActions``, a collaborator the ``Broker`` owns (``Broker.operator``), is what the admin
API and the console call; each verb looks the group up by name and hands the action to its
runner.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence

from cproxy.engine.snapshots import BlockedKey
from cproxy.errors import InvalidRequest
from cproxy.model import DeadLetter, MessageRef, Record
from cproxy.placement import queue_for_key

from .clock import now_ms
from .runner import GroupRunner
from .runner_ops import topics_in_scope
from .topics import SeekTarget, Topics


class OperatorActions:
    """Operator verbs over the broker's groups.

    ``runner(name)`` finds a live group's runner (refused while the broker shuts down);
    ``groups`` are the live runners by name; ``check_open`` refuses work while the broker
    shuts down; ``announce_redrive(group, topic)`` tells the cluster's peers of a redrive
    (a no-op on a single proxy)."""

    def __init__(
        self,
        topics: Topics,
        groups: Mapping[str, GroupRunner],
        runner: Callable[[str], GroupRunner],
        check_open: Callable[[], None],
        announce_redrive: Callable[[str, str | None], Awaitable[None]],
    ) -> None:
        self._topics = topics
        self._groups = groups
        self._runner = runner
        self._check_open = check_open
        self._announce_redrive = announce_redrive

    async def seek(self, name: str, topic: str, qid: int | None, to: SeekTarget) -> dict[int, int]:
        """Move a group's position on one queue (or all queues) of ``topic``."""
        runner = self._runner(name)
        self._topics.get(topic)
        if not runner.reads(topic):
            raise InvalidRequest(f"group {name!r} does not read topic {topic!r}")
        targets = await self._topics.seek_targets(topic, qid, to)
        await runner.operator.seek(topic, targets)
        return targets

    async def replay(
        self, name: str, topic: str, order_value: str, start: SeekTarget
    ) -> tuple[int, int]:
        """Deliver one order value's finished messages again (from ``start``), in order,
        without moving committed offsets; returns (replaying, lost_to_retention).

        With ``order_by: key`` only the key's queue is scanned, with a JSON path every queue
        of the topic (this proxy's, in a cluster). ``order_by`` qid or none: 422 (a seek
        does that).
        """
        runner = self._runner(name)
        info = self._topics.get(topic)
        if not runner.reads(topic):
            raise InvalidRequest(f"group {name!r} does not read topic {topic!r}")
        spec = runner.config.topics[topic].spec
        if spec in ("qid", "none"):
            raise InvalidRequest(
                f"topic {topic!r} is read with order_by {spec!r}: it has no order values to "
                "replay (use seek)"
            )
        qids = [queue_for_key(order_value, info.queues)] if spec == "key" else range(info.queues)
        starts = await self._topics.replay_starts(topic, qids, start)
        replaying = await runner.operator.replay(
            topic, order_value, {q: b for q, (b, _) in starts.items()}
        )
        return replaying, sum(lost for _, lost in starts.values())

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
        return await self._runner(name).operator.dead_letters(topic, limit, within)

    async def redrive(
        self,
        name: str,
        topic: str | None,
        within: Collection[str] | None = None,
        refs: Sequence[MessageRef] | None = None,
    ) -> int:
        """Deliver the group's dead letters (of ``topic``, or all) again; returns how many.

        ``within`` (a token's topic scope; None: any) leaves dead letters of other topics
        untouched. Cluster mode: this proxy redrives those of the queues it owns (the count)
        and tells its peers, which redrive theirs at once. ``refs`` redrives just those
        dead letters (cluster mode: those of queues this proxy owns), in their per-key order.
        """
        runner = self._runner(name)
        if refs is not None:
            outside = sorted({r[0] for r in refs if within is not None and r[0] not in within})
            if outside:
                raise InvalidRequest(f"dead letters of topic(s) {outside} are outside the scope")
            return await runner.operator.redrive(topic, refs)
        topics = topics_in_scope(topic, within)
        if topic is None and within is not None:
            # Only dead letters of topics the group reads are delivered again; others stay put.
            topics = [t for t in topics if t in runner.config.topics]
        count = 0
        for t in topics:
            count += await runner.operator.redrive(t)
            await self._announce_redrive(name, t)
        return count

    async def delete_dead_letters(
        self,
        name: str,
        topic: str | None,
        refs: Sequence[MessageRef] | None,
        within: Collection[str] | None = None,
    ) -> int:
        """Delete the named dead letters (``refs``) or all of ``topic``; returns how many.

        One of the two is required (deleting every dead letter of a group is a purge per
        topic). ``within`` (a token's topic scope; None: any) leaves other topics untouched.
        """
        if (refs is None) == (topic is None):
            raise InvalidRequest("name the dead letters ('messages') or a 'topic', not both")
        runner = self._runner(name)
        if refs is not None:
            refs = [r for r in refs if within is None or r[0] in within]
            return await runner.operator.delete_dead_letters(None, refs)
        if within is not None and topic not in within:
            return 0
        return await runner.operator.delete_dead_letters(topic, None)

    async def expire_dead_letters(self) -> int:
        """The retention pass over dead letters: each group with ``dead_letter_retention_ms``
        loses those older than that; returns how many were deleted."""
        deleted = 0
        now = now_ms()
        for runner in list(self._groups.values()):
            keep_ms = runner.config.dead_letter_retention_ms
            if keep_ms is not None:
                deleted += await runner.operator.delete_dead_letters(None, None, now - keep_ms)
        return deleted

    async def browse(
        self,
        topic: str,
        qid: int | None,
        from_offset: int | None = None,
        from_ms: int | None = None,
        last: int | None = None,
        limit: int = 50,
    ) -> tuple[int, list[Record], int]:
        """Stored messages of one queue without any group, attempt or hold: ``(qid,
        messages, next offset)`` (``Topics.browse``)."""
        self._check_open()
        return await self._topics.browse(topic, qid, from_offset, from_ms, last, limit)

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
        return self._runner(name).operator.skip(topic, order_value, ref)

    def release(
        self, name: str, topic: str, order_value: str | None, ref: MessageRef | None
    ) -> MessageRef:
        """Deliver a retrying or exhausted head again now, with a fresh attempt budget."""
        return self._runner(name).operator.release(topic, order_value, ref)
