"""The SDK's producer over several proxies: a proxy that is down costs a retry elsewhere."""

from __future__ import annotations

import pytest

from consumer_sdk import Producer, RetryPolicy
from consumer_sdk.errors import ConnectError
from tests.store.pg_server import free_port
from tests.support import RunningServer

FAST = RetryPolicy(max_attempts=2, initial_backoff_ms=1, max_backoff_ms=1)


def test_a_producer_moves_on_from_a_proxy_that_is_down(server: RunningServer) -> None:
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with Producer([down, server.url], retry=FAST) as producer:
        server.client().post("/v1/topics", json={"name": "sdk-cluster", "queues": 2})
        first = producer.send("sdk-cluster", {"n": 1}, key="a")
        assert producer.url == server.url  # it stays with the proxy that answered
        rest = producer.send_batch("sdk-cluster", [{"body": {"n": n}, "key": "a"} for n in (2, 3)])
    assert [r.offset for r in (first, *rest)] == [0, 1, 2]
    assert len({r.qid for r in (first, *rest)}) == 1


def test_a_producer_raises_when_every_proxy_is_down() -> None:
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    with Producer(urls, retry=FAST) as producer, pytest.raises(ConnectError):
        producer.send("t", 1)
