"""Delivery guarantees of docs/guarantees.md over HTTP against a real server (SQLite store)."""

from __future__ import annotations

import functools
import time
from typing import Any

import anyio
import httpx
import pytest

from tests.api.delivery_client import Log, consume, order_violations
from tests.support import RunningServer, wait_until


def setup(client: httpx.Client, group: dict[str, Any], queues: int = 4, topic: str = "t") -> None:
    assert client.post("/v1/topics", json={"name": topic, "queues": queues}).status_code in (
        200,
        201,
    )
    response = client.put("/v1/groups/g", json=group)
    assert response.status_code == 200, response.text


def produce(client: httpx.Client, messages: list[dict[str, Any]], topic: str = "t") -> list[Any]:
    out = []
    for i in range(0, len(messages), 200):
        r = client.post(f"/v1/topics/{topic}/messages", json={"messages": messages[i : i + 200]})
        assert r.status_code == 200, r.text
        out += r.json()["results"]
    return out


def stats(client: httpx.Client, group: str = "g") -> dict[str, Any]:
    return client.get(f"/v1/groups/{group}").json()["stats"]


def drained(client: httpx.Client) -> bool:
    s = stats(client)
    return all(q["lag"] == 0 for q in s["queues"]) and s["in_flight"] == 0


def pull(client: httpx.Client, n: int = 10, wait_ms: int = 0, results: Any = ()) -> list[Any]:
    r = client.post(
        "/v1/groups/g/pull",
        json={"max_messages": n, "wait_ms": wait_ms, "results": list(results)},
    )
    assert r.status_code == 200, r.text
    return list(r.json()["messages"])


def acks(messages: list[dict[str, Any]], kind: str = "acks") -> list[dict[str, Any]]:
    grouped: dict[tuple[str, int], list[int]] = {}
    for m in messages:
        grouped.setdefault((m["topic"], m["qid"]), []).append(m["offset"])
    return [{"topic": t, "qid": q, kind: offs} for (t, q), offs in grouped.items()]


MODES = {
    "key": (lambda i: {"key": f"k{i % 40}", "body": {"n": i}}, lambda m: m["key"]),
    "qid": (lambda i: {"key": f"k{i % 40}", "body": {"n": i}}, lambda m: str(m["qid"])),
    "$.ride.id": (
        lambda i: {"body": {"ride": {"id": i % 30}, "n": i}},
        lambda m: str(m["body"]["ride"]["id"]),
    ),
    "none": (lambda i: {"key": f"k{i % 40}", "body": {"n": i}}, lambda m: None),
}


async def _eight_pullers(
    server: RunningServer, order_by: str, fail_rate: float, max_per_key: int = 1
) -> Log:
    """600 messages, 8 concurrent pullers with random fails, until every one is acked."""
    make, value_of = MODES[order_by]
    with server.client() as client:
        setup(
            client,
            {
                "topics": {"t": {"order_by": order_by}},
                "retry_backoff_ms": [5],
                "max_attempts": 10,
            },
        )
        produce(client, [make(i) for i in range(600)])
        log = Log()
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            for seed in range(8):
                tg.start_soon(
                    functools.partial(
                        consume,
                        server.url,
                        "g",
                        log,
                        value_of,
                        stop,
                        fail_rate=fail_rate,
                        max_attempts=3,
                        seed=seed,
                        max_per_key=max_per_key,
                    )
                )
            deadline = time.monotonic() + 60
            while not await anyio.to_thread.run_sync(drained, client):
                assert time.monotonic() < deadline, "not drained in 60 s"
                await anyio.sleep(0.05)
            stop.set()
    return log


@pytest.mark.parametrize("order_by", list(MODES))
async def test_order_per_value_with_8_pullers_and_random_fails(
    server: RunningServer, order_by: str
) -> None:
    log = await _eight_pullers(server, order_by, 0.2)
    assert len(log.acked_at) == 600, "every message acked"
    assert log.batches_with_repeated_values == 0
    assert order_violations(log) == []
    retried = sum(1 for d in log.deliveries.values() if len(d) > 1)
    assert retried > 0, "random fails caused redeliveries"
    if order_by != "none":
        chains = {v for v in log.values.values()}
        assert len(chains) > 1


@pytest.mark.parametrize("order_by", list(MODES))
async def test_same_key_runs_keep_order_with_8_pullers_and_random_fails(
    server: RunningServer, order_by: str
) -> None:
    log = await _eight_pullers(server, order_by, 0.1, max_per_key=8)
    assert len(log.acked_at) == 600, "every message acked"
    assert order_violations(log) == []
    if order_by != "none":
        assert log.runs, "some answers carried same-key runs"


