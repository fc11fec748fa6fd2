"""The message browser and dead letters one by one at the broker, over the memory store."""

from __future__ import annotations

import time
from dataclasses import replace

import anyio
import orjson
import pytest

from cproxy.engine.records import Result
from cproxy.errors import InvalidRequest
from cproxy.model import NewMessage
from cproxy.store.memory import MemoryStore
from tests.broker.test_broker import SETTINGS, config, running


async def test_browsing_reads_stored_messages_and_never_delivers() -> None:
    store = MemoryStore()
    async with running(store) as broker:
        await broker.create_topic("t", 1, (None, 4))  # keeps 4 bytes: 2 messages ("k" + 1 digit)
        await broker.put_group("g", config(max_attempts=1))
        await broker.produce("t", [NewMessage("k", orjson.dumps(i)) for i in range(5)])
        qid, got, after = await broker.operator.browse("t", None, last=2)
        assert (qid, [m.offset for m in got], after) == (0, [3, 4], 5)
        await broker.apply_retention()  # offsets 3 and 4 stay
        _, got, after = await broker.operator.browse("t", 0, from_offset=0, limit=10)
        assert ([m.offset for m in got], after) == ([3, 4], 5)  # from below min_offset
        _, got, after = await broker.operator.browse("t", 0, from_offset=9)
        assert (got, after) == ([], 9)
        with pytest.raises(InvalidRequest):
            await broker.operator.browse("t", 0, from_offset=1, last=1)
        with pytest.raises(InvalidRequest):
            await broker.operator.browse("t", 1)
        stats = broker.groups["g"].stats()
        assert stats.in_flight == 0 and all(t.delivered == 0 for t in stats.topics)


async def test_dead_letters_redriven_one_by_one_deleted_and_aged_out() -> None:
    store = MemoryStore()
    async with running(store, replace(SETTINGS, retention_interval_ms=60_000)) as broker:
        await broker.create_topic("t", 1)
        await broker.put_group("g", config(max_attempts=1, dead_letter_retention_ms=1))
        await broker.produce("t", [NewMessage("k", orjson.dumps(i)) for i in range(3)])
        for _ in range(3):
            [d] = (await broker.pull("g", 10, 1000, None, [])).deliveries
            broker.ack("g", [Result("t", 0, fails=[(d.message.offset, "boom")])])
        assert len(await broker.operator.dead_letters("g", None, 10)) == 3
        assert await broker.operator.redrive("g", None, refs=[("t", 0, 1)]) == 1
        [again] = (await broker.pull("g", 10, 1000, None, [])).deliveries
        # A fresh charge budget; the delivery number goes on above the earlier deliveries.
        assert (again.message.offset, again.charged) == (1, 0) and again.attempt > 1
        with pytest.raises(InvalidRequest):
            await broker.operator.delete_dead_letters("g", None, None)
        assert (
            await broker.operator.delete_dead_letters("g", None, [("t", 0, 0)], within={"u"}) == 0
        )
        assert await broker.operator.delete_dead_letters("g", None, [("t", 0, 0)]) == 1
        assert [d.message.offset for d in await broker.operator.dead_letters("g", None, 10)] == [2]
        deleted, deadline = 0, time.monotonic() + 5
        while not deleted:  # as soon as the dead letter is older than 1 ms
            assert time.monotonic() < deadline, "the dead letter never aged out"
            await anyio.sleep(0.001)
            deleted = await broker.operator.expire_dead_letters()
        assert deleted == 1
        assert await broker.operator.dead_letters("g", None, 10) == []
        view = await broker.describe_group("g")
        assert view.dead_lettered == 0
