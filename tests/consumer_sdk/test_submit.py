"""Producer.submit / AsyncProducer.submit: background batches, futures, per-key order."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import httpx
import pytest

from consumer_sdk import (
    AsyncProducer,
    Producer,
    RetryPolicy,
    SendResult,
    ServiceUnavailable,
    ValidationFailed,
)
from tests.consumer_sdk.fake import FakeServer
from tests.consumer_sdk.serve_proc import ServeProcess
from tests.support import RunningServer, wait_until

THREADS = 4
PER_THREAD = 5_000
KEYS = 500


@pytest.fixture
def serve_proc(tmp_path: Path) -> Iterator[ServeProcess]:
    server = ServeProcess(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def submit_from_threads(
    producer: Producer, topic: str, during: Callable[[list[list[Future[SendResult]]]], None]
) -> list[list[Future[SendResult]]]:
    """THREADS threads submit PER_THREAD messages each over KEYS shared keys; ``during`` runs
    while they do; returns each thread's futures in submit order."""
    futures: list[list[Future[SendResult]]] = [[] for _ in range(THREADS)]
    started = threading.Barrier(THREADS + 1)

    def work(t: int) -> None:
        started.wait()
        for n in range(PER_THREAD):
            futures[t].append(producer.submit(topic, {"t": t, "n": n}, key=f"k{n % KEYS}"))
            if n % 250 == 0:
                time.sleep(0.001)  # a stream, not one burst: the pause falls mid-stream

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    started.wait()
    during(futures)
    for thread in threads:
        thread.join(60)
    assert producer.flush(60) == 0
    return futures


def assert_stored_in_submit_order(futures: list[list[Future[SendResult]]]) -> None:
    """Every future resolved; per thread and key, the stored offsets follow submit order, on
    the one queue of the key."""
    stored: set[tuple[int, int]] = set()
    for per_thread in futures:
        last: dict[str, tuple[int, int]] = {}
        for n, future in enumerate(per_thread):
            result = future.result(timeout=0)
            key = f"k{n % KEYS}"
            where = (result.qid, result.offset)
            if key in last:
                assert result.qid == last[key][0], f"key {key} changed queue"
                assert result.offset > last[key][1], f"key {key} out of submit order at {n}"
            last[key] = where
            stored.add(where)
    assert len(stored) == THREADS * PER_THREAD  # each message stored once


def test_threads_submitting_over_shared_keys_keep_each_threads_order(
    server: RunningServer,
) -> None:
    with Producer(server.url) as producer:
        producer.create_topic("orders", 4)
        futures = submit_from_threads(producer, "orders", lambda _: None)
        assert_stored_in_submit_order(futures)
        topic = producer.client.get_topic("orders")
    assert sum(q["next_offset"] for q in topic["queue_stats"]) == THREADS * PER_THREAD


@pytest.mark.slow
def test_order_holds_when_the_server_pauses_mid_stream(serve_proc: ServeProcess) -> None:
    def pause(futures: list[list[Future[SendResult]]]) -> None:
        def resolved() -> int:
            return sum(f.done() for per_thread in futures for f in list(per_thread))

        wait_until(lambda: resolved() >= 2_000, 30, 0.005, "a first part stored")
        serve_proc.proc.send_signal(signal.SIGSTOP)
        try:
            at_stop = resolved()
            time.sleep(2)  # the pause under test: the server is stopped for 2 s
        finally:
            serve_proc.proc.send_signal(signal.SIGCONT)
        assert at_stop < THREADS * PER_THREAD, "the pause came after the stream"

    with Producer(serve_proc.url) as producer:
        producer.create_topic("orders", 4)
        futures = submit_from_threads(producer, "orders", pause)
    assert_stored_in_submit_order(futures)


