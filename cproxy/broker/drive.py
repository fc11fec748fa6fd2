"""The one read loop between a ``GroupEngine`` and a message log: plan -> read -> hand back.

The engine plans plain range reads (new messages, or a range to rescan for a parked chain) and
filters what comes back itself, so a driver never needs to know which is which. The group
runner, the engine tests and the benchmarks all read through here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from cproxy.engine.group import GroupEngine
from cproxy.engine.partition import FetchRequest
from cproxy.model import Message


class LogReader(Protocol):
    """The read side of a message log (``cproxy.store.base`` stores satisfy it)."""

    async def read(
        self, topic: str, qid: int, from_offset: int, max_count: int
    ) -> Sequence[Message]: ...


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
