"""The ack with ``produce`` over HTTP (docs/api.md; guarantee 10 of docs/guarantees.md):
200 with ``produced``, 409 ``stale_results`` storing nothing, 422 for unfenced results,
403 without produce rights on an output topic, and a repeated call after a lost answer."""

from __future__ import annotations

from typing import Any

import httpx

from cproxy.tokens import Token
from tests.api.http_helpers import (
    assert_error,
    create_topic,
    fenced_acks_for,
    fresh_client,
    pull_all,
    put_group,
    queue_stats,
)
from tests.conftest import ServerFactory
from tests.support import RunningServer


def pull(client: httpx.Client, group: str, n: int = 10) -> list[dict[str, Any]]:
    response = client.post(f"/v1/groups/{group}/pull", json={"max_messages": n, "wait_ms": 2000})
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["messages"]
    return messages


def setup(client: httpx.Client, keys: list[str]) -> list[dict[str, Any]]:
    create_topic(client, "in", 1)
    create_topic(client, "out", 2)
    put_group(client, "g", {"in": "key"})
    response = client.post(
        "/v1/topics/in/messages",
        json={"messages": [{"key": k, "body": {"n": i}} for i, k in enumerate(keys)]},
    )
    assert response.status_code == 200, response.text
    return pull(client, "g")


def out_offsets(client: httpx.Client) -> list[int]:
    return [q["next_offset"] for q in queue_stats(client, "out")]


def test_results_and_outputs_in_one_call(server: RunningServer) -> None:
    with fresh_client(server) as client:
        a, _b = setup(client, ["a", "b"])
        body = {
            "results": fenced_acks_for([a]),
            "produce": [
                {"topic": "out", "messages": [{"key": "a", "body": {"from": 0}, "id": "in-0"}]},
                {"topic": "out", "messages": [{"body": [1, 2], "qid": 1, "delay_ms": 0}]},
            ],
        }
        response = client.post("/v1/groups/g/ack", json=body)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["applied"] == 1 and answer["unknown"] == []
        produced = answer["produced"]
        assert [(p["topic"], p["duplicate"]) for p in produced] == [
            ("out", False),
            ("out", False),
        ]
        assert produced[1]["qid"] == 1
        assert sum(out_offsets(client)) == 2
        put_group(client, "reader", {"out": "none"})
        bodies = sorted(str(m["body"]) for m in pull_all(client, "reader", 2))
        assert bodies == ["[1, 2]", "{'from': 0}"]


def test_a_stale_result_is_409_and_nothing_is_stored(server: RunningServer) -> None:
    with fresh_client(server) as client:
        a, b = setup(client, ["a", "b"])
        stale = {"topic": "in", "qid": 0, "acks": [{"offset": b["offset"], "attempt": 9}]}
        response = client.post(
            "/v1/groups/g/ack",
            json={
                "results": [*fenced_acks_for([a]), stale],
                "produce": [{"topic": "out", "messages": [{"body": 1}]}],
            },
        )
        assert response.status_code == 409, response.text
        error = response.json()["error"]
        assert error["code"] == "stale_results" and error["message"]
        assert error["unknown"] == [{"topic": "in", "qid": 0, "offset": b["offset"]}]
        assert out_offsets(client) == [0, 0]
        # Nothing applied: a's ack still applies afterwards.
        response = client.post("/v1/groups/g/ack", json={"results": fenced_acks_for([a])})
        assert response.json() == {"applied": 1, "unknown": []}


def test_a_repeated_call_after_a_lost_answer_stores_nothing_twice(server: RunningServer) -> None:
    with fresh_client(server) as client:
        (a,) = setup(client, ["a"])
        body = {
            "results": fenced_acks_for([a]),
            "produce": [{"topic": "out", "messages": [{"key": "a", "body": {"n": 1}}]}],
        }
        first = client.post("/v1/groups/g/ack", json=body)
        assert first.status_code == 200, first.text
        # The client never saw that answer and sends the same call again.
        again = client.post("/v1/groups/g/ack", json=body)
        assert again.status_code == 409, again.text
        assert again.json()["error"]["unknown"] == [
            {"topic": "in", "qid": 0, "offset": a["offset"]}
        ]
        assert sum(out_offsets(client)) == 1


