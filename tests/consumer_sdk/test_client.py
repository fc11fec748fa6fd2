"""Clients and producers against the fake server: typed results, errors, retry rules."""

from __future__ import annotations

import httpx
import pytest

from consumer_sdk import (
    AsyncProducer,
    Client,
    ClientError,
    ConnectError,
    ConsumerConfig,
    Producer,
    QueueResult,
    RequestTimeout,
    ResourceNotFound,
    RetryPolicy,
    SendResult,
    ServerError,
    ServiceUnavailable,
)
from consumer_sdk._base import results_to_wire

from .fake import FakeServer

FAST = RetryPolicy(max_attempts=3, initial_backoff_ms=0, max_backoff_ms=0)


@pytest.fixture
def fake() -> FakeServer:
    fake = FakeServer()
    fake.add_topic("rides", queues=1)
    return fake


def producer(fake: FakeServer, retry: RetryPolicy = FAST) -> Producer:
    return Producer(fake.url, retry=retry, transport=fake.sync_transport())


def produce_calls(fake: FakeServer) -> int:
    return fake.count("POST", "/messages")


def test_send_returns_typed_results_and_dedups_by_id(fake: FakeServer) -> None:
    with producer(fake) as p:
        first = p.send("rides", {"ride": 7}, key="ride-7", id="e1")
        again = p.send("rides", {"ride": 7}, key="ride-7", id="e1")
        batch = p.send_batch("rides", [{"body": 1, "key": "a"}, {"body": 2, "headers": {"h": "v"}}])
    assert first == SendResult(qid=0, offset=0, duplicate=False)
    assert again == SendResult(qid=0, offset=0, duplicate=True)
    assert [r.offset for r in batch] == [1, 2]
    # None-valued optional fields are not sent at all
    assert fake.calls[-1][2] == {
        "messages": [{"body": 1, "key": "a"}, {"body": 2, "headers": {"h": "v"}}]
    }


def test_send_batch_rejects_misspelt_fields_before_sending(fake: FakeServer) -> None:
    with producer(fake) as p:
        with pytest.raises(ValueError, match="unknown message field"):
            p.send_batch("rides", [{"body": 1, "keys": "a"}])
        with pytest.raises(ValueError, match="needs a 'body'"):
            p.send_batch("rides", [{"key": "a"}])
        with pytest.raises(ValueError, match="at least one"):
            p.send_batch("rides", [])
    assert produce_calls(fake) == 0


def test_error_answer_becomes_typed_api_error(fake: FakeServer) -> None:
    with producer(fake) as p, pytest.raises(ResourceNotFound) as info:
        p.send("nope", {})
    assert isinstance(info.value, ClientError)
    assert (info.value.status, info.value.code) == (404, "topic_not_found")
    assert "nope" in info.value.message


def test_503_is_retried_then_succeeds(fake: FakeServer) -> None:
    fake.fail_next[("POST", "/messages")] = [503, 503]
    with producer(fake) as p:
        assert p.send("rides", {"n": 1}).offset == 0
    assert produce_calls(fake) == 3


def test_503_gives_up_after_max_attempts(fake: FakeServer) -> None:
    fake.fail_next[("POST", "/messages")] = [503, 503, 503, 503]
    with producer(fake) as p, pytest.raises(ServiceUnavailable):
        p.send("rides", {"n": 1})
    assert produce_calls(fake) == 3


def test_connect_error_is_translated_once_with_cause(fake: FakeServer) -> None:
    fake.fail_next[("POST", "/messages")] = [httpx.ConnectError("refused")] * 3
    with producer(fake) as p, pytest.raises(ConnectError) as info:
        p.send("rides", {"n": 1})
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert info.value.retryable
    assert produce_calls(fake) == 3


def test_timeout_is_not_retried_without_ids(fake: FakeServer) -> None:
    # The first try may have been stored: repeating it could store the message twice.
    fake.fail_next[("POST", "/messages")] = [httpx.ReadTimeout("slow")]
    with producer(fake) as p, pytest.raises(RequestTimeout):
        p.send("rides", {"n": 1})
    assert produce_calls(fake) == 1


def test_timeout_is_retried_when_every_message_has_an_id(fake: FakeServer) -> None:
    fake.fail_next[("POST", "/messages")] = [httpx.ReadTimeout("slow")]
    with producer(fake) as p:
        results = p.send_batch("rides", [{"body": 1, "id": "a"}, {"body": 2, "id": "b"}])
    assert [r.offset for r in results] == [0, 1]
    assert produce_calls(fake) == 2


def test_non_json_5xx_is_a_retryable_server_error() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(502, text="bad gateway"))
    with (
        Client("http://lb", retry=FAST, transport=transport) as client,
        pytest.raises(ServerError) as info,
    ):
        client.list_topics()
    assert info.value.status == 502 and info.value.retryable


def test_fails_travel_in_the_extended_form_with_the_error() -> None:
    wire = results_to_wire(
        [QueueResult("t", 1, acks=(4,), fails=((5, "ValueError: x"), (6, None)))]
    )
    assert wire == [
        {
            "topic": "t",
            "qid": 1,
            "acks": [4],
            "fails": [{"offset": 5, "error": "ValueError: x"}, {"offset": 6}],
        }
    ]


def test_rejects_url_without_scheme() -> None:
    with pytest.raises(ValueError, match="http"):
        Client("127.0.0.1:9713")


async def test_async_producer_sends_and_retries(fake: FakeServer) -> None:
    fake.fail_next[("POST", "/messages")] = [503]
    async with AsyncProducer(fake.url, retry=FAST, transport=fake.transport()) as p:
        assert await p.send("rides", {"n": 1}, key="k") == SendResult(0, 0, False)
        assert len(await p.send_batch("rides", [{"body": 2}, {"body": 3}])) == 2
    assert produce_calls(fake) == 3


def test_retry_policy_backoff_is_capped_and_jittered() -> None:
    policy = RetryPolicy(initial_backoff_ms=100, max_backoff_ms=1000, multiplier=2, jitter=0.1)
    assert 90 <= policy.backoff_ms(1) <= 110
    assert 180 <= policy.backoff_ms(2) <= 220
    assert 900 <= policy.backoff_ms(50) <= 1100
    assert 900 <= policy.backoff_ms(10_000) <= 1100
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)


def test_consumer_config_validates_units_and_ranges() -> None:
    assert ConsumerConfig(max_messages=32, concurrency=8).outstanding_limit == 32
    # Four per worker by default (the 10,000-key run in docs/benchmarks.md needs the window).
    assert ConsumerConfig(max_messages=4, concurrency=8).outstanding_limit == 32
    for bad in (
        {"wait_ms": 30_001},
        {"max_messages": 0},
        {"concurrency": 0},
        {"extend_lease_ms": 5},
        {"idle_backoff_ms": 2000},
    ):
        with pytest.raises(ValueError):
            ConsumerConfig(**bad)  # type: ignore[arg-type]
