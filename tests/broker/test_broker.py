"""Broker + runners over the in-memory store: no sockets, real event loop."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import anyio
import orjson
import pytest

from cproxy.broker.broker import Broker
from cproxy.config import Settings
from cproxy.engine.group_config import GroupConfig
from cproxy.engine.records import Result
from cproxy.errors import GroupNotFound, InvalidRequest, ShuttingDown, TopicNotFound
from cproxy.model import NewMessage
from cproxy.store.memory import MemoryStore

SETTINGS = replace(Settings(), commit_interval_ms=50)


class AlwaysLeased:
    """A cluster whose lease never runs out and with no peers to tell of redrives."""

    def check_lease(self) -> None:
        pass

    async def announce_redrive(self, group: str, topic: str | None) -> None:
        pass


@asynccontextmanager
async def running(
    store: MemoryStore, settings: Settings = SETTINGS, *, cluster: bool = False
) -> AsyncIterator[Broker]:
    """A started broker; ``cluster``: it serves only the queues claimed (``serve_queue``),
    as under a ``ClusterNode``."""
    broker = Broker(store, settings, cluster=AlwaysLeased() if cluster else None)
    async with anyio.create_task_group() as tg:
        await broker.start(tg)
        try:
            yield broker
        finally:
            await broker.stop()
            tg.cancel_scope.cancel()


def items(*keys: str | None) -> list[NewMessage]:
    return [NewMessage(key, orjson.dumps({"i": i})) for i, key in enumerate(keys)]


def config(**kw: Any) -> GroupConfig:
    kw.setdefault("topics", {"t": {"order_by": "key"}})
    return GroupConfig.from_dict(kw)


def ack_all(entries: list[Any]) -> list[Result]:
    return [Result(e.message.topic, e.message.qid, acks=[e.message.offset]) for e in entries]


async def test_long_poll_wakes_when_a_produce_lands() -> None:
    store = MemoryStore()
    async with running(store) as broker:
        await broker.create_topic("t", 2)
        await broker.put_group("g", config())
        got: list[Any] = []

        async def poll() -> None:
            result = await broker.pull("g", 10, 5000, None, [])
            got.extend(result.deliveries)

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            await anyio.sleep(0.05)
            await broker.produce("t", items("a"))
        assert len(got) == 1
        assert time.monotonic() - started < 2


async def test_progress_survives_restart_without_replaying_acked() -> None:
    store = MemoryStore()
    async with running(store) as broker:
        await broker.create_topic("t", 1)
        await broker.put_group("g", config())
        await broker.produce("t", items("a", "b", "c", "d"))
        first = (await broker.pull("g", 10, 1000, None, [])).deliveries
        assert len(first) == 4
        broker.ack("g", [r for r in ack_all(first) if r.acks[0] in (1, 3)])
    async with running(store) as broker:
        again = (await broker.pull("g", 10, 1000, None, [])).deliveries
        assert sorted(e.message.offset for e in again) == [0, 2]


async def test_commit_happens_every_interval_without_a_stop() -> None:
    store = MemoryStore()
    async with running(store) as broker:
        await broker.create_topic("t", 1)
        await broker.put_group("g", config())
        await broker.produce("t", items("a", "b"))
        got = (await broker.pull("g", 10, 1000, None, [])).deliveries
        broker.ack("g", ack_all(got))
        with anyio.fail_after(5):
            while (await store.load_progress("g"))[("t", 0)].committed != 2:
                await anyio.sleep(0.01)


async def test_start_latest_skips_existing_messages() -> None:
    store = MemoryStore()
    async with running(store) as broker:
        await broker.create_topic("t", 1)
        await broker.produce("t", items("old"))
        await broker.put_group("g", config(start="latest"))
        await broker.produce("t", items("new"))
        got = (await broker.pull("g", 10, 1000, None, [])).deliveries
        assert [e.message.key for e in got] == ["new"]


async def test_redrive_resumes_after_restart_until_acked() -> None:
    store = MemoryStore()
    async with running(store) as broker:
        await broker.create_topic("t", 1)
        await broker.put_group("g", config(max_attempts=1))
        await broker.produce("t", items("a", "a"))
        for _ in range(2):
            got = (await broker.pull("g", 10, 1000, None, [])).deliveries
            broker.ack("g", [Result("t", 0, fails=[(e.message.offset, "x")]) for e in got])
        await broker.operator.commit("g")
        assert await store.count_dead_letters("g") == 2
        assert await broker.operator.redrive("g", None) == 2
        got = (await broker.pull("g", 10, 1000, None, [])).deliveries
        assert [e.message.offset for e in got] == [0]
    async with running(store) as broker:  # restarted before the redrive finished
        seen = []
        for _ in range(2):
            got = (await broker.pull("g", 10, 1000, None, [])).deliveries
            seen += [e.message.offset for e in got]
            broker.ack("g", ack_all(got))
        assert seen == [0, 1]
        await broker.operator.commit("g")
        assert await store.load_redriving("g") == []
        assert await store.count_dead_letters("g") == 0


async def test_shutdown_releases_long_polls_and_refuses_work() -> None:
    store = MemoryStore()
    async with running(store) as broker:
        await broker.create_topic("t", 1)
        await broker.put_group("g", config())
        done = anyio.Event()

        async def poll() -> None:
            await broker.pull("g", 10, 20_000, None, [])
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            await anyio.sleep(0.05)
            broker.begin_shutdown()
            with anyio.fail_after(2):
                await done.wait()
        with pytest.raises(ShuttingDown):
            await broker.produce("t", items("a"))


async def test_group_update_keeps_progress_and_validation_errors() -> None:
    store = MemoryStore()
    async with running(store) as broker:
        await broker.create_topic("t", 1)
        await broker.create_topic("u", 1)
        await broker.put_group("g", config())
        await broker.produce("t", items("a", "b"))
        got = (await broker.pull("g", 1, 1000, None, [])).deliveries
        broker.ack("g", ack_all(got))
        _, created = await broker.put_group(
            "g", config(topics={"t": {"order_by": "key"}, "u": {"order_by": "none"}})
        )
        assert not created
        left = (await broker.pull("g", 10, 1000, None, [])).deliveries
        assert [e.message.offset for e in left] == [1]
        with pytest.raises(TopicNotFound):
            await broker.put_group("h", config(topics={"nope": {}}))
        with pytest.raises(GroupNotFound):
            await broker.describe_group("h")
        with pytest.raises(InvalidRequest):
            await broker.produce("t", [NewMessage(None, b"1", qid=5)])
        await broker.delete_group("g")
        with pytest.raises(GroupNotFound):
            await broker.describe_group("g")
        assert await store.load_progress("g") == {}


async def test_a_crashing_background_task_is_restarted(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    real_read = store.read
    calls = {"n": 0}

    async def flaky_read(topic: str, qid: int, from_offset: int, max_count: int) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("bug in a read path")
        return await real_read(topic, qid, from_offset, max_count)

    store.read = flaky_read  # type: ignore[method-assign]
    async with running(store) as broker:
        await broker.create_topic("t", 1)
        await broker.produce("t", items("a"))  # stored before the group exists
        await broker.put_group("g", config())
        with anyio.fail_after(10):
            got = (await broker.pull("g", 10, 5000, None, [])).deliveries
        assert [e.message.key for e in got] == ["a"]
    assert "task=fetcher crashed" in caplog.text


def test_json_log_lines() -> None:
    import logging

    from cproxy.logs import JsonFormatter

    record = logging.LogRecord("cproxy.x", logging.INFO, __file__, 1, "group=%s ok", ("g",), None)
    line = orjson.loads(JsonFormatter().format(record))
    assert line["msg"] == "group=g ok" and line["level"] == "info" and line["logger"] == "cproxy.x"


async def test_putting_the_same_config_again_keeps_the_group_running() -> None:
    store = MemoryStore()
    async with running(store) as broker:
        await broker.create_topic("t", 1)
        _, created = await broker.put_group("g", config())
        assert created
        await broker.produce("t", items("a"))
        got = (await broker.pull("g", 10, 1000, None, [])).deliveries
        _, created = await broker.put_group("g", config())  # e.g. an SDK consumer starting
        assert not created
        # Not restarted: the delivery handed out before is still the one in flight.
        assert broker.ack("g", ack_all(got)).applied == 1


async def timer_asleep(broker: Broker, group: str) -> None:
    """Until the group's timer task sleeps (white box: its planned wake-up is set)."""
    with anyio.fail_after(5):
        while broker.groups[group]._timer_due_ms == 0:
            await anyio.sleep(0.005)


