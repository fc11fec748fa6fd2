"""The one read loop between a ``GroupEngine`` and a message log: plan -> read -> hand back.

The engine plans plain range reads (new messages, or a range to rescan for a parked chain) and
filters what comes back itself, so a driver never needs to know which is which. The group
runner, the engine tests and the benchmarks all read through here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from cproxy.engine.cursor import FetchRequest
from cproxy.engine.group import GroupEngine
from cproxy.model import Record


class LogReader(Protocol):
    """The read side of a message log (``cproxy.store.base`` stores satisfy it)."""

    async def read(
        self, topic: str, qid: int, from_offset: int, max_count: int
    ) -> Sequence[Record]: ...


@runtime_checkable
class ManyReader(Protocol):
    """A log that reads several queues of a topic in one call (PostgreSQL: one round trip)."""

    async def read_many(
        self, topic: str, wants: Sequence[tuple[int, int, int]]
    ) -> Sequence[Sequence[Record]]: ...


async def fetch_round(engine: GroupEngine, log: LogReader, now_ms: int) -> int:
    """Make every read the engine plans now and hand each back; returns messages read.

    0 means nothing was planned or nothing was there: the engine is caught up or its buffer
    is full. Store errors propagate; a read planned but never handed back is planned again
    (the engine's fetch position did not move).
    """
    return await _serve(engine, log, engine.plan_fetches(now_ms))


async def fetch_all(engine: GroupEngine, log: LogReader, now_ms: int) -> int:
    """Read until the engine plans nothing more (the buffer is full or all is read)."""
    total = 0
    while requests := engine.plan_fetches(now_ms):
        total += await _serve(engine, log, requests)
    return total


async def _serve(engine: GroupEngine, log: LogReader, requests: Sequence[FetchRequest]) -> int:
    if len(requests) > 1 and isinstance(log, ManyReader):
        return await _serve_many(engine, log, requests)
    total = 0
    for i, request in enumerate(requests):
        try:
            messages = await log.read(
                request.topic, request.qid, request.from_offset, request.max_count
            )
        except BaseException:
            for unserved in requests[i:]:
                engine.on_fetch_failed(unserved)  # reloads are planned again
            raise
        engine.on_fetched(request, messages)
        total += len(messages)
    return total


async def _serve_many(
    engine: GroupEngine, log: ManyReader, requests: Sequence[FetchRequest]
) -> int:
    """The reads of each topic in one call; same hand-back and failure rules as ``_serve``."""
    by_topic: dict[str, list[FetchRequest]] = defaultdict(list)
    for request in requests:
        by_topic[request.topic].append(request)
    total = 0
    groups = list(by_topic.items())
    for n, (topic, group) in enumerate(groups):
        try:
            read = await log.read_many(topic, [(r.qid, r.from_offset, r.max_count) for r in group])
        except BaseException:
            for _, unserved in groups[n:]:
                for request in unserved:
                    engine.on_fetch_failed(request)  # reloads are planned again
            raise
        for request, messages in zip(group, read, strict=True):
            engine.on_fetched(request, messages)
            total += len(messages)
    return total