def test_a_stuck_or_failing_key_does_not_delay_other_keys(server: RunningServer) -> None:
    with server.client() as client:
        # max_attempts high: on a slow machine the loop may run long enough for the failing
        # key's messages to be dead-lettered, and then it would no longer be blocked.
        setup(
            client,
            {
                "topics": {"t": {"order_by": "key"}},
                "retry_backoff_ms": [50],
                "max_attempts": 1000,
                "stuck_after_ms": 1,  # the held head is stuck once pulled
            },
        )
        produce(client, [{"key": k, "body": i} for i in range(3) for k in ("stuck", "failing")])
        produce(client, [{"key": f"h{i % 50}", "body": i} for i in range(500)])
        healthy = 0
        held: list[Any] = []
        results: list[Any] = []
        deadline = time.monotonic() + 30
        while healthy < 500:
            assert time.monotonic() < deadline
            got = pull(client, 100, 100, results)
            ok = [m for m in got if m["key"].startswith("h")]
            healthy += len(ok)
            held += [m for m in got if m["key"] == "stuck"]
            fails = [m for m in got if m["key"] == "failing"]
            results = acks(ok) + acks(fails, "fails")
        assert len(held) == 1 and held[0]["offset"] is not None  # head held, never acked
        blocked = client.get("/v1/groups/g/blocked-keys").json()["blocked_keys"]
        by_value = {b["order_value"]: b for b in blocked}
        assert by_value["stuck"]["state"] == "in_flight"
        assert by_value["stuck"]["head_offset"] == held[0]["offset"]
        assert by_value["stuck"]["waiting"] == 2
        assert by_value["failing"]["state"] in ("retrying", "in_flight")


def test_backoff_and_attempt_counting(server: RunningServer) -> None:
    with server.client() as client:
        setup(
            client,
            {
                "topics": {"t": {"order_by": "key"}},
                "retry_backoff_ms": [200, 400],
                "max_attempts": 9,
            },
        )
        produce(client, [{"key": "a", "body": 1}])
        first = pull(client, wait_ms=2000)
        assert [m["attempt"] for m in first] == [1]
        times = []
        results = acks(first, "fails")
        for expected_attempt, backoff in ((2, 0.2), (3, 0.4), (4, 0.4)):
            t0 = time.monotonic()
            got = pull(client, wait_ms=3000, results=results)
            times.append(time.monotonic() - t0)
            assert [m["attempt"] for m in got] == [expected_attempt]
            assert times[-1] >= backoff * 0.9, f"redelivered after {times[-1]:.3f}s < {backoff}s"
            results = acks(got, "fails")


def test_ack_timeout_redelivers(server: RunningServer) -> None:
    with server.client() as client:
        setup(
            client,
            {"topics": {"t": {"order_by": "key"}}, "ack_timeout_ms": 300, "retry_backoff_ms": [0]},
        )
        produce(client, [{"key": "a", "body": 1}])
        t0 = time.monotonic()
        assert [m["attempt"] for m in pull(client, wait_ms=2000)] == [1]
        again = pull(client, wait_ms=3000)
        assert [m["attempt"] for m in again] == [2]
        assert time.monotonic() - t0 >= 0.29
        r = client.post("/v1/groups/g/ack", json={"results": acks(again)})
        assert r.json() == {"applied": 1, "unknown": []}


def test_dead_letter_listing_and_ordered_redrive(server: RunningServer) -> None:
    with server.client() as client:
        setup(
            client,
            {"topics": {"t": {"order_by": "key"}}, "max_attempts": 2, "retry_backoff_ms": [0]},
            queues=1,
        )
        produce(client, [{"key": "a", "body": {"n": n}} for n in range(3)])
        produce(client, [{"key": "b", "body": {"n": 9}}])
        results: list[Any] = []
        deadline = time.monotonic() + 20
        while stats(client)["dead_lettered"] < 3 or stats(client)["in_flight"]:
            assert time.monotonic() < deadline
            got = pull(client, 10, 200, results)
            results = acks([m for m in got if m["key"] == "b"]) + [
                {
                    "topic": m["topic"],
                    "qid": m["qid"],
                    "fails": [{"offset": m["offset"], "error": f"bad {m['offset']}"}],
                }
                for m in got
                if m["key"] == "a"
            ]
        wait_until(lambda: drained(client), 10, 0.05)
        dead = client.get("/v1/groups/g/dead-letters").json()["dead_letters"]
        assert [(d["offset"], d["attempts"], d["last_error"]) for d in dead] == [
            (0, 2, "bad 0"),
            (1, 2, "bad 1"),
            (2, 2, "bad 2"),
        ]
        assert dead[0]["body"] == {"n": 0} and dead[0]["key"] == "a"
        assert client.post("/v1/groups/g/dead-letters/redrive").json() == {"redriven": 3}
        assert client.get("/v1/groups/g/dead-letters").json()["dead_letters"] == []
        order = []
        results = []
        while len(order) < 3:
            got = pull(client, 10, 1000, results)
            assert len(got) <= 1, "one key: one message at a time"
            order += [m["offset"] for m in got]
            results = acks(got)
        pull(client, 1, 0, results)
        assert order == [0, 1, 2]
        wait_until(lambda: stats(client)["dead_lettered"] == 0, 5)


