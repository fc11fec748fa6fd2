"""The sync Consumer's loop against the fake server (no sockets)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import defaultdict
from typing import Any

import httpx
import pytest

from consumer_sdk import Consumer, ConsumerError, Message, ResourceNotFound, RetryPolicy

from .fake import FakeServer, multi_transport, wait_for

FAST_RETRY = RetryPolicy(initial_backoff_ms=1, max_backoff_ms=5)


def make_fake(url: str = "http://fake", **kwargs: Any) -> FakeServer:
    fake = FakeServer(url, **kwargs)
    fake.add_topic("rides")
    fake.add_group("g", topics={"rides": {"order_by": "key"}})
    return fake


def consumer(fake: FakeServer | list[FakeServer], handler: Any, **kwargs: Any) -> Consumer:
    fakes = fake if isinstance(fake, list) else [fake]
    kwargs.setdefault("wait_ms", 50)
    return Consumer(
        [f.url for f in fakes],
        group="g",
        topics=["rides"],
        handler=handler,
        transport=multi_transport(*fakes),
        retry=FAST_RETRY,
        handle_signals=False,
        **kwargs,
    )


def done(fake: FakeServer) -> bool:
    return all(m.state == "done" for m in fake.messages)


class KeyOrderRecorder:
    """Handler recording per-key order; fails the first attempt of chosen messages and checks
    that two messages of one key never run at the same time."""

    def __init__(self, fail_first: frozenset[int] = frozenset(), delay_s: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.running: set[str] = set()
        self.handled: dict[str, list[int]] = defaultdict(list)
        self.attempts: dict[int, int] = defaultdict(int)
        self.overlaps = 0
        self.fail_first = fail_first
        self.delay = threading.Event()
        self.delay_s = delay_s

    def __call__(self, msg: Message) -> None:
        n = msg.body["n"]
        with self.lock:
            assert msg.key is not None
            if msg.key in self.running:
                self.overlaps += 1
            self.running.add(msg.key)
            self.attempts[n] += 1
        try:
            if self.delay_s:
                self.delay.wait(self.delay_s)  # simulated work, not test synchronisation
            if n in self.fail_first and msg.attempt == 1:
                raise ValueError(f"boom {n}")
            with self.lock:
                self.handled[msg.key].append(n)
        finally:
            with self.lock:
                self.running.discard(msg.key)


def test_handles_each_key_in_order_across_workers_with_failures() -> None:
    fake = make_fake()
    for n in range(60):
        fake.produce("rides", {"n": n}, key=f"k{n % 4}")
    recorder = KeyOrderRecorder(fail_first=frozenset({3, 10, 17, 40}), delay_s=0.001)
    with consumer(fake, recorder, concurrency=4) as c:
        wait_for(lambda: done(fake))
    for key, ns in recorder.handled.items():
        assert ns == sorted(ns) and len(ns) == 15, key
    assert recorder.overlaps == 0
    assert all(recorder.attempts[n] == 2 for n in (3, 10, 17, 40))
    # The failure reached the server in the extended form, with the handler's exception.
    assert fake.messages[3].errors == ["ValueError: boom 3"]
    stats = c.stats()
    assert (stats.acked, stats.failed, stats.outstanding, stats.pending_results) == (60, 4, 0, 0)


def test_every_result_names_the_attempt_it_answers() -> None:
    fake = make_fake()
    for n in range(6):
        fake.produce("rides", {"n": n}, key=f"k{n}")
    recorder = KeyOrderRecorder(fail_first=frozenset({2}))
    with consumer(fake, recorder, concurrency=2):
        wait_for(lambda: done(fake))
    sent = [
        item
        for method, path, body in fake.calls
        if method == "POST" and path.endswith(("/pull", "/ack")) and body
        for r in body.get("results", [])
        for item in (*r["acks"], *r["fails"])
    ]
    assert sent and all(isinstance(i, dict) and i["attempt"] >= 1 for i in sent)
    assert {"offset": 2, "attempt": 2} in sent  # the retried message's ack is fenced to it


def test_stop_mid_stream_finishes_handlers_and_flushes_results() -> None:
    fake = make_fake()
    for n in range(200):
        fake.produce("rides", {"n": n}, key=f"k{n % 20}")
    handled: list[int] = []
    work = threading.Event()

    def handle(msg: Message) -> None:
        work.wait(0.002)  # simulated work
        handled.append(msg.body["n"])

    c = consumer(fake, handle, concurrency=8)
    c.start()
    wait_for(lambda: len(handled) >= 30)
    c.stop()
    assert not c.running
    assert fake.in_flight() == 0
    acked = [m.body["n"] for m in fake.messages if m.state == "done"]
    assert sorted(acked) == sorted(handled)
    assert 30 <= len(handled) < 200


def test_pull_errors_are_retried_without_losing_results() -> None:
    fake = make_fake()
    for n in range(40):
        fake.produce("rides", {"n": n}, key=f"k{n % 2}")
    fake.fail_next[("POST", "/pull")] = [503, httpx.ConnectError("down"), 503]
    fake.fail_next[("POST", "/ack")] = [httpx.ReadTimeout("slow")]
    handled: list[int] = []
    with consumer(fake, lambda m: handled.append(m.body["n"])) as c:
        wait_for(lambda: done(fake))
    assert sorted(handled) == list(range(40))
    assert c.stats().pull_errors >= 3


def test_results_do_not_wait_for_a_long_poll() -> None:
    # Message 0 outlasts ack_linger_ms, so the puller is already in its long poll when the
    # handler returns; the ack must go out on its own for the server to release message 1.
    fake = make_fake()
    fake.produce("rides", {"n": 0}, key="k")
    fake.produce("rides", {"n": 1}, key="k")
    handled: list[float] = []
    work = threading.Event()

    def handle(msg: Message) -> None:
        if msg.body["n"] == 0:
            work.wait(0.1)  # simulated work
        handled.append(time.monotonic())

    with consumer(fake, handle, wait_ms=1500):
        wait_for(lambda: len(handled) == 2)
        assert handled[1] - handled[0] < 0.5
    assert fake.count("POST", "/ack") >= 1


@pytest.mark.parametrize("extend", [True, False])
def test_lease_extension_keeps_a_slow_message_from_redelivery(extend: bool) -> None:
    fake = make_fake(ack_timeout_ms=300)
    fake.add_group("g", topics={"rides": {}})
    fake.produce("rides", {"n": 0}, key="slow")
    attempts: list[int] = []
    release = threading.Event()

    def slow(msg: Message) -> None:
        attempts.append(msg.attempt)
        release.wait(0.9)  # three ack timeouts of handler work

    after = 50 if extend else 10_000
    with consumer(fake, slow, extend_after_ms=after, extend_lease_ms=300) as c:
        if extend:
            wait_for(lambda: done(fake))
        else:
            wait_for(lambda: len(attempts) >= 2)
    if extend:
        assert attempts == [1]
        assert c.stats().extended >= 3 and c.stats().leases_lost == 0
    else:  # the control: without extension the server redelivers while the first still runs
        assert attempts[:2] == [1, 2]


def test_unknown_group_fails_start() -> None:
    fake = make_fake()
    c = Consumer(
        fake.url, group="missing", handler=print, transport=fake.transport(), handle_signals=False
    )
    with pytest.raises(ResourceNotFound) as info:
        c.start()
    assert info.value.code == "group_not_found"
    assert not c.running


def test_group_vanishing_stops_run_with_the_error() -> None:
    fake = make_fake()
    fake.fail_next[("POST", "/pull")] = [404]
    c = consumer(fake, print)
    with pytest.raises(ResourceNotFound):
        c.run()


def test_ensure_group_puts_the_config_on_every_server() -> None:
    a, b = FakeServer("http://a"), FakeServer("http://b")
    for f in (a, b):
        f.add_topic("rides")
    c = Consumer(
        [a.url, b.url],
        group="fresh",
        topics=["rides"],
        handler=print,
        transport=multi_transport(a, b),
        handle_signals=False,
        wait_ms=10,
        ensure_group={"order_by": "$.ride", "ack_timeout_ms": 9000},
    )
    with c:
        pass
    for f in (a, b):
        assert f.groups["fresh"]["topics"] == {"rides": {"order_by": "$.ride"}}
    assert c.config.extend_after_ms is None  # derived at start from the group's 9 s timeout


def test_ensure_group_tolerates_a_server_down_at_start() -> None:
    a, b = FakeServer("http://a"), FakeServer("http://b")
    for f in (a, b):
        f.add_topic("rides")
        f.produce("rides", {"n": 0}, key="k")
    # a refuses connections for the whole start-up PUT (5 tries), then comes back.
    a.fail_next[("PUT", "/g")] = [httpx.ConnectError("down")] * 5
    seen: list[str] = []
    with Consumer(
        [a.url, b.url],
        group="g",
        topics=["rides"],
        handler=lambda m: seen.append(m.server),
        transport=multi_transport(a, b),
        handle_signals=False,
        wait_ms=10,
        retry=FAST_RETRY,
        ensure_group={"order_by": "key"},
    ):
        wait_for(lambda: done(a) and done(b))
    assert sorted(seen) == [a.url, b.url]
    assert a.count("PUT", "/g") == 6  # five failed at start, one after the first 404 pull


def test_ensure_group_is_validated_when_the_consumer_is_made() -> None:
    with pytest.raises(ValueError, match="topics"):
        Consumer("http://x", group="g", handler=print, ensure_group={"order_by": "key"})
    with pytest.raises(ValueError, match="not both"):
        Consumer(
            "http://x",
            group="g",
            handler=print,
            ensure_group={"order_by": "key", "topics": {"t": {}}},
        )


def test_two_servers_each_get_their_own_acks() -> None:
    a, b = make_fake("http://a"), make_fake("http://b")
    for n in range(20):
        a.produce("rides", {"n": n}, key=f"k{n % 3}")
        b.produce("rides", {"n": 100 + n}, key=f"k{n % 3}")
    seen: list[tuple[str, int]] = []
    with consumer([a, b], lambda m: seen.append((m.server, m.body["n"]))) as c:
        wait_for(lambda: done(a) and done(b))
    assert sorted(n for s, n in seen if s == a.url) == list(range(20))
    assert sorted(n for s, n in seen if s == b.url) == list(range(100, 120))
    assert c.stats().unknown_results == 0


def test_batch_runs_in_parallel_up_to_concurrency() -> None:
    fake = make_fake()
    for n in range(4):
        fake.produce("rides", {"n": n}, key=f"k{n}")
    barrier = threading.Barrier(4, timeout=5)
    with consumer(fake, lambda m: barrier.wait(), concurrency=4):
        wait_for(lambda: done(fake))
    assert not barrier.broken


def test_after_a_full_answer_the_next_pull_does_not_wait_for_running_handlers() -> None:
    # The server had more ready than a pull asked for (a full answer of several keys): the
    # next pull goes out as soon as half a batch fits, while handlers still run, instead of
    # lingering for their results (which would leave workers idle between batches).
    fake = make_fake()
    for n in range(24):
        fake.produce("rides", {"n": n}, key=f"k{n}")
    unfinished_at_pull: list[int] = []
    serve = fake.handle

    async def recording(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/pull"):
            body = json.loads(request.content)
            carried = sum(
                len(r.get("acks", [])) + len(r.get("fails", [])) for r in body.get("results", [])
            )
            unfinished_at_pull.append(fake.in_flight() - carried)
        return await serve(request)

    fake.handle = recording  # type: ignore[method-assign]
    work = threading.Event()

    def handle(msg: Message) -> None:
        work.wait(0.02)  # simulated work, well within the linger below

    with consumer(fake, handle, concurrency=2, max_messages=4, ack_linger_ms=200):
        wait_for(lambda: done(fake))
    assert max(unfinished_at_pull) > 0, unfinished_at_pull


def test_stop_from_inside_a_handler_does_not_deadlock() -> None:
    fake = make_fake()
    fake.produce("rides", {"n": 0}, key="k")
    holder: list[Consumer] = []
    c = consumer(fake, lambda m: holder[0].stop())
    holder.append(c)
    c.run()  # returns once the handler asked to stop
    assert done(fake)


def test_async_handlers_are_refused_rather_than_acked_unrun() -> None:
    async def handle(msg: Message) -> None: ...

    with pytest.raises(TypeError, match="AsyncConsumer"):
        Consumer("http://x", group="g", handler=handle)
    fake = make_fake()
    fake.produce("rides", {"n": 0}, key="k")
    with consumer(fake, lambda m: handle(m)) as c:  # noqa: PLW0108 - hides it from the check
        wait_for(lambda: c.stats().failed >= 1)
    assert (
        fake.messages[0].errors[0]
        == "TypeError: the handler returned an awaitable: use AsyncConsumer"
    )


def test_start_twice_is_an_error() -> None:
    fake = make_fake()
    with consumer(fake, print) as c, pytest.raises(ConsumerError):
        c.start()


def test_sigterm_stops_run_gracefully() -> None:
    fake = make_fake()
    for n in range(500):
        fake.produce("rides", {"n": n}, key=f"k{n % 10}")
    handled: list[int] = []

    def handle(msg: Message) -> None:
        handled.append(msg.body["n"])
        if len(handled) == 20:
            os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    c = Consumer(fake.url, group="g", handler=handle, transport=fake.transport(), wait_ms=50)
    c.run()
    assert signal.getsignal(signal.SIGTERM) == previous
    assert fake.in_flight() == 0
    assert sorted(m.body["n"] for m in fake.messages if m.state == "done") == sorted(handled)
    assert len(handled) < 500
