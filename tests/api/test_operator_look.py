"""Operators look without touching (issue 32): the message browser, dead letters one by one,
who consumes a group, over real servers."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any

import httpx
import pytest

from consumer_sdk import Consumer, Message
from cproxy.cli import main
from cproxy.tokens import Token
from tests.api.http_helpers import (
    assert_error,
    create_topic,
    fresh_client,
    group_stats,
    produce,
    put_group,
)
from tests.conftest import ServerFactory
from tests.support import RunningServer, wait_until

SNAPSHOT = ("ready", "in_flight", "waiting", "retrying", "dead_lettered", "blocked_keys")


def _snapshot(client: httpx.Client, group: str) -> dict[str, Any]:
    stats = group_stats(client, group)
    return {k: stats[k] for k in SNAPSHOT}


def _browse(client: httpx.Client, topic: str, **query: Any) -> dict[str, Any]:
    response = client.get(f"/v1/topics/{topic}/messages", params=query)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _fail(client: httpx.Client, group: str, message: dict[str, Any]) -> None:
    results = [{"topic": message["topic"], "qid": message["qid"], "fails": [message["offset"]]}]
    answer = client.post(f"/v1/groups/{group}/ack", json={"results": results}).json()
    assert answer["applied"] == 1, answer


def _pull(client: httpx.Client, group: str, wait_ms: int = 2000, **extra: Any) -> list[Any]:
    body = {"wait_ms": wait_ms, "max_messages": 100, **extra}
    response = client.post(f"/v1/groups/{group}/pull", json=body)
    assert response.status_code == 200, response.text
    messages: list[Any] = response.json()["messages"]
    return messages


def test_peeking_twenty_times_leaves_the_group_untouched(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    with fresh_client(server) as client:
        create_topic(client, "t", 1)
        # One attempt and a short ack timeout: a look that delivered would dead-letter.
        put_group(client, "g", {"t": "key"}, max_attempts=1, ack_timeout_ms=200)
        produce(client, "t", [{"key": k, "body": {"n": i}} for i, k in enumerate("aab")])
        wait_until(lambda: group_stats(client, "g")["ready"] == 2, message="heads ready")
        before = _snapshot(client, "g")
        for i in range(20):
            if i % 2:
                page = _browse(client, "t", last=3)
            else:
                page = _browse(client, "t", qid=0, **{"from": 0})
            assert [m["body"] for m in page["messages"]] == [{"n": 0}, {"n": 1}, {"n": 2}]
            main(["peek", "t", "--last", "3", "--url", server.url])
            printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
            assert [m["offset"] for m in printed] == [0, 1, 2]
        assert _snapshot(client, "g") == before
        # Every message is delivered now for the first time: no attempt was used by a look.
        got = _pull(client, "g")
        assert sorted((m["key"], m["offset"], m["attempt"]) for m in got) == [
            ("a", 0, 1),
            ("b", 2, 1),
        ]
        assert group_stats(client, "g")["dead_lettered"] == 0


def test_the_browser_reads_by_offset_time_and_newest(server: RunningServer) -> None:
    with fresh_client(server) as client:
        create_topic(client, "t", 2)
        produce(client, "t", [{"qid": 1, "key": f"k{i}", "body": i} for i in range(5)])
        first = _browse(client, "t", qid=1)["messages"]
        # A later batch, produced strictly after the first one's time.
        wait_until(lambda: time.time() * 1000 > first[-1]["produced_at_ms"] + 2, 5, 0.001)
        produce(
            client,
            "t",
            [{"qid": 1, "body": i, "headers": {"h": "v"}} for i in range(5, 9)]
            + [{"qid": 1, "body": 9, "delay_ms": 60_000}],
        )
        page = _browse(client, "t", qid=1, limit=3)
        assert [m["offset"] for m in page["messages"]] == [0, 1, 2] and page["next"] == 3
        assert set(page["messages"][0]) >= {
            "topic", "qid", "offset", "key", "body", "headers", "produced_at_ms", "deliver_at_ms"
        }  # fmt: skip
        page = _browse(client, "t", qid=1, limit=3, **{"from": page["next"]})
        assert [m["body"] for m in page["messages"]] == [3, 4, 5] and page["next"] == 6
        assert page["messages"][2]["headers"] == {"h": "v"}
        later = _browse(client, "t", qid=1)["messages"][5]["produced_at_ms"]
        assert [m["offset"] for m in _browse(client, "t", qid=1, from_ms=later)["messages"]] == [
            5, 6, 7, 8, 9
        ]  # fmt: skip
        newest = _browse(client, "t", qid=1, last=2)["messages"]
        assert [m["body"] for m in newest] == [8, 9]
        assert newest[1]["deliver_at_ms"] >= newest[1]["produced_at_ms"] + 59_000
        assert newest[0]["deliver_at_ms"] is None
        empty = _browse(client, "t", qid=0)
        assert (empty["messages"], empty["next"]) == ([], 0)
        assert_error(client.get("/v1/topics/t/messages"), 422, "invalid_request")  # which qid?
        assert _browse(client, "t", qid=1, **{"from": 50})["next"] == 50


def test_the_browser_refuses_tokens_without_the_topic_in_scope(
    server_factory: ServerFactory,
) -> None:
    tokens = (
        Token("admin-token", "admin", name="admin"),
        Token("only-a-token", "consumer", topics=frozenset({"a"}), name="only_a"),
        Token("prod-b-token", "producer", topics=frozenset({"b"}), name="prod_b"),
    )
    server = server_factory(tokens=tokens)
    with fresh_client(server) as client:
        client.headers["authorization"] = "Bearer admin-token"
        for name in ("a", "b"):
            create_topic(client, name, 1)
        produce(client, "b", [{"body": "secret-of-b"}])
        assert [m["body"] for m in _browse(client, "b")["messages"]] == ["secret-of-b"]
        client.headers["authorization"] = "Bearer only-a-token"
        refused = client.get("/v1/topics/b/messages")
        assert_error(refused, 403, "forbidden")
        assert "secret-of-b" not in refused.text
        assert _browse(client, "a")["messages"] == []
        client.headers["authorization"] = "Bearer prod-b-token"
        assert [m["body"] for m in _browse(client, "b")["messages"]] == ["secret-of-b"]
        del client.headers["authorization"]
        assert_error(client.get("/v1/topics/b/messages"), 401, "unauthorized")


def test_redrive_one_dead_letter_of_three_on_a_key_then_delete_and_purge(
    server: RunningServer,
) -> None:
    with fresh_client(server) as client:
        create_topic(client, "t", 1)
        put_group(client, "g", {"t": "key"}, max_attempts=1)
        produce(client, "t", [{"key": "a", "body": f"a{i}"} for i in range(3)])
        for i in range(3):
            [m] = _pull(client, "g")
            assert m["offset"] == i
            _fail(client, "g", m)
        wait_until(lambda: group_stats(client, "g")["dead_lettered"] == 3, message="3 dead")
        produce(client, "t", [{"key": "a", "body": "a3"}])
        [head] = _pull(client, "g")  # a3 heads key a now, in flight
        assert head["offset"] == 3
        ref = {"topic": "t", "qid": 0, "offset": 1}
        redrive = client.post("/v1/groups/g/dead-letters/redrive", json={"messages": [ref]})
        assert redrive.json() == {"redriven": 1}
        assert _pull(client, "g", wait_ms=200) == []  # key order: a3 is still in flight
        acks = [{"topic": "t", "qid": 0, "acks": [3]}]
        [again] = _pull(client, "g", results=acks)
        assert (again["offset"], again["body"], again["attempt"]) == (1, "a1", 1)
        acks = [{"topic": "t", "qid": 0, "acks": [1]}]
        assert _pull(client, "g", wait_ms=200, results=acks) == []  # only it came back
        listed = client.get("/v1/groups/g/dead-letters").json()["dead_letters"]
        assert [d["offset"] for d in listed] == [0, 2]

        deleted = client.request(
            "DELETE", "/v1/groups/g/dead-letters", json={"messages": [{**ref, "offset": 0}]}
        )
        assert deleted.json() == {"deleted": 1}
        listed = client.get("/v1/groups/g/dead-letters").json()["dead_letters"]
        assert [d["offset"] for d in listed] == [2]
        assert group_stats(client, "g")["dead_lettered"] == 1
        purged = client.delete("/v1/groups/g/dead-letters", params={"topic": "t"})
        assert purged.json() == {"deleted": 1}
        assert client.get("/v1/groups/g/dead-letters").json()["dead_letters"] == []
        assert group_stats(client, "g")["dead_lettered"] == 0


def test_dead_letter_retention_ages_them_out(server_factory: ServerFactory) -> None:
    server = server_factory(retention_interval_ms=50)
    with fresh_client(server) as client:
        create_topic(client, "t", 1)
        put_group(client, "g", {"t": "key"}, max_attempts=1, dead_letter_retention_ms=300)
        put_group(client, "keep", {"t": "key"}, max_attempts=1)
        produce(client, "t", [{"key": "a", "body": 1}])
        for group in ("g", "keep"):
            _fail(client, group, _pull(client, group)[0])
            wait_until(lambda g=group: group_stats(client, g)["dead_lettered"] == 1)
        wait_until(
            lambda: client.get("/v1/groups/g/dead-letters").json()["dead_letters"] == [],
            10,
            message="g's dead letter to age out",
        )
        assert group_stats(client, "g")["dead_lettered"] == 0
        kept = client.get("/v1/groups/keep/dead-letters").json()["dead_letters"]
        assert [d["body"] for d in kept] == [1]  # no retention: kept


def test_group_stats_show_consumers_and_rates(server: RunningServer) -> None:
    with fresh_client(server) as client:
        create_topic(client, "t", 1)
        put_group(client, "g", {"t": "none"}, ack_timeout_ms=60_000)
        stats = group_stats(client, "g")
        assert (stats["consumers"], stats["last_pull_ms_ago"]) == ([], None)
        produce(client, "t", [{"body": i} for i in range(6)])
        wait_until(lambda: group_stats(client, "g")["ready"] == 6)
        mine = _pull(client, "g", max_messages=4, consumer="worker-1")
        anonymous = _pull(client, "g", max_messages=1)
        assert (len(mine), len(anonymous)) == (4, 1)
        stats = group_stats(client, "g")
        seen = {c["consumer"]: c for c in stats["consumers"]}
        assert set(seen) == {"worker-1", "127.0.0.1"}  # no id: the peer's address
        assert (seen["worker-1"]["in_flight"], seen["127.0.0.1"]["in_flight"]) == (4, 1)
        assert 0 <= seen["worker-1"]["last_pull_ms_ago"] < 10_000
        assert 0 <= stats["last_pull_ms_ago"] < 10_000
        acks = [{"topic": "t", "qid": 0, "acks": [m["offset"] for m in mine]}]
        _pull(client, "g", wait_ms=0, max_messages=1, consumer="worker-1", results=acks)
        # The rates are sampled every second: within two or three they show the work done.
        stats = wait_until(
            lambda: (s := group_stats(client, "g"))["acked_per_s"] > 0 and s,
            10,
            message="rates to show",
        )
        assert stats["delivered_per_s"] > 0
        seen = {c["consumer"]: c for c in stats["consumers"]}
        assert seen["worker-1"]["in_flight"] == 1


def test_the_sdk_consumer_names_itself(server: RunningServer) -> None:
    with fresh_client(server) as client:
        create_topic(client, "t", 1)
        put_group(client, "g", {"t": "key"})
        produce(client, "t", [{"key": "k", "body": 1}])
        handled = threading.Event()

        def handle(message: Message) -> None:
            handled.set()

        consumer = Consumer(
            server.url, group="g", handler=handle, handle_signals=False, name="billing"
        )
        consumer.start()
        try:
            assert handled.wait(10)
            expected = f"{socket.gethostname()}/{os.getpid()}/billing"
            wait_until(
                lambda: expected in {c["consumer"] for c in group_stats(client, "g")["consumers"]},
                message="the SDK consumer listed by its id",
            )
        finally:
            consumer.stop()
