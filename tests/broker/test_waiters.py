"""The FIFO of waiting pulls: unit tests of ``Waiters`` and the runner's long polls over it
(memory store, real event loop)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from typing import Any

import anyio
import pytest

from cproxy.broker.broker import Broker
from cproxy.broker.waiters import Waiter, Waiters, expiry, watch_with_task
from cproxy.engine.records import Result
from cproxy.engine.snapshots import Handout
from cproxy.model import Record
from cproxy.store.memory import MemoryStore
from tests.broker.test_broker import ack_all, config, items, running


def _delivery(offset: int, topic: str = "t") -> Handout:
    return Handout(Record(topic, 0, offset, None, b"{}", None, None, 0), 1)


class _Work:
    """A fake engine: ``count`` messages per topic, each ``take`` hands out up to
    ``max_messages`` of the waiter's topics."""

    def __init__(self, **count: int) -> None:
        self.count = dict(count)
        self.offset = 0

    def _topics(self, topics: Collection[str] | None) -> list[str]:
        return sorted(self.count) if topics is None else [t for t in topics if t in self.count]

    def has_work(self, topics: Collection[str] | None) -> bool:
        return any(self.count[t] for t in self._topics(topics))

    def take(self, waiter: Waiter) -> list[Handout]:
        out = []
        for t in self._topics(waiter.topics):
            while self.count[t] and len(out) < waiter.max_messages:
                self.count[t] -= 1
                out.append(_delivery(self.offset, t))
                self.offset += 1
        return out


def test_work_goes_to_the_oldest_waiters_and_wakes_no_others() -> None:
    queue = Waiters()
    waiters = [Waiter(1, None) for _ in range(5)]
    for w in waiters:
        queue.enqueue(w)
    work = _Work(t=2)
    assert queue.hand_out(work.has_work, work.take) == 2
    assert [w.woken for w in waiters] == [True, True, False, False, False]
    assert [d.message.offset for d in waiters[0].take()] == [0]
    assert [d.message.offset for d in waiters[1].take()] == [1]
    assert len(queue) == 3
    work.count["t"] = 1
    assert queue.hand_out(work.has_work, work.take) == 1
    assert waiters[2].woken and not waiters[3].woken


def test_a_waiter_takes_up_to_its_max_messages() -> None:
    queue = Waiters()
    big, small = Waiter(10, None), Waiter(10, None)
    queue.enqueue(big)
    queue.enqueue(small)
    work = _Work(t=7)
    assert queue.hand_out(work.has_work, work.take) == 1
    assert len(big.take()) == 7
    assert not small.woken


def test_topic_lanes_skip_waiters_that_cannot_take_the_work() -> None:
    queue = Waiters()
    only_u = Waiter(1, ["u"])
    any_topic = Waiter(1, None)
    only_t = Waiter(1, ["t"])
    for w in (only_u, any_topic, only_t):
        queue.enqueue(w)
    work = _Work(t=2, u=0)
    assert queue.hand_out(work.has_work, work.take) == 2
    assert (only_u.woken, any_topic.woken, only_t.woken) == (False, True, True)
    work.count["u"] = 1
    assert queue.hand_out(work.has_work, work.take) == 1
    assert only_u.woken and len(queue) == 0


def test_across_lanes_the_earliest_arrival_goes_first() -> None:
    queue = Waiters()
    first, second = Waiter(1, ["t"]), Waiter(1, None)
    queue.enqueue(first)
    queue.enqueue(second)
    work = _Work(t=1)
    queue.hand_out(work.has_work, work.take)
    assert first.woken and not second.woken


def test_remove_is_false_once_woken_and_a_removed_waiter_is_never_served() -> None:
    queue = Waiters()
    gone, stays = Waiter(1, None), Waiter(1, None)
    queue.enqueue(gone)
    queue.enqueue(stays)
    assert queue.remove(gone) is True
    assert queue.remove(gone) is False
    work = _Work(t=5)
    assert queue.hand_out(work.has_work, work.take) == 1
    assert stays.woken and not gone.woken
    assert queue.remove(stays) is False
    assert not queue


