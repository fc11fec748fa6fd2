"""The SDK against real cproxy servers (the ``server`` / ``server_factory`` fixtures)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx

from consumer_sdk import AsyncConsumer, AsyncProducer, Client, Consumer, Message, Producer
from tests.conftest import ServerFactory
from tests.support import RunningServer, wait_until

FAST_GROUP = {"retry_backoff_ms": [10], "max_attempts": 5}


def group_stats(url: str, group: str) -> dict[str, Any]:
    with Client(url) as client:
        stats: dict[str, Any] = client.get_group(group)["stats"]
        return stats


def fully_acked(url: str, group: str) -> bool:
    stats = group_stats(url, group)
    return stats["in_flight"] == 0 and all(q["lag"] == 0 for q in stats["queues"])


class OrderChecker:
    """Records the order in which each order value is handled, and any overlap within one."""

    def __init__(self, order_value: Any, fail_first: Any = lambda n: False) -> None:
        self.order_value = order_value
        self.fail_first = fail_first
        self.lock = threading.Lock()
        self.running: set[Any] = set()
        self.overlaps = 0
        self.handled: dict[Any, list[int]] = defaultdict(list)
        self.pause = threading.Event()

    def __call__(self, msg: Message) -> None:
        value, n = self.order_value(msg), msg.body["n"]
        with self.lock:
            self.overlaps += value in self.running
            self.running.add(value)
        try:
            self.pause.wait(0.001)  # simulated work, so that handlers really overlap
            if msg.attempt == 1 and self.fail_first(n):
                raise ValueError(f"boom {n}")
            with self.lock:
                self.handled[value].append(n)
        finally:
            with self.lock:
                self.running.discard(value)

    def count(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.handled.values())


def test_key_order_holds_across_workers_and_failures(server: RunningServer) -> None:
    with Producer(server.url) as producer:
        producer.create_topic("rides", 4)
        producer.send_batch(
            "rides", [{"key": f"ride-{n % 8}", "body": {"n": n}} for n in range(200)]
        )
    checker = OrderChecker(lambda m: m.key, fail_first=lambda n: n % 11 == 0)
    consumer = Consumer(
        server.url,
        group="billing",
        topics=["rides"],
        handler=checker,
        concurrency=8,
        wait_ms=200,
        ensure_group={"order_by": "key", **FAST_GROUP},
    )
    with consumer:
        wait_until(lambda: checker.count() == 200, 30, message="all handled")
    assert checker.overlaps == 0
    for key, ns in checker.handled.items():
        assert ns == sorted(ns), key
    assert consumer.stats().failed == len([n for n in range(200) if n % 11 == 0])
    wait_until(lambda: fully_acked(server.url, "billing"), message="acked")


def test_same_key_runs_are_handled_in_order_by_both_consumers(server: RunningServer) -> None:
    with Producer(server.url) as producer:
        producer.create_topic("runs", 2)
        producer.send_batch("runs", [{"qid": n % 2, "body": {"n": n}} for n in range(300)])
    checker = OrderChecker(lambda m: m.qid, fail_first=lambda n: n % 13 == 0)
    group = {"topics": {"runs": {"order_by": "qid"}}, **FAST_GROUP}
    consumer = Consumer(
        server.url,
        group="serial",
        handler=checker,
        concurrency=4,
        wait_ms=200,
        max_per_key=16,
        ensure_group=group,
    )
    with consumer:
        wait_until(lambda: checker.count() == 300, 30, message="all handled")
    assert checker.overlaps == 0
    for qid, ns in checker.handled.items():
        assert ns == sorted(ns) and len(ns) == 150, qid
    # Runs cut the round trips: far fewer pulls than the 300 one-message hops of qid order.
    assert consumer.stats().pulls < 150
    wait_until(lambda: fully_acked(server.url, "serial"), message="acked")


class CountingTransport(httpx.AsyncHTTPTransport):
    """A real transport that counts requests by their last path segment (pull, ack, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.calls[request.url.path.rsplit("/", 1)[-1]] += 1
        return await super().handle_async_request(request)


def test_acks_inside_a_run_wait_for_its_last_message(server: RunningServer) -> None:
    # One chain (order_by qid, one queue) consumed in runs, with handlers slower than
    # ack_linger_ms: acking a run's message while the rest of the run waits here releases
    # nothing, so those acks ride along with the run's last one (at most one ack request per
    # run) instead of costing a request each.
    with Producer(server.url) as producer:
        producer.create_topic("chain", 1)
        producer.send_batch("chain", [{"body": {"n": n}} for n in range(64)])
    seen: list[int] = []
    pause = threading.Event()

    def handle(msg: Message) -> None:
        pause.wait(0.015)  # simulated work, longer than the 10 ms linger
        seen.append(msg.body["n"])

    transport = CountingTransport()
    consumer = Consumer(
        server.url,
        group="chain-g",
        handler=handle,
        max_per_key=32,
        wait_ms=1000,
        ensure_group={"topics": {"chain": {"order_by": "qid"}}},
        transport=transport,
    )
    with consumer:
        wait_until(lambda: len(seen) == 64, 30, message="all handled")
    assert seen == list(range(64))
    answered = consumer.stats().received
    assert answered == 64
    # Each run came in one pull; the last ack of the final run may go in the stop's flush.
    assert transport.calls["ack"] <= transport.calls["pull"] + 1, transport.calls
    assert transport.calls["pull"] < 32, transport.calls
    wait_until(lambda: fully_acked(server.url, "chain-g"), message="acked")


async def test_async_consumer_handles_runs_in_order(server: RunningServer) -> None:
    async with AsyncProducer(server.url) as producer:
        await producer.create_topic("aruns", 1)
        await producer.send_batch("aruns", [{"key": "k", "body": {"n": n}} for n in range(100)])
    seen: list[int] = []

    async def handle(msg: Message) -> None:
        if msg.attempt == 1 and msg.body["n"] % 17 == 5:
            raise ValueError("boom")
        seen.append(msg.body["n"])

    group = {"topics": {"aruns": {"order_by": "key"}}, **FAST_GROUP}
    async with AsyncConsumer(
        server.url,
        group="aserial",
        handler=handle,
        max_per_key=8,
        wait_ms=200,
        ensure_group=group,
    ):
        for _ in range(600):
            if len(seen) == 100:
                break
            await asyncio.sleep(0.05)
    assert seen == list(range(100))


def test_json_path_order_holds_across_workers_and_failures(server: RunningServer) -> None:
    with Producer(server.url) as producer:
        producer.create_topic("events", 2)
        producer.send_batch(
            "events",
            [{"qid": n % 6 % 2, "body": {"n": n, "ride": {"id": n % 6}}} for n in range(120)],
        )
    checker = OrderChecker(lambda m: m.body["ride"]["id"], fail_first=lambda n: n % 7 == 3)
    group = {"topics": {"events": {"order_by": "$.ride.id"}}, **FAST_GROUP}
    with Consumer(
        server.url, group="audit", handler=checker, concurrency=6, wait_ms=200, ensure_group=group
    ):
        wait_until(lambda: checker.count() == 120, 30, message="all handled")
    assert checker.overlaps == 0
    assert sorted(checker.handled) == list(range(6))
    for ride, ns in checker.handled.items():
        assert ns == sorted(ns) and len(ns) == 20, ride
    wait_until(lambda: fully_acked(server.url, "audit"), message="acked")


def test_stop_mid_stream_loses_no_result(server: RunningServer) -> None:
    with Producer(server.url) as producer:
        producer.create_topic("rides", 4)
        producer.send_batch("rides", [{"key": f"k{n % 30}", "body": {"n": n}} for n in range(400)])
    first: list[int] = []
    lock = threading.Lock()
    work = threading.Event()

    def slow(msg: Message) -> None:
        work.wait(0.002)
        with lock:
            first.append(msg.body["n"])

    consumer = Consumer(
        server.url,
        group="g",
        topics=["rides"],
        handler=slow,
        concurrency=8,
        wait_ms=200,
        ensure_group={"order_by": "key"},
    )
    consumer.start()
    wait_until(lambda: len(first) >= 50, message="some handled")
    consumer.stop()
    assert group_stats(server.url, "g")["in_flight"] == 0
    assert len(first) < 400
    # Everything handled was acked: a second consumer gets exactly the rest, once each.
    second: list[int] = []
    with Consumer(server.url, group="g", handler=lambda m: second.append(m.body["n"]), wait_ms=200):
        wait_until(lambda: len(first) + len(second) >= 400, 30, message="the rest handled")
        wait_until(lambda: fully_acked(server.url, "g"), message="acked")
    assert sorted(first + second) == list(range(400))


def test_pulls_spread_over_two_servers(server_factory: ServerFactory) -> None:
    a, b = server_factory(), server_factory()
    for srv, base in ((a, 0), (b, 1000)):
        with Producer(srv.url) as producer:
            producer.create_topic("rides", 2)
            producer.send_batch(
                "rides", [{"key": f"k{n % 5}", "body": {"n": base + n}} for n in range(60)]
            )
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def handle(msg: Message) -> None:
        with lock:
            seen[msg.server] += 1

    with Consumer(
        [a.url, b.url],
        group="g",
        topics=["rides"],
        handler=handle,
        wait_ms=200,
        ensure_group={"order_by": "key"},
    ) as consumer:
        wait_until(lambda: sum(seen.values()) == 120, 30, message="both servers drained")
        wait_until(lambda: fully_acked(a.url, "g") and fully_acked(b.url, "g"), message="acked")
    assert seen == {a.url: 60, b.url: 60}
    assert consumer.stats().unknown_results == 0


def test_lease_extension_prevents_redelivery_of_a_slow_message(server: RunningServer) -> None:
    with Producer(server.url) as producer:
        producer.create_topic("jobs", 1)
        producer.send("jobs", {"n": 0}, key="slow")
        producer.send("jobs", {"n": 1}, key="slow")
    attempts: list[tuple[int, int]] = []
    work = threading.Event()

    def slow(msg: Message) -> None:
        attempts.append((msg.body["n"], msg.attempt))
        if msg.body["n"] == 0:
            work.wait(2.5)  # two and a half times the group's 1 s ack timeout

    with Consumer(
        server.url,
        group="g",
        topics=["jobs"],
        handler=slow,
        wait_ms=200,
        ensure_group={"order_by": "key", "ack_timeout_ms": 1000},
    ) as consumer:
        wait_until(lambda: len(attempts) >= 2, 10, message="both handled")
        wait_until(lambda: fully_acked(server.url, "g"), message="acked")
    assert attempts == [(0, 1), (1, 1)]
    assert consumer.stats().extended >= 2  # every ~333 ms (a third of the timeout)
    assert consumer.stats().leases_lost == 0


def test_exhausted_failures_dead_letter_with_the_handler_error(server: RunningServer) -> None:
    with Producer(server.url) as producer:
        producer.create_topic("rides", 1)
        producer.send("rides", {"n": 0}, key="bad")
        producer.send("rides", {"n": 1}, key="bad")
    ok: list[int] = []
    tries_of_0: list[tuple[int, int]] = []

    def handle(msg: Message) -> None:
        if msg.body["n"] == 0:
            tries_of_0.append((msg.attempt, msg.charged_attempts))
            raise ValueError("card declined")
        ok.append(msg.body["n"])

    group = {"order_by": "key", "retry_backoff_ms": [10], "max_attempts": 2}
    with Consumer(
        server.url, group="g", topics=["rides"], handler=handle, wait_ms=200, ensure_group=group
    ):
        wait_until(lambda: ok == [1], 10, message="the chain moved on")
        with Client(server.url) as client:
            [dead] = client.dead_letters("g")
            assert (dead["offset"], dead["attempts"]) == (0, 2)
            assert dead["last_error"] == "ValueError: card declined"
            assert client.redrive("g") == 1
        wait_until(lambda: len(tries_of_0) == 4, 10, message="redriven and failed again")
    # Redriven with a fresh charge budget; delivery numbers go on (never reused).
    assert tries_of_0 == [(1, 0), (2, 1), (3, 0), (4, 1)]


async def test_async_for_against_a_real_server(server: RunningServer) -> None:
    async with AsyncProducer(server.url) as producer:
        await producer.create_topic("rides", 2)
        await producer.send_batch("rides", [{"key": f"k{n % 3}", "body": n} for n in range(30)])
    seen: list[int] = []
    async with AsyncConsumer(
        server.url, group="g", topics=["rides"], wait_ms=200, ensure_group={"order_by": "key"}
    ) as consumer:
        async for msg in consumer:
            seen.append(msg.body)
            if len(seen) == 30:
                break
    assert sorted(seen) == list(range(30))
    for k in range(3):
        ns = [n for n in seen if n % 3 == k]
        assert ns == sorted(ns)
    wait_until(lambda: fully_acked(server.url, "g"), message="acked")


CRASHING_CONSUMER = textwrap.dedent(
    """
    import os, sys
    from consumer_sdk import Consumer, idempotent

    url, store, effects = sys.argv[1:]

    @idempotent(key=lambda m: m.body["payment"], store=store, namespace="billing")
    def apply(msg):
        with open(effects, "a") as f:
            f.write(msg.body["payment"] + "\\n")

    def crash_after_handling(msg):
        apply(msg)
        os._exit(17)  # dies after the side effect, before any ack leaves the process

    Consumer(url, group="billing", topics=["payments"], handler=crash_after_handling,
             wait_ms=200).run()
    """
)


def test_idempotency_skips_redelivery_after_crash_between_handling_and_ack(
    server: RunningServer, tmp_path: Path
) -> None:
    store, effects = tmp_path / "idem.sqlite3", tmp_path / "effects.txt"
    with Producer(server.url) as producer:
        producer.create_topic("payments", 1)
        producer.send("payments", {"payment": "pay-1"}, key="acct-9")
        with Client(server.url) as client:
            client.put_group("billing", {"topics": {"payments": {}}, "ack_timeout_ms": 300})
    script = tmp_path / "crash.py"
    script.write_text(CRASHING_CONSUMER)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run(
        [sys.executable, str(script), server.url, str(store), str(effects)],
        env=env,
        check=False,
        timeout=60,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 17, done.stderr
    assert effects.read_text() == "pay-1\n"

    from consumer_sdk import idempotent  # the restarted consumer, same store and namespace

    attempts: list[int] = []

    @idempotent(key=lambda m: m.body["payment"], store=store, namespace="billing")
    def apply(msg: Message) -> None:
        effects.write_text(effects.read_text() + msg.body["payment"] + "\n")

    def handle(msg: Message) -> None:
        attempts.append(msg.attempt)
        apply(msg)

    with Consumer(server.url, group="billing", topics=["payments"], handler=handle, wait_ms=200):
        wait_until(lambda: attempts, 10, message="redelivery after the ack timeout")
        wait_until(lambda: fully_acked(server.url, "billing"), message="acked")
    assert attempts == [2]  # the crashed delivery was attempt 1
    assert effects.read_text() == "pay-1\n"  # applied once
