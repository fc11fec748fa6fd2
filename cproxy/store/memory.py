"""An in-memory ``Store`` for unit tests: same rules as the SQLite store, nothing persisted."""

from __future__ import annotations

import dataclasses
from bisect import bisect_left
from collections.abc import Collection, Mapping, Sequence
from operator import attrgetter

from cproxy.errors import StoreError, TopicConflict
from cproxy.model import (
    AppendResult,
    DeadLetter,
    MessageRef,
    NewMessage,
    QueueProgress,
    QueueRef,
    QueueStats,
    Record,
    TopicInfo,
)
from cproxy.store._common import (
    check_qid,
    check_queues,
    dead_letters_matching,
    dedup_live,
    message_qids,
    topic_not_found,
)
from cproxy.store._retention import check_retention, message_bytes

__all__ = ["MemoryStore"]

_produced_at = attrgetter("produced_at_ms")


def _size(m: Record) -> int:
    return message_bytes(m.body_json, m.headers_json, m.key, m.id)


@dataclasses.dataclass(slots=True)
class _Topic:
    #: Stored messages per queue; ``queues[qid][i]`` has offset ``floors[qid] + i``.
    queues: list[list[Record]]
    floors: list[int]
    retention_ms: int | None = None
    retention_bytes: int | None = None
    #: id -> (qid, offset, produced_at_ms), oldest first, so pruning stops at the first live entry.
    dedup: dict[str, tuple[int, int, int]] = dataclasses.field(default_factory=dict)