def test_a_take_that_finds_nothing_stops_without_dropping_the_waiter() -> None:
    queue = Waiters()
    waiter = Waiter(1, None)
    queue.enqueue(waiter)
    assert queue.hand_out(lambda topics: True, lambda w: []) == 0
    assert not waiter.woken and len(queue) == 1


def test_wake_all_releases_every_waiter_empty_handed() -> None:
    queue = Waiters()
    waiters = [Waiter(1, None), Waiter(1, ["t"])]
    for w in waiters:
        queue.enqueue(w)
    assert queue.wake_all() == 2
    assert all(w.woken and w.take() == [] for w in waiters)
    assert not queue


def test_a_wait_ends_on_the_grid_never_after_its_deadline_nor_much_before() -> None:
    for now in (0.0, 12.3456, 86_400.0371):
        for timeout in (0.001, 0.2, 1.0, 30.0):
            end = expiry(now, timeout)
            assert now + 0.95 * timeout - 1e-9 <= end <= now + timeout
    # Long polls of 30 s that started within the same 50 ms step end in the same instant.
    assert expiry(100.005, 30.0) == expiry(100.045, 30.0) == 130.0


async def test_a_waiter_wakes_at_its_deadline_and_at_once_when_woken_before() -> None:
    waiter = Waiter(1, None)
    started = time.monotonic()
    await waiter.wait(0.2)
    assert 0.18 <= time.monotonic() - started < 1.0 and not waiter.woken
    woken = Waiter(1, None)
    woken._wake([_delivery(0)])
    started = time.monotonic()
    await woken.wait(30.0)
    assert time.monotonic() - started < 1.0 and len(woken.take()) == 1


# -- the runner's long polls ---------------------------------------------------------------------
async def _wait_for(predicate: Any, timeout_s: float = 5.0) -> None:
    with anyio.fail_after(timeout_s):
        while not predicate():
            await anyio.sleep(0.001)


async def _group(broker: Broker, queues: int = 1, **kw: Any) -> None:
    await broker.create_topic("t", queues)
    await broker.put_group("g", config(**kw))


async def test_one_message_wakes_one_of_many_waiting_pulls() -> None:
    async with running(MemoryStore()) as broker:
        await _group(broker)
        runner = broker.groups["g"]
        answers: list[int] = []

        async def poll() -> None:
            answers.append(len((await broker.pull("g", 10, 5000, None, [])).deliveries))

        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(poll)
            await _wait_for(lambda: runner.waiting_pulls == 50)
            await broker.produce("t", items("a"))
            await _wait_for(lambda: answers == [1])
            assert runner.waiting_pulls == 49
            await broker.produce("t", items("b", "c"))
            await _wait_for(lambda: len(answers) == 2)
            assert answers == [1, 2]  # the next waiter in line takes both
            assert runner.waiting_pulls == 48
            runner.stop_pulls()
        assert answers[2:] == [0] * 48


async def test_waiting_pulls_are_served_in_arrival_order() -> None:
    async with running(MemoryStore()) as broker:
        await _group(broker)
        runner = broker.groups["g"]
        order: list[int] = []

        async def poll(i: int) -> None:
            if (await broker.pull("g", 1, 5000, None, [])).deliveries:
                order.append(i)

        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(poll, i)
                await _wait_for(lambda i=i: runner.waiting_pulls == i + 1)
            await broker.produce("t", items("a", "b", "c"))
            await _wait_for(lambda: len(order) == 3)
            runner.stop_pulls()
        assert order == [0, 1, 2]


async def test_one_key_is_never_handed_to_two_waiters_at_once() -> None:
    async with running(MemoryStore()) as broker:
        await _group(broker)
        runner = broker.groups["g"]
        got: list[list[Handout]] = []

        async def poll() -> None:
            deliveries = (await broker.pull("g", 10, 5000, None, [])).deliveries
            if deliveries:
                got.append(deliveries)

        async def poll_with(results: list[Result]) -> None:
            answer = await broker.pull("g", 10, 5000, None, results)
            assert answer.applied == 1
            if answer.deliveries:
                got.append(answer.deliveries)

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(poll)
            await _wait_for(lambda: runner.waiting_pulls == 3)
            await broker.produce("t", items("k", "k", "k"))
            await _wait_for(lambda: len(got) == 1)
            await anyio.sleep(0.05)  # give a wrong second hand-out the chance to happen
            assert len(got) == 1 and [d.message.offset for d in got[0]] == [0]
            assert runner.waiting_pulls == 2
            # The ack rides on a pull: the next message of the key goes to one pull only.
            tg.start_soon(poll_with, ack_all(got[0]))
            await _wait_for(lambda: len(got) == 2)
            await anyio.sleep(0.05)
            assert runner.stats().in_flight == 1 and runner.waiting_pulls == 2
            runner.stop_pulls()
        offsets = [d.message.offset for answer in got for d in answer]
        assert offsets == [0, 1]