def test_a_refused_message_fails_alone_and_close_flushes(server: RunningServer) -> None:
    with Producer(server.url, linger_ms=50) as producer:
        producer.create_topic("t", 1)
        good_before = [producer.submit("t", i, key="a") for i in range(5)]
        bad = producer.submit("t", "late", key="a", delay_ms=10**12)  # over max_delay_ms
        good_after = [producer.submit("t", i, key="a") for i in range(5, 10)]
    # close() flushed: every future is resolved.
    with pytest.raises(ValidationFailed):
        bad.result(timeout=0)
    offsets = [f.result(timeout=0).offset for f in good_before + good_after]
    assert offsets == sorted(offsets) and len(set(offsets)) == 10


def test_submit_after_close_is_refused(server: RunningServer) -> None:
    producer = Producer(server.url)
    producer.close()
    with pytest.raises(RuntimeError):
        producer.submit("t", 1)


def test_submit_blocks_at_max_pending_until_batches_settle(server: RunningServer) -> None:
    with Producer(server.url, max_pending_messages=10, batch_max_messages=5) as producer:
        producer.create_topic("t", 1)
        futures = [producer.submit("t", i, key="k") for i in range(100)]
        assert producer.flush(30) == 0
    assert [f.result(timeout=0).offset for f in futures] == list(range(100))


def test_async_submit_batches_and_keeps_order(server: RunningServer) -> None:
    async def main() -> list[SendResult]:
        async with AsyncProducer(server.url, linger_ms=2) as producer:
            await producer.create_topic("t", 2)
            pending = [producer.submit("t", {"n": n}, key=f"k{n % 7}") for n in range(2_000)]
            await producer.flush()
            assert all(f.done() for f in pending)
            late = producer.submit("t", {"n": 2_000}, key="k0")
            results = await asyncio.gather(*pending)
        assert late.done()  # aclose() flushed it
        return [*results, late.result()]

    results = asyncio.run(main())
    by_key: dict[str, list[int]] = defaultdict(list)
    for n, result in enumerate(results):
        by_key[f"k{n % 7}"].append(result.offset)
    for offsets in by_key.values():
        assert offsets == sorted(offsets)
    assert len({(r.qid, r.offset) for r in results}) == 2_001


def test_order_holds_across_retried_batches_and_a_batch_that_finally_fails() -> None:
    """Against the in-memory fake: produce calls fail now and then (503, refused, stored but
    the answer lost: retried thanks to the ids, answered as duplicates) and are retried; one
    batch fails for good. Every future resolves, the
    stored messages keep each key's submit order, none is stored twice."""
    fake = FakeServer()
    fake.add_topic("t", queues=1)
    calls = 0
    fail_for_good = False

    def stored_then_lost(request: httpx.Request) -> httpx.Response:
        asyncio.run(fake.handle(request))  # applied; the answer never arrives
        raise httpx.ReadTimeout("sent, no answer")

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    def busy(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": {"code": "busy", "message": "busy"}})

    kinds = [busy, refused, stored_then_lost]

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if fail_for_good:
            return busy(request)
        if calls % 2 == 0:  # every other call fails, one way or another
            return kinds[(calls // 2) % 3](request)
        return asyncio.run(fake.handle(request))

    retry = RetryPolicy(max_attempts=4, initial_backoff_ms=1, max_backoff_ms=2, jitter=0)
    producer = Producer(
        fake.url, retry=retry, transport=httpx.MockTransport(handle), batch_max_messages=50
    )
    with producer:
        futures = [
            producer.submit("t", {"n": n}, key=f"k{n % 7}", id=f"m{n}") for n in range(2_000)
        ]
        assert producer.flush(30) == 0
        assert calls > 60  # 40 batches, about half of the calls failed and were retried
        fail_for_good = True  # every try of the next batch fails: it fails for good
        lost = [producer.submit("t", {"n": n}, key="k0", id=f"x{n}") for n in range(3)]
        assert producer.flush(30) == 0
        fail_for_good = False
        after = producer.submit("t", {"n": "after"}, key="k0", id="after")
    for future in lost:
        with pytest.raises(ServiceUnavailable):
            future.result(timeout=0)
    assert after.result(timeout=0).offset == 2_000
    assert all(f.result(timeout=0).qid == 0 for f in futures)
    stored = [m.body["n"] for m in fake.messages]
    assert stored[:-1] == list(range(2_000)) and stored[-1] == "after"
