"""``POST /v1/groups/{group}/replay`` over HTTP (docs/api.md, replay one order value)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.api.http_helpers import fenced_acks_for
from tests.api.test_delivery import pull, setup
from tests.support import RunningServer


def produce(client: httpx.Client, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    r = client.post("/v1/topics/t/messages", json={"messages": messages})
    assert r.status_code == 200, r.text
    return list(r.json()["results"])


def drain(client: httpx.Client) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    got = pull(client, n=100)
    while got:
        seen += got
        got = pull(client, n=100, results=fenced_acks_for(got))
    return seen


def committed(client: httpx.Client) -> dict[int, int]:
    stats = client.get("/v1/groups/g").json()["stats"]
    return {q["qid"]: q["committed_offset"] for q in stats["queues"]}


def test_replay_of_a_key_redelivers_only_it_in_order(server: RunningServer) -> None:
    with server.client() as client:
        setup(client, {"topics": {"t": {"order_by": "key"}}}, queues=2)
        produce(client, [{"key": k, "body": {"n": n}} for n, k in enumerate("ababab")])
        assert len(drain(client)) == 6
        before = committed(client)
        assert sum(before.values()) == 6  # everything finished
        r = client.post(
            "/v1/groups/g/replay", json={"topic": "t", "order_value": "a", "from": "earliest"}
        )
        assert r.status_code == 200, r.text
        assert r.json() == {"replaying": 3, "lost_to_retention": 0}
        assert client.get("/v1/groups/g").json()["stats"]["replaying"] == 3
        assert committed(client) == before  # a replay never moves committed offsets back
        # A second replay of "a" while it replays: 409; another key may replay meanwhile.
        again = client.post("/v1/groups/g/replay", json={"topic": "t", "order_value": "a"})
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "replay_in_progress"
        # Other keys' new messages are not delayed: they come in the first pull.
        produce(client, [{"key": "c", "body": {"n": 6}}])
        first = pull(client, n=100)
        assert sorted(m["key"] for m in first) == ["a", "c"]
        replayed = [m for m in first if m["key"] == "a"]
        assert all(m.get("replay") is True for m in replayed)
        assert all("replay" not in m for m in first if m["key"] == "c")
        rest = drain_from(client, first)
        bodies = [m["body"]["n"] for m in replayed + rest if m["key"] == "a"]
        assert bodies == [0, 2, 4]
        after = committed(client)
        assert all(after[q] >= before[q] for q in before)
        stats = client.get("/v1/groups/g").json()["stats"]
        assert stats["replaying"] == 0 and all(q["lag"] == 0 for q in stats["queues"])


def drain_from(client: httpx.Client, got: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    while got:
        got = pull(client, n=100, results=fenced_acks_for(got))
        seen += got
    return seen


def test_replay_from_an_offset_and_of_a_json_path_value(server: RunningServer) -> None:
    with server.client() as client:
        setup(client, {"topics": {"t": {"order_by": "$.user"}}}, queues=2)
        placed = produce(
            client,
            [{"body": {"user": "u1" if n % 2 else "u2", "n": n}, "qid": n % 2} for n in range(8)],
        )
        assert len(drain(client)) == 8
        # u1's messages are on queue 1 at offsets 0..3: replay from offset 2 on.
        assert {r["qid"] for r in placed[1::2]} == {1}
        r = client.post("/v1/groups/g/replay", json={"topic": "t", "order_value": "u1", "from": 2})
        assert r.json() == {"replaying": 2, "lost_to_retention": 0}
        got = drain(client)
        assert [(m["qid"], m["offset"], m["body"]["n"], m["replay"]) for m in got] == [
            (1, 2, 5, True),
            (1, 3, 7, True),
        ]


def test_replay_answers_422_for_qid_order_and_404_for_unknown_group(
    server: RunningServer,
) -> None:
    with server.client() as client:
        setup(client, {"topics": {"t": {"order_by": "qid"}}}, queues=1)
        r = client.post("/v1/groups/g/replay", json={"topic": "t", "order_value": "0"})
        assert r.status_code == 422
        assert "seek" in r.json()["error"]["message"]
        bad = client.post("/v1/groups/g/replay", json={"topic": "t", "from": "earliest"})
        assert bad.status_code == 422
        missing = client.post("/v1/groups/nope/replay", json={"topic": "t", "order_value": "x"})
        assert missing.status_code == 404