async def test_a_waiter_cancelled_as_it_is_handed_messages_gives_them_back() -> None:
    async with running(MemoryStore()) as broker:
        await _group(broker)
        runner = broker.groups["g"]
        task = asyncio.ensure_future(broker.pull("g", 10, 5000, None, []))
        await _wait_for(lambda: runner.waiting_pulls == 1)
        await broker.produce("t", items("a", "b"))
        # Hand out and cancel in one step: the waiter holds the messages but has not run
        # yet (the server cancels the request at that very moment).
        assert runner.hand_out() == 1
        assert runner.stats().in_flight == 2
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert runner.stats().in_flight == 0
        again = (await broker.pull("g", 10, 0, None, [])).deliveries
        # Given back uncharged; the next hand-out is a new delivery (number 2).
        assert [(d.message.offset, d.attempt, d.charged) for d in again] == [
            (0, 2, 0),
            (1, 2, 0),
        ]


async def test_a_waiter_whose_scope_is_cancelled_as_it_is_handed_messages_loses_none() -> None:
    async with running(MemoryStore()) as broker:
        await _group(broker)
        runner = broker.groups["g"]
        got: list[Handout] = []
        scope = anyio.CancelScope()

        async def poll() -> None:
            with scope:
                got.extend((await broker.pull("g", 10, 5000, None, [])).deliveries)

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            await _wait_for(lambda: runner.waiting_pulls == 1)
            await broker.produce("t", items("a"))
            assert runner.hand_out() == 1
            scope.cancel()
        # anyio lets a wait that already completed return: the pull has its message;
        # else it must be ready again. Either way nothing is left in flight unowned.
        if got:
            assert runner.stats().in_flight == 1
        else:
            assert runner.stats().in_flight == 0 and runner.stats().ready == 1


async def test_a_waiter_whose_deadline_passes_as_it_is_handed_messages_returns_them() -> None:
    async with running(MemoryStore()) as broker:
        await _group(broker)
        runner = broker.groups["g"]
        got: list[Handout] = []

        async def poll() -> None:
            got.extend((await broker.pull("g", 10, 50, None, [])).deliveries)

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            await _wait_for(lambda: runner.waiting_pulls == 1)
            await broker.produce("t", items("a"))
            assert runner.hand_out() == 1
            # Stall the loop past the pull's deadline so the wake-up and the timeout are due
            # together (a blocking sleep is the point here).
            time.sleep(0.08)  # noqa: ASYNC251
        assert [(d.message.offset, d.attempt) for d in got] == [(0, 1)]
        assert runner.stats().in_flight == 1


async def test_a_cancelled_empty_waiter_leaves_the_line_at_no_cost_to_others() -> None:
    async with running(MemoryStore()) as broker:
        await _group(broker)
        runner = broker.groups["g"]
        got: list[Handout] = []
        scope = anyio.CancelScope()

        async def gone() -> None:
            with scope:
                await broker.pull("g", 10, 5000, None, [])

        async def poll() -> None:
            got.extend((await broker.pull("g", 10, 5000, None, [])).deliveries)

        async with anyio.create_task_group() as tg:
            tg.start_soon(gone)
            await _wait_for(lambda: runner.waiting_pulls == 1)
            tg.start_soon(poll)
            await _wait_for(lambda: runner.waiting_pulls == 2)
            scope.cancel()
            await _wait_for(lambda: runner.waiting_pulls == 1)
            await broker.produce("t", items("a"))
        assert [d.message.offset for d in got] == [0]


