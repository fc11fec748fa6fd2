"""Fenced deliveries over HTTP: a late result for a superseded attempt changes nothing."""

from __future__ import annotations

from typing import Any

import httpx

from tests.api.test_delivery import pull, setup
from tests.support import RunningServer, wait_until


def _ack(m: dict[str, Any], *, fenced: bool = True) -> dict[str, Any]:
    item: Any = {"offset": m["offset"], "attempt": m["attempt"]} if fenced else m["offset"]
    return {"topic": m["topic"], "qid": m["qid"], "acks": [item]}


def _produce(client: httpx.Client, *bodies: Any) -> None:
    messages = [{"key": "K", "body": b} for b in bodies]
    r = client.post("/v1/topics/t/messages", json={"messages": messages})
    assert r.status_code == 200, r.text


def test_a_late_ack_does_not_release_a_key_another_consumer_works_on(
    server: RunningServer,
) -> None:
    with server.client() as client:
        setup(
            client,
            {"topics": {"t": {"order_by": "key"}}, "ack_timeout_ms": 1000, "retry_backoff_ms": [0]},
            queues=1,
        )
        _produce(client, "n", "n+1")
        (a,) = pull(client)  # consumer A takes n, attempt 1, and stalls
        assert (a["body"], a["attempt"]) == ("n", 1)
        redelivered: list[Any] = []
        wait_until(lambda: bool(redelivered.extend(pull(client)) or redelivered), 5)
        (b,) = redelivered  # consumer B takes n again after A's deadline: attempt 2
        assert (b["offset"], b["attempt"]) == (a["offset"], 2)
        # B extends its lease (fenced to its own attempt) so only A's attempt is stale.
        ref = {"topic": "t", "qid": 0, "offset": a["offset"]}
        cur = client.post(
            "/v1/groups/g/extend",
            json={"messages": [{**ref, "attempt": 2}], "ack_timeout_ms": 60_000},
        )
        assert cur.json()["applied"] == 1
        old = client.post("/v1/groups/g/extend", json={"messages": [{**ref, "attempt": 1}]})
        assert old.json() == {"applied": 0, "unknown": [ref]}
        # A's late ack names attempt 1: unknown, and n+1 is not handed out to C.
        r = client.post("/v1/groups/g/pull", json={"max_messages": 10, "results": [_ack(a)]})
        body = r.json()
        assert body["results"] == {"applied": 0, "unknown": [ref]}
        assert body["messages"] == []
        assert client.get("/v1/groups/g").json()["stats"]["in_flight"] == 1
        # B's ack of attempt 2 finishes n; only now does n+1 go out.
        nxt = pull(client, results=[_ack(b)])
        assert [(m["body"], m["attempt"]) for m in nxt] == [("n+1", 1)]


def test_plain_offsets_stay_unfenced_and_fenced_fails_work(server: RunningServer) -> None:
    with server.client() as client:
        setup(
            client,
            {"topics": {"t": {"order_by": "key"}}, "ack_timeout_ms": 1000, "retry_backoff_ms": [0]},
            queues=1,
        )
        _produce(client, "x", "y")
        (first,) = pull(client)
        again: list[Any] = []
        wait_until(lambda: bool(again.extend(pull(client)) or again), 5)
        assert again[0]["attempt"] == 2
        lease = {"topic": "t", "qid": 0, "offset": first["offset"]}
        r = client.post("/v1/groups/g/extend", json={"messages": [lease], "ack_timeout_ms": 60_000})
        assert r.json()["applied"] == 1
        # A plain offset answers whatever delivery is current (documented as unfenced).
        nxt = pull(client, results=[_ack(first, fenced=False)])
        assert [m["body"] for m in nxt] == ["y"]
        fail = {
            "topic": "t",
            "qid": 0,
            "fails": [{"offset": nxt[0]["offset"], "attempt": 1, "error": "boom"}],
        }
        r = client.post("/v1/groups/g/ack", json={"results": [fail]})
        assert r.json()["applied"] == 1
        bad = {"topic": "t", "qid": 0, "acks": [{"offset": 0, "attempt": 0}]}
        r = client.post("/v1/groups/g/ack", json={"results": [bad]})
        assert r.status_code == 422