async def test_short_deadlines_wake_a_sleeping_timer() -> None:
    # Deliveries with the default 30 s ack timeout leave the timer asleep (it wakes at least
    # every second anyway); a later, shorter deadline must still wake it at once: here a
    # retry 50 ms after a fail, while the timer sleeps until the first second is up.
    store = MemoryStore()
    async with running(store) as broker:
        await broker.create_topic("t", 1)
        await broker.put_group("g", config(retry_backoff_ms=[50]))
        await broker.produce("t", items("a"))
        await timer_asleep(broker, "g")
        first = await broker.pull("g", 10, 1000, None, [])
        assert len(first.deliveries) == 1
        message = first.deliveries[0].message
        started = time.monotonic()
        fail = Result("t", message.qid, fails=[(message.offset, "boom")])
        again = await broker.pull("g", 10, 5000, None, [fail])
        assert [d.message.offset for d in again.deliveries] == [message.offset]
        assert time.monotonic() - started < 0.5


async def test_a_short_ack_timeout_is_kept_while_the_timer_sleeps() -> None:
    store = MemoryStore()
    async with running(store) as broker:
        await broker.create_topic("t", 1)
        await broker.put_group("g", config(ack_timeout_ms=100, retry_backoff_ms=[0]))
        await broker.produce("t", items("a"))
        await timer_asleep(broker, "g")
        started = time.monotonic()
        first = await broker.pull("g", 10, 1000, None, [])
        again = await broker.pull("g", 10, 5000, None, [])  # never acked: redelivered
        assert [d.message.offset for d in again.deliveries] == [
            d.message.offset for d in first.deliveries
        ]
        assert time.monotonic() - started < 0.7