def test_block_then_skip_and_release(server: RunningServer) -> None:
    with server.client() as client:
        setup(
            client,
            {"topics": {"t": {"order_by": "key"}}, "max_attempts": 1, "on_exhausted": "block"},
            queues=1,
        )
        produce(client, [{"key": "a", "body": n} for n in range(3)])
        got = pull(client, wait_ms=2000)
        pull(client, results=acks(got, "fails"))
        blocked = client.get("/v1/groups/g/blocked-keys").json()["blocked_keys"]
        assert [(b["order_value"], b["state"], b["offset"]) for b in blocked] == [
            ("a", "exhausted", 0)
        ]
        assert pull(client) == []  # the chain stays blocked
        r = client.post(
            "/v1/groups/g/blocked-keys/release", json={"topic": "t", "order_value": "a"}
        )
        assert r.status_code == 200, r.text
        again = pull(client)
        assert [(m["offset"], m["attempt"]) for m in again] == [(0, 1)]
        pull(client, results=acks(again, "fails"))
        r = client.post("/v1/groups/g/blocked-keys/skip", json={"topic": "t", "order_value": "a"})
        assert r.json() == {"skipped": {"topic": "t", "qid": 0, "offset": 0}}
        assert [m["offset"] for m in pull(client, wait_ms=1000)] == [1]
        missing = client.post(
            "/v1/groups/g/blocked-keys/skip", json={"topic": "t", "order_value": "zz"}
        )
        assert missing.status_code == 404
        in_flight = client.post(
            "/v1/groups/g/blocked-keys/skip", json={"topic": "t", "order_value": "a"}
        )
        assert in_flight.status_code == 409
        wait_until(lambda: stats(client)["dead_lettered"] == 1, 5)


def test_seek_earliest_latest_offset_and_time(server: RunningServer) -> None:
    with server.client() as client:
        setup(client, {"topics": {"t": {"order_by": "none"}}}, queues=1)
        produce(client, [{"body": n} for n in range(5)])
        time.sleep(0.01)  # distinct produce timestamps for the time seek below
        cut = int(time.time() * 1000)
        time.sleep(0.01)
        produce(client, [{"body": n} for n in range(5, 8)])
        got = pull(client, 100, 1000)
        pull(client, 1, 0, acks(got))
        wait_until(lambda: stats(client)["queues"][0]["committed_offset"] == 8, 5)

        def seek(to: Any) -> list[int]:
            r = client.post("/v1/groups/g/seek", json={"topic": "t", "to": to})
            assert r.status_code == 200, r.text
            got = pull(client, 100, 300)
            pull(client, 1, 0, acks(got))
            return sorted(m["offset"] for m in got)

        assert seek("earliest") == list(range(8))
        assert seek(6) == [6, 7]
        assert seek({"timestamp_ms": cut}) == [5, 6, 7]
        assert seek("latest") == []
        produce(client, [{"body": 99}])
        assert [m["body"] for m in pull(client, 10, 2000)] == [99]


def test_produce_dedup_by_id(server: RunningServer) -> None:
    with server.client() as client:
        setup(client, {"topics": {"t": {"order_by": "key"}}})
        first = produce(client, [{"key": "a", "body": 1, "id": "x-1"}])
        again = produce(
            client, [{"key": "a", "body": 1, "id": "x-1"}, {"key": "a", "body": 2, "id": "x-2"}]
        )
        assert again[0] == {**first[0], "duplicate": True}
        assert again[1]["duplicate"] is False
        total = sum(q["next_offset"] for q in client.get("/v1/topics/t").json()["queue_stats"])
        assert total == 2


def test_memory_bounded_by_max_buffered(server: RunningServer) -> None:
    with server.client() as client:
        setup(client, {"topics": {"t": {"order_by": "key"}}, "max_buffered": 50}, queues=2)
        produce(
            client, [{"key": "stuck" if i % 3 == 0 else f"h{i}", "body": i} for i in range(900)]
        )
        results: list[Any] = []
        healthy = 0
        peak = 0
        deadline = time.monotonic() + 30
        while healthy < 600:
            assert time.monotonic() < deadline, f"only {healthy} healthy messages got through"
            got = pull(client, 50, 200, results)
            ok = [m for m in got if m["key"] != "stuck"]
            healthy += len(ok)
            results = acks(ok)
            peak = max(peak, stats(client)["buffered"])
        assert peak <= 50
        s = stats(client)
        assert s["parked_keys"] == 1
        # The committed offset never passes the stuck head (offset 0 of its queue).
        assert min(q["committed_offset"] for q in s["queues"]) == 0
