"""AsyncConsumer against the fake server: handler mode and ``async for``."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections import defaultdict
from typing import Any

import pytest

from consumer_sdk import AsyncConsumer, ConsumerError, Message, RetryPolicy

from .fake import FakeServer, async_wait_for

FAST_RETRY = RetryPolicy(initial_backoff_ms=1, max_backoff_ms=5)


@pytest.fixture
def fake() -> FakeServer:
    fake = FakeServer()
    fake.add_topic("rides")
    fake.add_group("g", topics={"rides": {"order_by": "key"}})
    return fake


def make(fake: FakeServer, handler: Any = None, **kwargs: Any) -> AsyncConsumer:
    kwargs.setdefault("wait_ms", 50)
    return AsyncConsumer(
        fake.url,
        group="g",
        topics=["rides"],
        handler=handler,
        transport=fake.transport(),
        retry=FAST_RETRY,
        handle_signals=False,
        **kwargs,
    )


def done(fake: FakeServer) -> bool:
    return all(m.state == "done" for m in fake.messages)


async def test_handler_mode_keeps_key_order_and_retries_failures(fake: FakeServer) -> None:
    for n in range(40):
        fake.produce("rides", {"n": n}, key=f"k{n % 4}")
    handled: dict[str, list[int]] = defaultdict(list)
    running: set[str] = set()
    overlaps = 0

    async def handle(msg: Message) -> None:
        nonlocal overlaps
        assert msg.key is not None
        overlaps += msg.key in running
        running.add(msg.key)
        try:
            await asyncio.sleep(0.001)  # simulated I/O
            if msg.body["n"] % 9 == 0 and msg.attempt == 1:
                raise RuntimeError("flaky")
            handled[msg.key].append(msg.body["n"])
        finally:
            running.discard(msg.key)

    async with make(fake, handle, concurrency=8) as consumer:
        await async_wait_for(lambda: done(fake))
    assert overlaps == 0
    for ns in handled.values():
        assert ns == sorted(ns) and len(ns) == 10
    assert consumer.stats().failed == 5
    assert fake.messages[9].errors == ["RuntimeError: flaky"]


async def test_handlers_run_concurrently_up_to_concurrency(fake: FakeServer) -> None:
    for n in range(8):
        fake.produce("rides", {"n": n}, key=f"k{n}")
    barrier = asyncio.Barrier(4)
    running = peak = 0

    async def handle(msg: Message) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        async with asyncio.timeout(5):  # fails unless four handlers wait here together
            await barrier.wait()
        running -= 1

    async with make(fake, handle, concurrency=4):
        await async_wait_for(lambda: done(fake))
    assert peak == 4


async def test_plain_function_handlers_work_too(fake: FakeServer) -> None:
    fake.produce("rides", {"n": 0}, key="k")
    seen: list[int] = []
    async with make(fake, lambda m: seen.append(m.body["n"])):
        await async_wait_for(lambda: done(fake))
    assert seen == [0]


async def test_run_stops_gracefully_when_cancelled(fake: FakeServer) -> None:
    for n in range(100):
        fake.produce("rides", {"n": n}, key=f"k{n % 10}")
    handled: list[int] = []

    async def handle(msg: Message) -> None:
        await asyncio.sleep(0.002)
        handled.append(msg.body["n"])

    consumer = make(fake, handle)
    task = asyncio.create_task(consumer.run())
    await async_wait_for(lambda: len(handled) >= 15)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fake.in_flight() == 0
    assert sorted(m.body["n"] for m in fake.messages if m.state == "done") == sorted(handled)


async def test_async_for_acks_when_the_body_finishes(fake: FakeServer) -> None:
    for n in range(6):
        fake.produce("rides", {"n": n}, key="k")
    seen = []
    async with make(fake) as consumer:
        async for msg in consumer:
            seen.append(msg.body["n"])
            if len(seen) == 6:
                break  # the last message is acked by the normal exit of the block
    assert seen == list(range(6))
    assert done(fake) and fake.in_flight() == 0


async def test_async_for_nack_redelivers_with_the_error(fake: FakeServer) -> None:
    fake.produce("rides", {"n": 0}, key="k")
    attempts = []
    async with make(fake) as consumer:
        async for msg in consumer:
            attempts.append(msg.attempt)
            if msg.attempt == 1:
                await consumer.nack(msg, ValueError("not yet"))
                with pytest.raises(ConsumerError):
                    await consumer.ack(msg)  # already settled
            else:
                break
    assert attempts == [1, 2]
    assert fake.messages[0].errors == ["ValueError: not yet"] and done(fake)


async def test_async_for_body_raising_fails_the_message(fake: FakeServer) -> None:
    fake.produce("rides", {"n": 0}, key="k")
    with pytest.raises(KeyError):
        async with make(fake) as consumer:
            async for msg in consumer:
                raise KeyError(msg.body["n"])
    assert fake.messages[0].errors == ["KeyError: 0"]
    assert fake.in_flight() == 0


async def test_async_for_releases_unyielded_messages_on_stop(fake: FakeServer) -> None:
    for n in range(5):
        fake.produce("rides", {"n": n}, key=f"k{n}")
    async with make(fake) as consumer:
        async for msg in consumer:
            assert msg.body["n"] == 0
            break
    # One message handled and acked; the four pulled with it were failed back, not held.
    states = [m.state for m in fake.messages]
    assert states[0] == "done"
    assert fake.in_flight() == 0
    assert all(m.errors == ["released unprocessed: consumer stopped"] for m in fake.messages[1:])


async def test_sigterm_ends_async_for_after_the_held_messages(fake: FakeServer) -> None:
    for n in range(300):
        fake.produce("rides", {"n": n}, key=f"k{n % 50}")
    seen: list[int] = []
    previous = signal.getsignal(signal.SIGTERM)
    async with AsyncConsumer(fake.url, group="g", transport=fake.transport(), wait_ms=50) as c:
        async for msg in c:
            seen.append(msg.body["n"])
            if len(seen) == 10:
                os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) == previous
    assert 10 <= len(seen) < 300
    assert fake.in_flight() == 0
    assert sorted(m.body["n"] for m in fake.messages if m.state == "done") == sorted(seen)
    assert not any(m.errors for m in fake.messages)  # nothing released: all held were yielded


async def test_async_for_without_auto_ack_lets_the_user_batch(fake: FakeServer) -> None:
    for n in range(4):
        fake.produce("rides", {"n": n}, key=f"k{n}")
    async with make(fake, auto_ack=False) as consumer:
        batch = []
        async for msg in consumer:
            batch.append(msg)
            if len(batch) == 4:
                break
        assert fake.in_flight() == 4
        for msg in batch:
            await consumer.ack(msg)
    assert done(fake)


async def test_async_for_needs_a_started_consumer_without_handler(fake: FakeServer) -> None:
    with pytest.raises(ConsumerError):
        await anext(aiter(make(fake)))

    async def handle(msg: Message) -> None: ...

    async with make(fake, handle) as consumer:
        with pytest.raises(ConsumerError):
            await anext(aiter(consumer))
    with pytest.raises(ConsumerError):
        await make(fake).run()


async def test_a_message_failing_again_is_logged_with_its_traceback_only_once(
    fake: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A stuck key fails on every retry: one traceback, then a line per failure.
    fake.produce("rides", {"n": 0}, key="stuck")
    fake.produce("rides", {"n": 1}, key="other")
    attempts = 0

    async def handle(msg: Message) -> None:
        nonlocal attempts
        if msg.key == "stuck":
            attempts += 1
            raise ValueError("still down")

    caplog.set_level(logging.INFO, logger="consumer_sdk.consumer")
    async with make(fake, handle):
        await async_wait_for(lambda: attempts >= 3)
    failures = [r for r in caplog.records if r.getMessage().startswith("handler failed")]
    first, *again = failures
    assert first.levelno == logging.WARNING and first.exc_info is not None
    assert first.getMessage() == "handler failed on rides/0@0 (attempt 1): ValueError: still down"
    assert len(again) == attempts - 1 >= 2
    assert all(r.levelno == logging.INFO and r.exc_info is None for r in again)
    assert again[0].getMessage() == (
        "handler failed again on rides/0@0 (attempt 2): ValueError: still down"
    )