async def test_results_on_a_waiting_pull_are_applied_before_it_waits() -> None:
    async with running(MemoryStore()) as broker:
        await _group(broker)
        runner = broker.groups["g"]
        await broker.produce("t", items("a"))
        first = (await broker.pull("g", 10, 0, None, [])).deliveries
        answers: list[Any] = []

        async def poll() -> None:
            answers.append(await broker.pull("g", 10, 5000, None, ack_all(first)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            await _wait_for(lambda: runner.waiting_pulls == 1)
            assert runner.stats().in_flight == 0  # acked while the pull still waits
            await broker.produce("t", items("b"))
        assert answers[0].applied == 1
        assert [d.message.offset for d in answers[0].deliveries] == [1]


async def test_stop_pulls_releases_every_waiting_pull_empty() -> None:
    async with running(MemoryStore()) as broker:
        await _group(broker)
        runner = broker.groups["g"]
        answers: list[int] = []

        async def poll(topics: list[str] | None) -> None:
            answers.append(len((await broker.pull("g", 10, 30_000, topics, [])).deliveries))

        with anyio.fail_after(2):  # the 30 s polls return at once
            async with anyio.create_task_group() as tg:
                tg.start_soon(poll, None)
                tg.start_soon(poll, ["t"])
                await _wait_for(lambda: runner.waiting_pulls == 2)
                broker.begin_shutdown()
        assert answers == [0, 0]


async def test_a_pull_whose_caller_is_gone_leaves_the_line() -> None:
    async with running(MemoryStore()) as broker:
        await _group(broker)
        runner = broker.groups["g"]
        gone = anyio.Event()
        answers: list[int] = []

        async def poll() -> None:
            result = await broker.pull("g", 10, 30_000, None, [], gone=watch_with_task(gone.wait))
            answers.append(len(result.deliveries))

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(poll)
                await _wait_for(lambda: runner.waiting_pulls == 1)
                gone.set()
        assert answers == [0] and runner.waiting_pulls == 0


async def test_messages_handed_to_a_pull_whose_caller_just_went_go_back() -> None:
    async with running(MemoryStore()) as broker:
        await _group(broker)
        runner = broker.groups["g"]
        gone = anyio.Event()
        answers: list[int] = []

        async def poll() -> None:
            result = await broker.pull("g", 10, 30_000, None, [], gone=watch_with_task(gone.wait))
            answers.append(len(result.deliveries))

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            await _wait_for(lambda: runner.waiting_pulls == 1)
            await broker.produce("t", items("a"))
            gone.set()  # the client went away as the message was handed over
            assert runner.hand_out() == 1
        assert answers == [0]
        assert runner.stats().in_flight == 0
        again = (await broker.pull("g", 10, 0, None, [])).deliveries
        assert [(d.message.offset, d.attempt, d.charged) for d in again] == [(0, 2, 0)]


async def test_a_watch_by_callback_is_told_to_leave_and_stopped_when_the_wait_ends() -> None:
    """The HTTP protocol's way (no task): ``watch(leave)`` keeps ``leave`` until the
    connection is lost; the pull stops watching once its wait is over, however it ended."""
    async with running(MemoryStore()) as broker:
        await _group(broker)
        runner = broker.groups["g"]
        held: list[Any] = []
        stopped: list[bool] = []

        def watch(leave: Any) -> Any:
            held.append(leave)
            return lambda: stopped.append(True)

        answers: list[int] = []

        async def poll() -> None:
            result = await broker.pull("g", 10, 30_000, None, [], gone=watch)
            answers.append(len(result.deliveries))

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(poll)
                await _wait_for(lambda: runner.waiting_pulls == 1)
                held[0]()  # the connection was lost
        assert answers == [0] and stopped == [True] and runner.waiting_pulls == 0

        # Answered normally: the watch is stopped too, and nobody is told to leave later.
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(poll)
                await _wait_for(lambda: runner.waiting_pulls == 1)
                await broker.produce("t", items("a"))
        assert answers == [0, 1] and stopped == [True, True]


async def test_a_pull_whose_client_is_already_gone_does_not_wait() -> None:
    async with running(MemoryStore()) as broker:
        await _group(broker)

        def gone_already(leave: Any) -> Any:
            leave()
            return lambda: None

        with anyio.fail_after(5):
            result = await broker.pull("g", 10, 30_000, None, [], gone=gone_already)
        assert result.deliveries == [] and broker.groups["g"].waiting_pulls == 0
