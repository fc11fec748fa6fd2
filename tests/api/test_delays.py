"""Delayed messages over HTTP (docs/api.md, produce): validation, never early, own key only."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

import httpx
import pytest

from consumer_sdk import Producer, ValidationFailed
from cproxy.cli import main
from cproxy.config import Limits
from tests.api.test_delivery import acks, produce, pull, setup, stats
from tests.conftest import ServerFactory
from tests.support import RunningServer, wait_until


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def post(client: httpx.Client, messages: list[dict[str, Any]]) -> httpx.Response:
    return client.post("/v1/topics/t/messages", json={"messages": messages})


def test_delay_fields_are_validated(server_factory: ServerFactory) -> None:
    server = server_factory(limits=replace(Limits(), max_delay_ms=60_000))
    with server.client() as client:
        setup(client, {"topics": {"t": {"order_by": "key"}}}, queues=1)
        cases = [
            ({"body": 1, "delay_ms": 5, "deliver_at_ms": now_ms()}, "both delay_ms and deliver"),
            ({"body": 1, "delay_ms": -1}, "delay_ms"),
            ({"body": 1, "deliver_at_ms": -5}, "deliver_at_ms"),
            ({"body": 1, "delay_ms": "soon"}, "delay_ms"),
            ({"body": 1, "delay_ms": 60_001}, "limits.max_delay_ms"),
            ({"body": 1, "deliver_at_ms": now_ms() + 3_600_000}, "limits.max_delay_ms"),
        ]
        for bad, words in cases:
            # A good message first: the call is atomic, so nothing of it may be stored.
            r = post(client, [{"body": "ok"}, bad])
            assert r.status_code == 422, (bad, r.text)
            error = r.json()["error"]
            assert error["code"] in ("validation_error", "invalid_request"), r.text
            assert words in error["message"], (bad, error["message"])
            assert "\n" not in error["message"]
        assert client.get("/v1/topics/t").json()["queue_stats"][0]["next_offset"] == 0
        # The limit itself, and a past time (no delay), are accepted.
        assert post(client, [{"body": 1, "delay_ms": 60_000}]).status_code == 200
        assert post(client, [{"body": 2, "deliver_at_ms": 1}]).status_code == 200
        got = pull(client, wait_ms=2000)
        assert [m["body"] for m in got] == [2]


def test_delayed_messages_are_not_delivered_early_and_hold_only_their_key(
    server: RunningServer,
) -> None:
    with server.client() as client:
        setup(client, {"topics": {"t": {"order_by": "key"}}, "ack_timeout_ms": 60_000}, 2)
        due = now_ms() + 1500
        produce(
            client,
            [
                {"key": "a", "body": "a1", "deliver_at_ms": due},
                {"key": "a", "body": "a2"},  # waits behind a1
                {"key": "b", "body": "b1"},
                {"key": "c", "body": "c1", "delay_ms": 4000},  # sleeps (far off)
                {"body": "u1", "delay_ms": 3500},  # unordered, released from memory
                {"body": "u2"},
            ],
        )
        first = pull(client, wait_ms=1000)
        assert sorted(m["body"] for m in first) == ["b1", "u2"]
        s = stats(client)
        assert s["delayed"] == 3
        # b is in flight (being handled, not stuck); a delayed head does not block either
        assert (s["blocked_keys"], s["in_flight_keys"]) == (0, 1)
        received: list[tuple[int, dict[str, Any]]] = []
        results = acks(first)
        deadline = time.monotonic() + 15
        while len(received) < 4 and time.monotonic() < deadline:
            batch = pull(client, wait_ms=500, results=results)
            at = now_ms()
            received += [(at, m) for m in batch]
            results = acks(batch)
        pull(client, results=results)
        bodies = [m["body"] for _, m in received]
        assert sorted(bodies) == ["a1", "a2", "c1", "u1"]
        assert bodies.index("a1") < bodies.index("a2")
        for at, m in received:
            earliest = {
                "a1": due,
                "a2": due,
                "c1": m["produced_at_ms"] + 4000,
                "u1": m["produced_at_ms"] + 3500,
            }[m["body"]]
            assert at >= earliest, (m, at - earliest)
        wait_until(lambda: stats(client)["delayed"] == 0, 5, 0.05, "delayed back to 0")


def test_many_delayed_keys_do_not_block_undelayed_ones(server: RunningServer) -> None:
    with server.client() as client:
        setup(
            client,
            {"topics": {"t": {"order_by": "key"}}, "max_buffered": 100, "ack_timeout_ms": 60_000},
            2,
        )
        produce(client, [{"key": f"late-{i}", "body": i, "delay_ms": 60_000} for i in range(1000)])
        produce(client, [{"body": "u", "delay_ms": 60_000} for _ in range(1000)])
        produce(client, [{"key": f"now-{i}", "body": "now"} for i in range(200)])
        got: list[dict[str, Any]] = []
        results: list[Any] = []
        deadline = time.monotonic() + 10
        while len(got) < 200 and time.monotonic() < deadline:
            batch = pull(client, n=100, wait_ms=500, results=results)
            got += batch
            results = acks(batch)
        pull(client, results=results)
        assert len(got) == 200
        assert {m["body"] for m in got} == {"now"}
        s = stats(client)
        assert s["delayed"] == 2000
        assert s["buffered"] <= 100


def test_sdk_and_cli_send_delays(server: RunningServer, capsys: pytest.CaptureFixture[str]) -> None:
    with server.client() as client:
        setup(client, {"topics": {"t": {"order_by": "key"}}, "ack_timeout_ms": 60_000}, 1)
    start = now_ms()
    with Producer(server.url) as producer:
        producer.send("t", "sdk-delay", key="a", delay_ms=1500)
        producer.send("t", "sdk-at", key="b", deliver_at_ms=start + 1500)
        producer.send_batch("t", [{"body": "batch", "key": "c", "delay_ms": 1500}])
        with pytest.raises(ValidationFailed):
            producer.send("t", "both", delay_ms=1, deliver_at_ms=start)
    main(["produce", "t", '"cli"', "--key", "d", "--delay-ms", "1500", "--url", server.url])
    assert json.loads(capsys.readouterr().out)["results"][0]["offset"] == 3
    with server.client() as client:
        assert stats(client)["delayed"] == 4
        assert pull(client, wait_ms=300) == []
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + 10
        while len(got) < 4 and time.monotonic() < deadline:
            got += pull(client, wait_ms=500, results=acks(got[-4:]) if got else ())
        assert now_ms() - start >= 1500
        assert sorted(m["body"] for m in got) == ["batch", "cli", "sdk-at", "sdk-delay"]


def test_openapi_declares_the_delay_fields(server: RunningServer) -> None:
    with server.client() as client:
        schemas = client.get("/openapi.json").json()["components"]["schemas"]
    message = schemas["OutMessage"]["properties"]
    for name in ("delay_ms", "deliver_at_ms"):
        integer, null = message[name]["anyOf"]
        assert (integer["type"], integer["minimum"], null["type"]) == ("integer", 0, "null")
        assert "Not delivered before" in message[name]["description"]
    assert "delayed" in schemas["GroupStatsOut"]["properties"]