async def test_delivery_numbers_are_reserved_at_once_when_half_the_reserve_is_used() -> None:
    # The commit interval is far off: only the reserve running low can make the runner
    # persist a higher ceiling now (docs/guarantees.md, fenced deliveries).
    from cproxy.engine.work import ATTEMPT_RESERVE

    store = MemoryStore()
    async with running(store, replace(Settings(), commit_interval_ms=600_000)) as broker:
        await broker.create_topic("t", 1)
        await broker.put_group("g", config(max_attempts=1000, retry_backoff_ms=[0]))
        await broker.produce("t", items("a"))
        await anyio.sleep(0.05)  # the committer is waiting on its (10 min) interval now
        results: list[Result] = []
        attempt = 0
        while attempt <= ATTEMPT_RESERVE // 2:
            (d,) = (await broker.pull("g", 1, 1000, None, results)).deliveries
            assert d.attempt == attempt + 1
            attempt = d.attempt
            results = [Result("t", 0, fails=[(0, "again")], attempts={0: d.attempt})]

        async def ceiling() -> int:
            return (await store.load_progress("g"))[("t", 0)].attempt_ceiling

        deadline = time.monotonic() + 5
        while await ceiling() <= ATTEMPT_RESERVE:
            assert time.monotonic() < deadline, "the new reserve was not persisted"
            await anyio.sleep(0.01)
        assert await ceiling() >= attempt + ATTEMPT_RESERVE