def test_unfenced_results_and_bad_outputs_are_refused(server: RunningServer) -> None:
    with fresh_client(server) as client:
        (a,) = setup(client, ["a"])
        plain = {"topic": "in", "qid": 0, "acks": [a["offset"]]}
        response = client.post(
            "/v1/groups/g/ack",
            json={"results": [plain], "produce": [{"topic": "out", "messages": [{"body": 1}]}]},
        )
        assert_error(response, 422, "invalid_request")
        response = client.post(
            "/v1/groups/g/ack",
            json={"results": fenced_acks_for([a]), "produce": [{"topic": "out", "messages": []}]},
        )
        assert_error(response, 422, "validation_error")
        response = client.post(
            "/v1/groups/g/ack",
            json={
                "results": fenced_acks_for([a]),
                "produce": [{"topic": "out", "messages": [{"body": 1, "qid": 7}]}],
            },
        )
        assert_error(response, 422)
        response = client.post(
            "/v1/groups/g/ack",
            json={
                "results": fenced_acks_for([a]),
                "produce": [{"topic": "nope", "messages": [{}]}],
            },
        )
        assert_error(response, 404, "topic_not_found")
        # The produce call's limits count every output message of the call.
        many = [{"topic": "out", "messages": [{}] * 600}] * 2
        response = client.post(
            "/v1/groups/g/ack", json={"results": fenced_acks_for([a]), "produce": many}
        )
        assert_error(response, 413, "too_large")
        assert out_offsets(client) == [0, 0]
        # Still in flight after all of those: the proper call goes through.
        response = client.post(
            "/v1/groups/g/ack",
            json={"results": fenced_acks_for([a]), "produce": [{"topic": "out", "messages": [{}]}]},
        )
        assert response.status_code == 200, response.text


PIPE, CONSUMER, ADMIN = "pipeline-token-1", "consumer-token-1", "admin-token-1"
TOKENS = (
    Token(ADMIN, "admin"),
    Token(
        PIPE,
        "consumer",
        topics=frozenset({"in", "out"}),
        groups=frozenset({"g"}),
        roles=frozenset({"consumer", "producer"}),
    ),
    Token(CONSUMER, "consumer", topics=frozenset({"in", "out"}), groups=frozenset({"g"})),
)


def test_outputs_need_produce_rights_on_every_output_topic(
    server_factory: ServerFactory,
) -> None:
    server = server_factory(tokens=TOKENS)
    with fresh_client(server) as admin:
        admin.headers["authorization"] = f"Bearer {ADMIN}"
        create_topic(admin, "other", 1)
        (a,) = setup(admin, ["a"])
    with fresh_client(server) as pipe, fresh_client(server) as consumer:
        pipe.headers["authorization"] = f"Bearer {PIPE}"
        consumer.headers["authorization"] = f"Bearer {CONSUMER}"
        out = {"topic": "out", "messages": [{"body": 1}]}
        response = consumer.post(
            "/v1/groups/g/ack", json={"results": fenced_acks_for([a]), "produce": [out]}
        )
        assert_error(response, 403, "forbidden")
        other = {"topic": "other", "messages": [{"body": 1}]}
        response = pipe.post(
            "/v1/groups/g/ack", json={"results": fenced_acks_for([a]), "produce": [out, other]}
        )
        assert_error(response, 403, "forbidden")
        # The pipeline token (consumer and producer) may; no admin token needed.
        response = pipe.post(
            "/v1/groups/g/ack", json={"results": fenced_acks_for([a]), "produce": [out]}
        )
        assert response.status_code == 200, response.text
        assert len(response.json()["produced"]) == 1
        # And it may produce to "out" on its own, as a producer.
        response = pipe.post("/v1/topics/out/messages", json={"messages": [{"body": 2}]})
        assert response.status_code == 200, response.text
