"""Push delivery (cproxy.broker.push) against a real HTTP receiver on a loopback port.

The broker runs on the test's event loop over the memory store; the receiver
(``tests.push_receiver``) runs uvicorn in a thread, and each test decides per key what it
answers: 2xx, another status, nothing at all (a stall), or it goes away entirely.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import random
import socket
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import anyio
import orjson
import pytest

from cproxy.broker.broker import Broker
from cproxy.engine.group_config import GroupConfig
from cproxy.errors import ConfigError, PushTargetRefused
from cproxy.model import NewMessage
from cproxy.push_targets import Resolve
from cproxy.store.memory import MemoryStore
from tests.broker.test_broker import SETTINGS
from tests.push_receiver import STALL, Receiver, always_ok


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.start()
    try:
        yield r
    finally:
        r.stop()


@asynccontextmanager
async def pushing(
    url: str,
    topic_queues: int = 4,
    allowed: tuple[str, ...] | None = None,
    resolve: Resolve | None = None,
    **group: Any,
) -> AsyncIterator[Broker]:
    """A started broker with topic ``t`` and group ``g`` pushing ``t`` to ``url``;
    ``allowed``: ``[push] allowed_urls`` (default: ``url``, as the receivers are on
    loopback); ``resolve``: a stub resolver for the push target check."""
    push = {"url": url, **group.pop("push", {})}
    settings = replace(SETTINGS, push_allowed_urls=(url,) if allowed is None else allowed)
    broker = Broker(MemoryStore(), settings)
    if resolve is not None:
        broker.push_targets.resolve = resolve
    async with anyio.create_task_group() as tg:
        await broker.start(tg)
        try:
            await broker.create_topic("t", topic_queues)
            config = {"topics": {"t": {"order_by": "key", "push": push}}, **group}
            await broker.put_group("g", GroupConfig.from_dict(config))
            yield broker
        finally:
            await broker.stop()
            tg.cancel_scope.cancel()


async def produce(broker: Broker, per_key: int, keys: list[str]) -> None:
    """``per_key`` messages for each key, interleaved, body ``{"k": key, "seq": i}``."""
    batch = [NewMessage(k, orjson.dumps({"k": k, "seq": i})) for i in range(per_key) for k in keys]
    for start in range(0, len(batch), 500):
        await broker.produce("t", batch[start : start + 500])


async def eventually(predicate: Callable[[], Any], timeout_s: float = 20, what: str = "") -> Any:
    """Poll ``predicate`` on the event loop until truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}")
        await anyio.sleep(0.02)


async def drained(broker: Broker, timeout_s: float = 30) -> None:
    """Every message of group ``g`` is acked or dead-lettered."""

    async def done() -> bool:
        view = await broker.describe_group("g")
        s = view.stats
        return s.buffered == 0 and all(q.lag == 0 for q in s.queues)

    deadline = time.monotonic() + timeout_s
    while not await done():
        if time.monotonic() > deadline:
            raise AssertionError("group g did not drain")
        await anyio.sleep(0.05)