class MemoryStore:
    """Keeps everything in dicts and lists. Usable between ``open()`` and ``close()``."""

    def __init__(self) -> None:
        self._open = False
        self._topics: dict[str, _Topic] = {}
        self._groups: dict[str, bytes] = {}
        self._progress: dict[str, dict[QueueRef, QueueProgress]] = {}
        self._dead: dict[str, dict[MessageRef, DeadLetter]] = {}
        self._max_window_ms = 0

    async def open(self) -> None:
        self._open = True

    async def close(self) -> None:
        self._open = False

    async def ping(self) -> bool:
        return self._open

    def _check_open(self) -> None:
        if not self._open:
            raise StoreError("the store is closed")

    def _topic(self, name: str) -> _Topic:
        self._check_open()
        try:
            return self._topics[name]
        except KeyError:
            raise topic_not_found(name) from None

    # -- topics --------------------------------------------------------------------------------
    @staticmethod
    def _info(name: str, t: _Topic) -> TopicInfo:
        return TopicInfo(name, len(t.queues), t.retention_ms, t.retention_bytes)

    async def create_topic(
        self,
        name: str,
        queues: int,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
    ) -> tuple[TopicInfo, bool]:
        self._check_open()
        check_queues(queues)
        check_retention(retention_ms, retention_bytes)
        existing = self._topics.get(name)
        if existing is not None:
            if len(existing.queues) != queues:
                raise TopicConflict(
                    f"topic {name!r} exists with {len(existing.queues)} queues, not {queues}"
                )
            return self._info(name, existing), False
        t = _Topic([[] for _ in range(queues)], [0] * queues, retention_ms, retention_bytes)
        self._topics[name] = t
        return self._info(name, t), True

    async def update_topic(
        self, name: str, retention_ms: int | None, retention_bytes: int | None
    ) -> TopicInfo:
        t = self._topic(name)
        check_retention(retention_ms, retention_bytes)
        t.retention_ms, t.retention_bytes = retention_ms, retention_bytes
        return self._info(name, t)

    async def delete_topic(self, name: str) -> None:
        self._topic(name)
        del self._topics[name]
        for progress in self._progress.values():
            for ref in [r for r in progress if r[0] == name]:
                del progress[ref]
        for dead in self._dead.values():
            for message_ref in [r for r in dead if r[0] == name]:
                del dead[message_ref]

    async def list_topics(self) -> list[TopicInfo]:
        self._check_open()
        return [self._info(name, t) for name, t in sorted(self._topics.items())]

    async def queue_stats(self, topic: str) -> list[QueueStats]:
        t = self._topic(topic)
        return [
            QueueStats(qid, floor, floor + len(q))
            for qid, (floor, q) in enumerate(zip(t.floors, t.queues, strict=True))
        ]

    async def apply_retention(self, topic: str, now_ms: int) -> dict[int, int]:
        t = self._topic(topic)
        moved: dict[int, int] = {}
        for qid, q in enumerate(t.queues):
            drop = 0
            if t.retention_ms is not None:
                drop = bisect_left(q, now_ms - t.retention_ms, key=_produced_at)
            if t.retention_bytes is not None:
                excess = sum(_size(m) for m in q) - t.retention_bytes
                i = 0
                while excess > 0:
                    excess -= _size(q[i])
                    i += 1
                drop = max(drop, i)
            if drop:
                del q[:drop]
                t.floors[qid] += drop
                moved[qid] = t.floors[qid]
        return moved

    # -- messages ------------------------------------------------------------------------------
    async def append(
        self,
        topic: str,
        messages: Sequence[NewMessage],
        now_ms: int,
        dedup_window_ms: int,
    ) -> list[AppendResult]:
        t = self._topic(topic)
        qids = message_qids(topic, messages, len(t.queues))
        # Build everything aside first and apply only at the end, so a failure stores nothing.
        pending: dict[int, list[Record]] = {}
        new_ids: dict[str, tuple[int, int, int]] = {}
        results: list[AppendResult] = []
        for qid, m in zip(qids, messages, strict=True):
            if m.id is not None:
                hit = new_ids.get(m.id) or t.dedup.get(m.id)
                if hit is not None and dedup_live(hit[2], now_ms, dedup_window_ms):
                    results.append(AppendResult(hit[0], hit[1], True, hit[2]))
                    continue
            stored = t.queues[qid]
            batch = pending.setdefault(qid, [])
            offset = t.floors[qid] + len(stored) + len(batch)
            last = batch[-1] if batch else (stored[-1] if stored else None)
            produced_at = now_ms if last is None else max(now_ms, last.produced_at_ms)
            message = Record(
                topic, qid, offset, m.key, m.body_json, m.headers_json, m.id, produced_at,
                m.deliver_at_ms,
            )  # fmt: skip
            batch.append(message)
            if m.id is not None and dedup_window_ms > 0:
                new_ids[m.id] = (qid, offset, produced_at)
            results.append(AppendResult(qid, offset, False, produced_at, message))
        for qid, batch in pending.items():
            t.queues[qid].extend(batch)
        for msg_id, entry in new_ids.items():
            # Re-insert at the end to keep the dict ordered by age.
            t.dedup.pop(msg_id, None)
            t.dedup[msg_id] = entry
        self._max_window_ms = max(self._max_window_ms, dedup_window_ms)
        self._prune(t, now_ms)
        return results

    def _prune(self, t: _Topic, now_ms: int) -> None:
        expired: list[str] = []
        for msg_id, (_, _, produced_at) in t.dedup.items():
            if dedup_live(produced_at, now_ms, self._max_window_ms):
                break
            expired.append(msg_id)
        for msg_id in expired:
            del t.dedup[msg_id]

    async def read(self, topic: str, qid: int, from_offset: int, max_count: int) -> list[Record]:
        t = self._topic(topic)
        check_qid(topic, qid, len(t.queues))
        if max_count <= 0:
            return []
        start = max(from_offset - t.floors[qid], 0)
        return t.queues[qid][start : start + max_count]

    async def offset_for_time(self, topic: str, qid: int, timestamp_ms: int) -> int:
        t = self._topic(topic)
        check_qid(topic, qid, len(t.queues))
        return t.floors[qid] + bisect_left(t.queues[qid], timestamp_ms, key=_produced_at)

    # -- groups --------------------------------------------------------------------------------
    async def save_group(self, name: str, config_json: bytes) -> None:
        self._check_open()
        self._groups[name] = bytes(config_json)

    async def load_groups(self) -> dict[str, bytes]:
        self._check_open()
        return dict(self._groups)

    async def delete_group(self, name: str) -> None:
        self._check_open()
        self._groups.pop(name, None)
        self._progress.pop(name, None)
        self._dead.pop(name, None)

    async def load_progress(self, group: str) -> dict[QueueRef, QueueProgress]:
        self._check_open()
        return dict(self._progress.get(group, {}))

    async def commit(
        self,
        group: str,
        progress: Mapping[QueueRef, QueueProgress],
        dead_letters: Sequence[DeadLetter] = (),
        redrive_done: Sequence[MessageRef] = (),
    ) -> None:
        self._check_open()
        # Validate before touching anything: the commit is all or nothing.
        for topic, _ in progress:
            self._topic(topic)
        for dl in dead_letters:
            self._topic(dl.message.topic)
        self._progress.setdefault(group, {}).update(progress)
        dead = self._dead.setdefault(group, {})
        # Deletes go first so a redriven message that was dead-lettered again stays dead.
        for ref in redrive_done:
            dead.pop(ref, None)
        for dl in dead_letters:
            dead[dl.message.ref] = dl if dl.group == group else dataclasses.replace(dl, group=group)

    async def commit_with_outputs(
        self,
        group: str,
        progress: Mapping[QueueRef, QueueProgress],
        outputs: Sequence[tuple[str, Sequence[NewMessage]]],
        now_ms: int,
        dedup_window_ms: int,
        redrive_done: Sequence[MessageRef] = (),
    ) -> list[list[AppendResult]]:
        self._check_open()
        # Validate everything first: after that neither the appends nor the commit can fail,
        # and nothing awaits in between, so the whole call is one step.
        for topic, messages in outputs:
            message_qids(topic, messages, len(self._topic(topic).queues))
        for topic, _ in progress:
            self._topic(topic)
        results = [await self.append(t, ms, now_ms, dedup_window_ms) for t, ms in outputs]
        await self.commit(group, progress, (), redrive_done)
        return results

    # -- dead letters --------------------------------------------------------------------------
    def _sorted_dead(self, group: str, topic: str | None, redriving: bool) -> list[DeadLetter]:
        self._check_open()
        dead = self._dead.get(group, {})
        return [
            dl
            for ref, dl in sorted(dead.items())
            if dl.redriving is redriving and (topic is None or ref[0] == topic)
        ]

    async def list_dead_letters(
        self, group: str, topic: str | None, limit: int
    ) -> list[DeadLetter]:
        return self._sorted_dead(group, topic, redriving=False)[: max(limit, 0)]

    async def count_dead_letters(self, group: str) -> int:
        self._check_open()
        return sum(not dl.redriving for dl in self._dead.get(group, {}).values())

    async def start_redrive(
        self,
        group: str,
        topic: str | None,
        queues: Collection[QueueRef] | None = None,
        refs: Collection[MessageRef] | None = None,
    ) -> list[DeadLetter]:
        wanted = None if queues is None else set(queues)
        named = None if refs is None else set(refs)
        marked = [
            dataclasses.replace(dl, redriving=True)
            for dl in self._sorted_dead(group, topic, redriving=False)
            if (wanted is None or (dl.message.topic, dl.message.qid) in wanted)
            and (named is None or dl.message.ref in named)
        ]
        dead = self._dead.get(group, {})
        for dl in marked:
            dead[dl.message.ref] = dl
        return marked

    async def load_redriving(self, group: str) -> list[DeadLetter]:
        return self._sorted_dead(group, None, redriving=True)

    async def delete_dead_letters(
        self,
        group: str,
        topic: str | None = None,
        refs: Collection[MessageRef] | None = None,
        before_ms: int | None = None,
    ) -> int:
        doomed = dead_letters_matching(
            self._sorted_dead(group, topic, redriving=False), refs, before_ms
        )
        dead = self._dead.get(group, {})
        for dl in doomed:
            del dead[dl.message.ref]
        return len(doomed)
