"""The topic catalogue of one broker: topics as the store has them, cached for the hot path.

It places produced messages on queues (``cproxy.placement``), resolves seek targets to
offsets, and runs the store's retention. The ``Broker`` facade calls it; nothing above the
broker does.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Sequence

from cproxy.errors import InvalidRequest, TopicConflict, TopicNotFound
from cproxy.model import NewMessage, QueueStats, Record, TopicInfo
from cproxy.placement import place as place_on_queues
from cproxy.store.base import MessageLog

logger = logging.getLogger(__name__)

#: ``(retention_ms, retention_bytes)``; None in either place means unbounded.
Retention = tuple[int | None, int | None]
#: "earliest", "latest", an offset, or ``{"timestamp_ms": n}``.
SeekTarget = str | int | dict[str, int]


def retention_of(info: TopicInfo) -> Retention:
    return info.retention_ms, info.retention_bytes


class Topics:
    def __init__(self, log: MessageLog) -> None:
        self._log = log
        self._topics: dict[str, TopicInfo] = {}
        self._round_robin: dict[str, itertools.count[int]] = {}

    async def load(self) -> None:
        """Read every stored topic (at start)."""
        for topic in await self._log.list_topics():
            self._topics[topic.name] = topic

    def all(self) -> list[TopicInfo]:
        return sorted(self._topics.values(), key=lambda t: t.name)

    def get(self, name: str) -> TopicInfo:
        info = self._topics.get(name)
        if info is None:
            raise TopicNotFound(f"topic {name!r} does not exist")
        return info

    def names(self) -> list[str]:
        return list(self._topics)

    async def queue_stats(self, name: str) -> list[QueueStats]:
        self.get(name)
        return await self._log.queue_stats(name)

    async def create(
        self, name: str, queues: int, retention: Retention | None
    ) -> tuple[TopicInfo, bool]:
        """Create a topic (idempotent). ``retention`` None means not given: an existing topic
        keeps its own; given and different from an existing topic's, it is a conflict."""
        info, created = await self._log.create_topic(name, queues, *(retention or (None, None)))
        self._topics[name] = info
        if created:
            logger.info(
                "topic=%s created queues=%d retention_ms=%s retention_bytes=%s",
                name,
                queues,
                info.retention_ms,
                info.retention_bytes,
            )
        elif retention is not None and retention != retention_of(info):
            raise TopicConflict(
                f"topic {name!r} exists with retention_ms={info.retention_ms} and "
                f"retention_bytes={info.retention_bytes}; change them with PATCH"
            )
        return info, created

    async def update(
        self, name: str, retention_ms: int | None, retention_bytes: int | None
    ) -> TopicInfo:
        self.get(name)
        info = await self._log.update_topic(name, retention_ms, retention_bytes)
        self._topics[name] = info
        return info

    async def delete(self, name: str) -> None:
        self.get(name)
        await self._log.delete_topic(name)
        self._topics.pop(name, None)
        self._round_robin.pop(name, None)
        logger.info("topic=%s deleted", name)

    def place(self, topic: str, messages: Sequence[NewMessage]) -> None:
        """Give each message without a ``qid`` one, in place: by key, else round robin."""
        rr = self._round_robin.setdefault(topic, itertools.count())
        # queues >= 1: stores refuse fewer. The loop is compiled (cproxy.placement).
        place_on_queues(topic, self.get(topic).queues, messages, rr)

    async def seek_targets(self, topic: str, qid: int | None, to: SeekTarget) -> dict[int, int]:
        """The offset per queue (one, or all of the topic) that ``to`` names."""
        stats = {s.qid: s for s in await self.queue_stats(topic)}
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
                targets[q] = await self._log.offset_for_time(topic, q, to["timestamp_ms"])
            else:
                raise InvalidRequest(
                    "'to' must be 'earliest', 'latest', an offset or {'timestamp_ms': n}"
                )
        return targets

    async def replay_starts(
        self, topic: str, qids: Iterable[int], start: SeekTarget
    ) -> dict[int, tuple[int, int]]:
        """Per queue: where a replay from ``start`` begins, and how many messages of the
        requested range retention already deleted. ``"earliest"`` asks for everything ever
        stored (offset 0 on); for a time, the deleted messages count when the oldest one
        kept is newer than that time (some deleted ones may be newer too)."""
        stats = {s.qid: s for s in await self.queue_stats(topic)}
        out: dict[int, tuple[int, int]] = {}
        for q in qids:
            s = stats[q]
            if start == "earliest":
                wanted = 0
            elif isinstance(start, int):
                wanted = start
            elif isinstance(start, dict):
                at = start["timestamp_ms"]
                wanted = await self._log.offset_for_time(topic, q, at)
                if wanted <= s.min_offset and s.min_offset > 0:
                    first = await self._log.read(topic, q, s.min_offset, 1)
                    if first and first[0].produced_at_ms > at:
                        wanted = 0
            else:
                raise InvalidRequest("'from' must be 'earliest', an offset or {'timestamp_ms': n}")
            begin = min(max(wanted, s.min_offset), s.next_offset)
            out[q] = (begin, max(0, min(s.min_offset, s.next_offset) - wanted))
        return out

    async def browse(
        self,
        topic: str,
        qid: int | None,
        from_offset: int | None,
        from_ms: int | None,
        last: int | None,
        limit: int,
    ) -> tuple[int, list[Record], int]:
        """Stored messages of one queue, read without any group: ``(qid, messages, next)``.

        From ``from_offset`` (default: the oldest stored), the first at or after ``from_ms``,
        or the newest ``last``; at most ``limit``. ``next`` is the offset to continue from.
        ``qid`` may be left out on a topic with one queue.
        """
        queues = self.get(topic).queues
        if qid is None:
            if queues != 1:
                raise InvalidRequest(f"name the queue: topic {topic!r} has {queues} queues (qid)")
            qid = 0
        if not 0 <= qid < queues:
            raise InvalidRequest(f"qid {qid} is out of range: topic {topic!r} has {queues} queues")
        if sum(x is not None for x in (from_offset, from_ms, last)) > 1:
            raise InvalidRequest("give at most one of 'from', 'from_ms' and 'last'")
        stats = next(s for s in await self._log.queue_stats(topic) if s.qid == qid)
        if from_ms is not None:
            start = await self._log.offset_for_time(topic, qid, from_ms)
        elif last is not None:
            start = max(stats.min_offset, stats.next_offset - last)
            limit = min(limit, last)
        else:
            start = max(from_offset or 0, stats.min_offset)
        messages = await self._log.read(topic, qid, start, limit)
        return qid, messages, messages[-1].offset + 1 if messages else start

    async def apply_retention(self, now_ms: int) -> list[tuple[str, dict[int, int]]]:
        """One retention pass: ``(topic, {qid: new min_offset})`` for every trimmed topic."""
        out: list[tuple[str, dict[int, int]]] = []
        for info in list(self._topics.values()):
            if info.retention_ms is None and info.retention_bytes is None:
                continue
            try:
                moved = await self._log.apply_retention(info.name, now_ms)
            except TopicNotFound:
                continue  # deleted meanwhile
            if moved:
                out.append((info.name, moved))
        return out
