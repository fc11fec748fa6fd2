"""Cluster hooks of the broker (``hosting.py``) against the memory store: a queue claimed
while a group is being created is served by that group too."""

from __future__ import annotations

from typing import Any

import anyio
from anyio.lowlevel import checkpoint

from cproxy.broker.broker import Broker
from cproxy.model import DeadLetter, NewMessage, QueueProgress, QueueRef, Record
from cproxy.store.memory import MemoryStore
from tests.broker.test_broker import config, running


class SlowStore(MemoryStore):
    """Every progress load yields to other tasks a few times (as a database round trip does)."""

    async def load_progress(self, group: str) -> dict[QueueRef, QueueProgress]:
        for _ in range(3):
            await checkpoint()
        return await super().load_progress(group)


async def served(broker: Broker, group: str) -> list[int]:
    view: Any = await broker.describe_group(group)
    return sorted(q.qid for q in view.stats.queues)


async def test_queues_claimed_while_a_group_opens_are_served_by_it() -> None:
    for delay_claims in range(6):  # claims landing at different points of the opening
        store = SlowStore()
        async with running(store, cluster=True) as broker:
            await broker.create_topic("t", 8)

            async def claim_all(delay_claims: int = delay_claims) -> None:
                for _ in range(delay_claims):
                    await checkpoint()
                for qid in range(8):
                    await broker.serve_queue("t", qid)
                    await checkpoint()

            async with anyio.create_task_group() as tg:
                tg.start_soon(claim_all)
                await broker.put_group("g", config())
            assert await served(broker, "g") == list(range(8)), delay_claims


async def test_a_queue_dropped_while_a_group_opens_is_not_served_by_it() -> None:
    store = SlowStore()
    async with running(store, cluster=True) as broker:
        await broker.create_topic("t", 4)
        for qid in range(4):
            await broker.serve_queue("t", qid)

        async def drop_two() -> None:
            await checkpoint()
            broker.drop_queue("t", 1)
            await checkpoint()
            broker.drop_queue("t", 3)

        async with anyio.create_task_group() as tg:
            tg.start_soon(drop_two)
            await broker.put_group("g", config())
        assert await served(broker, "g") == [0, 2]


async def test_a_claimed_queue_delivers_dead_letters_a_former_owner_was_redriving() -> None:
    store = MemoryStore()
    async with running(store, cluster=True) as broker:
        await broker.create_topic("t", 2)
        await broker.serve_queue("t", 0)  # queue 1 is owned elsewhere
        await broker.put_group("g", config())
        stored = await store.append(
            "t", [NewMessage("a", b"1", qid=0), NewMessage("b", b"2", qid=1)], 1, 0
        )
        messages = [
            Record("t", r.qid, r.offset, k, b, None, None, 1)
            for r, k, b in zip(stored, ("a", "b"), (b"1", b"2"), strict=True)
        ]
        # Both were dead-lettered and then redriven by another proxy, which lost queue 1.
        finished = {("t", 0): QueueProgress(1), ("t", 1): QueueProgress(1)}
        await store.commit("g", finished, [DeadLetter("g", m, 5, "boom", 2) for m in messages])
        await store.start_redrive("g", None)
        await broker.serve_queue("t", 1)
        got = await broker.pull("g", 10, 1000, None, [])
        assert [(d.message.qid, d.message.offset, d.attempt) for d in got.deliveries] == [(1, 0, 1)]