def seqs_by_key(messages: list[dict[str, Any]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for m in messages:
        out[m["key"]].append(m["body"]["seq"])
    return out


# -- config ---------------------------------------------------------------------------------
def test_push_config_is_validated_and_round_trips() -> None:
    base = {"topics": {"t": {"order_by": "key", "push": {"url": "http://h:1/p"}}}}
    config = GroupConfig.from_dict(base)
    push = config.push["t"]
    assert (push.max_in_flight, push.timeout_ms, push.secret, dict(push.headers)) == (
        64,
        10_000,
        None,
        {},
    )
    assert GroupConfig.from_dict(config.to_dict()).to_dict() == config.to_dict()
    for bad in [
        {"url": "ftp://h/p"},
        {"url": "not a url"},
        {},
        {"url": "http://h/p", "max_in_flight": 0},
        {"url": "http://h/p", "max_in_flight": 1025},
        {"url": "http://h/p", "timeout_ms": "10"},
        {"url": "http://h/p", "headers": {"a": 1}},
        {"url": "http://h/p", "headers": {"X-Cproxy-Signature": "x"}},
        {"url": "http://h/p", "secret": ""},
        {"url": "http://h/p", "retries": 3},
        "http://h/p",
    ]:
        with pytest.raises(ConfigError):
            GroupConfig.from_dict({"topics": {"t": {"push": bad}}})


# -- delivery -------------------------------------------------------------------------------
async def test_pushed_messages_are_acked_in_key_order(receiver: Receiver) -> None:
    keys = [f"k{i}" for i in range(20)]
    async with pushing(receiver.url) as broker:
        await produce(broker, 10, keys)
        await drained(broker)
        view = await broker.describe_group("g")
    got = seqs_by_key(receiver.acked_messages())
    assert got == {k: list(range(10)) for k in keys}
    assert receiver.overlaps == 0
    assert all(m["attempt"] == 1 for m in receiver.acked_messages())
    assert view.dead_lettered == 0
    (stats,) = view.push
    assert (stats.topic, stats.url, stats.in_flight, stats.last_error) == (
        "t",
        receiver.url,
        0,
        None,
    )
    # The pull shape: every field a pulled message has.
    first = receiver.requests[0]
    assert set(first.messages[0]) == {
        "topic",
        "qid",
        "offset",
        "key",
        "body",
        "headers",
        "attempt",
        "charged_attempts",
        "produced_at_ms",
    }
    assert first.headers["content-type"] == "application/json"


async def test_order_holds_per_key_with_16_in_flight_and_random_failures() -> None:
    rng = random.Random(7)

    def flaky(messages: list[dict[str, Any]], headers: dict[str, str]) -> tuple[int, float]:
        # Random latency: answers overtake each other across keys.
        return (503 if rng.random() < 0.1 else 200), rng.random() * 0.005

    receiver = Receiver(flaky).start()
    keys = [f"k{i}" for i in range(50)]
    try:
        async with pushing(
            receiver.url, push={"max_in_flight": 16}, retry_backoff_ms=[5], max_attempts=100
        ) as broker:
            await produce(broker, 20, keys)
            await drained(broker, 60)
    finally:
        receiver.stop()
    assert seqs_by_key(receiver.acked_messages()) == {k: list(range(20)) for k in keys}
    assert receiver.overlaps == 0
    assert 1 < receiver.max_open <= 16
    # A key's failed message was retried before anything after it was sent.
    sent = seqs_by_key(
        [m for r in sorted(receiver.requests, key=lambda r: r.at) for m in r.messages]
    )
    for key, seqs in sent.items():
        assert seqs == sorted(seqs), key


async def test_failing_status_is_retried_then_dead_lettered(receiver: Receiver) -> None:
    def decide(messages: list[dict[str, Any]], headers: dict[str, str]) -> int:
        return 500 if messages[0]["key"] == "bad" and messages[0]["body"]["seq"] == 0 else 200

    receiver.decide = decide
    async with pushing(receiver.url, max_attempts=3, retry_backoff_ms=[10]) as broker:
        await produce(broker, 3, ["bad", "good"])
        await drained(broker)
        view = await broker.describe_group("g")
        dead = await broker.operator.dead_letters("g", None, 10)
    attempts = [
        m["attempt"] for r in receiver.answered(500) for m in r.messages if m["key"] == "bad"
    ]
    assert attempts == [1, 2, 3]
    assert [(d.message.key, d.attempts, d.last_error) for d in dead] == [
        ("bad", 3, "push endpoint answered HTTP 500")
    ]
    got = seqs_by_key(receiver.acked_messages())
    assert got == {"bad": [1, 2], "good": [0, 1, 2]}
    assert view.push[0].last_error == "push endpoint answered HTTP 500"


async def test_a_timeout_is_a_charged_fail_and_holds_only_its_key(receiver: Receiver) -> None:
    stalled: list[int] = []

    def decide(messages: list[dict[str, Any]], headers: dict[str, str]) -> int:
        first = messages[0]
        if first["key"] == "slow" and first["body"]["seq"] == 0 and first["attempt"] == 1:
            stalled.append(first["body"]["seq"])
            return STALL
        return 200

    receiver.decide = decide
    keys = ["slow"] + [f"k{i}" for i in range(30)]
    async with pushing(
        receiver.url, push={"timeout_ms": 1000, "max_in_flight": 4}, retry_backoff_ms=[10]
    ) as broker:
        await produce(broker, 5, keys)
        # The other keys finish while "slow"'s first message is stalled on the receiver.
        healthy = 30 * 5
        await eventually(
            lambda: len([m for m in receiver.acked_messages() if m["key"] != "slow"]) == healthy,
            what="healthy keys done",
        )
        assert [m for m in receiver.acked_messages() if m["key"] == "slow"] == []
        await drained(broker)
        view = await broker.describe_group("g")
    slow = [m for m in receiver.acked_messages() if m["key"] == "slow"]
    assert [(m["body"]["seq"], m["attempt"]) for m in slow] == [(0, 2)] + [
        (i, 1) for i in range(1, 5)
    ]
    assert stalled == [0] and receiver.overlaps == 0
    assert view.push[0].last_error == "push timed out after 1000 ms"
    assert view.dead_lettered == 0


async def test_receiver_gone_pauses_without_charging_attempts_then_resumes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    receiver = Receiver().start()
    receiver.stop()  # the port is known, nothing listens on it: connections are refused
    caplog.set_level(logging.DEBUG, logger="cproxy.broker.push")
    try:
        async with pushing(receiver.url, max_attempts=2) as broker:
            await produce(broker, 5, ["a", "b", "c"])

            async def paused() -> Any:
                return (await broker.describe_group("g")).push[0].paused_until_ms

            deadline = time.monotonic() + 10
            while await paused() is None:
                assert time.monotonic() < deadline, "push never paused"
                await anyio.sleep(0.02)
            await anyio.sleep(2)  # backing off: a few probes, each charging nothing
            view = await broker.describe_group("g")
            assert "ConnectError" in (view.push[0].last_error or "")
            assert view.dead_lettered == 0 and view.stats.retrying == 0
            probes = [r for r in caplog.records if "probe failed" in r.getMessage()]
            assert 2 <= len(probes) <= 8, len(probes)  # exponential: not a hot loop
            receiver.start()
            await drained(broker)
            view = await broker.describe_group("g")
    finally:
        receiver.stop()
    assert seqs_by_key(receiver.acked_messages()) == {k: list(range(5)) for k in "abc"}
    # Nothing charged; but each probe was a hand-out of its own, so the probed messages
    # arrive with a later delivery number (a result for a probe's delivery is unknown).
    assert all(m["charged_attempts"] == 0 for m in receiver.acked_messages())
    assert any(m["attempt"] > 1 for m in receiver.acked_messages())
    assert view.dead_lettered == 0 and view.push[0].paused_until_ms is None
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "unreachable" in warnings[0].getMessage()
    assert len([r for r in caplog.records if "reachable again" in r.getMessage()]) == 1


async def test_requests_are_signed_and_carry_configured_headers(receiver: Receiver) -> None:
    secret = "s3cret"
    async with pushing(
        receiver.url, push={"secret": secret, "headers": {"Authorization": "Bearer xyz"}}
    ) as broker:
        await produce(broker, 2, ["a", "b"])
        await drained(broker)
    assert len(receiver.requests) == 4
    for r in receiver.requests:
        expected = "sha256=" + hmac.new(secret.encode(), r.body, hashlib.sha256).hexdigest()
        assert r.headers["x-cproxy-signature"] == expected
        assert r.headers["authorization"] == "Bearer xyz"


async def test_unsigned_without_a_secret(receiver: Receiver) -> None:
    async with pushing(receiver.url) as broker:
        await produce(broker, 1, ["a"])
        await drained(broker)
    assert "x-cproxy-signature" not in receiver.requests[0].headers


async def test_runs_are_pushed_as_one_request_in_order(receiver: Receiver) -> None:
    async with pushing(receiver.url, topic_queues=1, push={"max_per_key": 4}) as broker:
        await produce(broker, 10, ["a"])
        await drained(broker)
    sizes = [len(r.messages) for r in receiver.requests]
    assert sum(sizes) == 10 and max(sizes) > 1 and all(s <= 4 for s in sizes)
    assert seqs_by_key(receiver.acked_messages()) == {"a": list(range(10))}
    assert all(m["run"] == 0 for r in receiver.requests for m in r.messages)


async def test_a_push_group_can_still_be_pulled_by_an_operator(receiver: Receiver) -> None:
    receiver.decide = lambda messages, headers: STALL
    async with pushing(receiver.url, push={"max_in_flight": 1}) as broker:
        await produce(broker, 1, ["a", "b"])
        await eventually(lambda: len(receiver.requests) == 1, what="first push")
        pulled = await broker.pull("g", 10, 1000, None, [])
        assert len(pulled.deliveries) == 1  # the key not held by the pusher
        receiver.decide = always_ok
        receiver.unstall()


# -- where push may send (cproxy.push_targets) ------------------------------------------------
class _Rebinding:
    """A resolver stub: ``host`` resolves to a public address at the first lookup (the PUT)
    and to loopback, where the receiver listens, at every later one (the connections)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.lookups = 0

    async def __call__(self, host: str, port: int, family: int) -> list[tuple[int, str]]:
        assert host == self.host, host
        self.lookups += 1
        return [(socket.AF_INET, "93.184.216.34" if self.lookups == 1 else "127.0.0.1")]


async def test_a_name_rebound_to_an_internal_address_is_refused_when_connecting(
    receiver: Receiver,
) -> None:
    rebinding = _Rebinding("hooks.rebind.test")
    url = f"http://hooks.rebind.test:{receiver.port}/push"
    async with pushing(url, allowed=(), resolve=rebinding) as broker:
        await produce(broker, 1, ["a"])

        async def refused() -> str | None:
            view = await broker.describe_group("g")
            return view.push[0].last_error

        deadline = time.monotonic() + 20
        while not (error := await refused()):
            assert time.monotonic() < deadline, "no push attempt"
            await anyio.sleep(0.02)
        view = await broker.describe_group("g")
    assert "127.0.0.1" in error and "internal address" in error, error
    assert rebinding.lookups >= 2  # resolved at PUT and again to connect
    assert receiver.requests == []  # nothing reached the loopback receiver
    assert view.dead_lettered == 0 and view.stats.retrying == 0  # uncharged


async def test_a_name_resolving_to_an_internal_address_is_refused_at_put(
    receiver: Receiver,
) -> None:
    async def private(host: str, port: int, family: int) -> list[tuple[int, str]]:
        return [(socket.AF_INET, "10.1.2.3")]

    async with pushing(receiver.url, resolve=private) as broker:
        entry = {"push": {"url": "http://hooks.internal.test/p"}}
        with pytest.raises(PushTargetRefused, match=r"10\.1\.2\.3"):
            await broker.put_group("h", GroupConfig.from_dict({"topics": {"t": entry}}))
        assert [g.name for g in broker.list_groups()] == ["g"]


async def test_a_redirect_is_a_failed_delivery_and_is_not_followed(receiver: Receiver) -> None:
    answers = iter([307])
    receiver.decide = lambda messages, headers: next(answers, 200)
    async with pushing(receiver.url, max_attempts=3, retry_backoff_ms=[10]) as broker:
        await produce(broker, 1, ["a"])
        await drained(broker)
    statuses = [r.status for r in receiver.requests]
    assert statuses == [307, 200], statuses  # a followed redirect would repeat attempt 1
    assert [r.messages[0]["attempt"] for r in receiver.requests] == [1, 2]
