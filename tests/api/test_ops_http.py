"""Operations over HTTP: probes, metrics, API docs, the group list and group stats."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api.http_helpers import (
    assert_error,
    create_topic,
    fresh_client,
    group_stats,
    produce,
    pull_all,
    put_group,
)
from tests.support import RunningServer, wait_until


def test_healthz_and_readyz(server: RunningServer) -> None:
    with fresh_client(server) as client:
        for path in ("/healthz", "/readyz"):
            response = client.get(path)
            assert response.status_code == 200, response.text
            assert response.headers["content-type"].startswith("application/json")


def test_readyz_and_calls_report_503_while_shutting_down(server: RunningServer) -> None:
    with fresh_client(server) as client:
        create_topic(client, "t")
        server.app.state.broker.begin_shutdown()  # what SIGTERM does first
        assert client.get("/readyz").status_code == 503
        assert client.get("/healthz").status_code == 200
        response = client.post("/v1/topics/t/messages", json={"messages": [{"body": 1}]})
        assert_error(response, 503, "shutting_down")


def samples(client: httpx.Client) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def test_metrics_count_produced_and_delivered_messages(server: RunningServer) -> None:
    with fresh_client(server) as client:
        create_topic(client, "t", 2)
        put_group(client, "g", {"t": "key"})
        produce(client, "t", [{"key": f"k{i}", "body": i} for i in range(5)])
        produce(client, "t", [{"id": "dup", "body": 1}, {"id": "dup", "body": 1}])
        pull_all(client, "g", 6)
        topic = frozenset({("topic", "t")})
        group_topic = frozenset({("group", "g"), ("topic", "t")})
        group = frozenset({("group", "g")})

        def counted() -> bool:
            values = samples(client)
            return (
                values.get(("cproxy_produced_messages_total", topic)) == 6
                and values.get(("cproxy_delivered_messages_total", group_topic)) == 6
                # pull_all acked all 6: one produce-to-ack observation each.
                and values.get(("cproxy_produce_to_ack_seconds_count", group)) == 6
            )

        wait_until(counted, message="metrics to count 6 produced, delivered and acked messages")
        text = client.get("/metrics").text
        assert "cproxy_produced_messages_total" in text
        assert "cproxy_delivered_messages_total" in text


def test_docs_and_openapi_are_served(server: RunningServer) -> None:
    with fresh_client(server) as client:
        docs = client.get("/docs")
        assert docs.status_code == 200
        assert docs.headers["content-type"].startswith("text/html")
        assert "swagger" in docs.text.lower()
        spec = client.get("/openapi.json")
        assert spec.status_code == 200
        paths = spec.json()["paths"]
        expected = {
            "/v1/topics": {"get", "post"},
            "/v1/topics/{topic}": {"get"},
            "/v1/topics/{topic}/messages": {"get", "post"},
            "/v1/groups/{group}": {"get", "put", "delete"},
            "/v1/groups/{group}/pull": {"post"},
            "/v1/groups/{group}/ack": {"post"},
            "/v1/groups/{group}/extend": {"post"},
            "/v1/groups/{group}/seek": {"post"},
            "/v1/groups/{group}/dead-letters": {"get"},
            "/v1/groups/{group}/dead-letters/redrive": {"post"},
            "/v1/groups/{group}/blocked-keys": {"get"},
            "/healthz": {"get"},
            "/readyz": {"get"},
            "/metrics": {"get"},
        }
        for path, methods in expected.items():
            assert path in paths, path
            assert methods <= set(paths[path]), (path, set(paths[path]))


def test_list_groups(server: RunningServer) -> None:
    with fresh_client(server) as client:
        assert client.get("/v1/groups").json() == {"groups": []}
        create_topic(client, "t")
        create_topic(client, "u")
        put_group(client, "g1", {"t": "key"})
        put_group(client, "g2", {"u": "none", "t": "qid"})
        listed = client.get("/v1/groups")
        assert listed.status_code == 200
        groups = {g["name"]: sorted(g["topics"]) for g in listed.json()["groups"]}
        assert groups == {"g1": ["t"], "g2": ["t", "u"]}
        assert client.delete("/v1/groups/g1").status_code == 200
        assert [g["name"] for g in client.get("/v1/groups").json()["groups"]] == ["g2"]
        assert_error(client.get("/v1/groups/g1"), 404, "group_not_found")


COUNTS = (
    "ready",
    "in_flight",
    "waiting",
    "retrying",
    "dead_lettered",
    "blocked_keys",
    "in_flight_keys",
)


def counts(stats: dict[str, Any]) -> dict[str, int]:
    return {k: stats[k] for k in COUNTS}


def queue(stats: dict[str, Any]) -> dict[str, Any]:
    [only] = stats["queues"]
    return {k: only[k] for k in ("topic", "qid", "committed_offset", "next_offset", "lag")}


@pytest.fixture
def four_messages(server: RunningServer) -> RunningServer:
    """Topic t (1 queue): k@0, k@1, k@2, j@3."""
    with fresh_client(server) as client:
        create_topic(client, "t", 1)
        produce(
            client, "t", [{"key": "k", "body": n} for n in range(3)] + [{"key": "j", "body": 3}]
        )
    return server


def test_group_config_and_stats(four_messages: RunningServer) -> None:
    with fresh_client(four_messages) as client:
        config = put_group(client, "g", {"t": "key"}, max_attempts=1)
        described = client.get("/v1/groups/g")
        assert described.status_code == 200
        body = described.json()
        assert {k: v for k, v in body.items() if k != "stats"} == config
        assert config["max_attempts"] == 1 and config["topics"] == {"t": {"order_by": "key"}}

        # Read in: the heads of k and j are ready, k@1 and k@2 wait behind k@0.
        wait_until(lambda: counts(group_stats(client, "g"))["ready"] == 2)
        stats = group_stats(client, "g")
        assert all(isinstance(stats[k], int) for k in COUNTS)
        assert counts(stats) == {
            "ready": 2,
            "in_flight": 0,
            "waiting": 2,
            "retrying": 0,
            "dead_lettered": 0,
            "blocked_keys": 0,
            "in_flight_keys": 0,
        }
        assert queue(stats) == {
            "topic": "t",
            "qid": 0,
            "committed_offset": 0,
            "next_offset": 4,
            "lag": 4,
        }

        pulled = client.post("/v1/groups/g/pull", json={"wait_ms": 0}).json()["messages"]
        assert sorted((m["key"], m["offset"]) for m in pulled) == [("j", 3), ("k", 0)]
        assert counts(group_stats(client, "g")) == {
            "ready": 0,
            "in_flight": 2,
            "waiting": 2,
            "retrying": 0,
            "dead_lettered": 0,
            "blocked_keys": 0,  # two heads being handled: in flight, not stuck
            "in_flight_keys": 2,
        }
        values = samples(client)
        group = frozenset({("group", "g")})
        assert (
            values[("cproxy_blocked_keys", group)],
            values[("cproxy_in_flight_keys", group)],
        ) == (
            0,
            2,
        )

        # Ack k@0, fail j@3 (one attempt allowed: dead-lettered).
        results = [{"topic": "t", "qid": 0, "acks": [0], "fails": [{"offset": 3, "error": "boom"}]}]
        acked = client.post("/v1/groups/g/ack", json={"results": results}).json()
        assert acked == {"applied": 2, "unknown": []}
        stats = wait_until(
            lambda: (s := group_stats(client, "g"))["dead_lettered"] == 1 and s,
            message="the dead letter to be counted",
        )
        assert counts(stats) == {
            "ready": 1,
            "in_flight": 0,
            "waiting": 1,
            "retrying": 0,
            "dead_lettered": 1,
            "blocked_keys": 0,
            "in_flight_keys": 0,
        }
        assert queue(stats) == {
            "topic": "t",
            "qid": 0,
            "committed_offset": 1,
            "next_offset": 4,
            "lag": 3,
        }

        dead = wait_until(
            lambda: client.get("/v1/groups/g/dead-letters").json()["dead_letters"],
            message="the dead letter to be listed",
        )
        assert len(dead) == 1
        assert {
            k: dead[0][k]
            for k in ("topic", "qid", "offset", "key", "body", "attempts", "last_error")
        } == {
            "topic": "t",
            "qid": 0,
            "offset": 3,
            "key": "j",
            "body": 3,
            "attempts": 1,
            "last_error": "boom",
        }
        assert isinstance(dead[0]["dead_lettered_at_ms"], int)


def test_retrying_and_blocked_keys(four_messages: RunningServer) -> None:
    with fresh_client(four_messages) as client:
        put_group(
            client, "r", {"t": "key"}, max_attempts=3, retry_backoff_ms=[60_000], stuck_after_ms=1
        )
        wait_until(lambda: group_stats(client, "r")["ready"] == 2)
        pulled = client.post("/v1/groups/r/pull", json={"wait_ms": 0}).json()["messages"]
        assert len(pulled) == 2
        results = [{"topic": "t", "qid": 0, "fails": [{"offset": 0, "error": "later"}]}]
        assert client.post("/v1/groups/r/ack", json={"results": results}).json()["applied"] == 1
        assert counts(group_stats(client, "r")) == {
            "ready": 0,
            "in_flight": 1,
            "waiting": 2,
            "retrying": 1,
            "dead_lettered": 0,
            "blocked_keys": 2,  # k failed; j has been in flight past stuck_after_ms (1 ms)
            "in_flight_keys": 0,
        }
        blocked = client.get("/v1/groups/r/blocked-keys").json()["blocked_keys"]
        by_value = {b["order_value"]: b for b in blocked}
        assert set(by_value) == {"k", "j"}
        k = by_value["k"]
        assert (k["topic"], k["offset"], k["attempts"], k["waiting"], k["body"]) == (
            "t",
            0,
            1,
            2,
            0,
        )
        assert isinstance(k["blocked_since_ms"], int)
        assert (by_value["j"]["offset"], by_value["j"]["waiting"]) == (3, 0)


def test_curl_style_bodies_are_read_as_json_and_other_types_get_415(server: RunningServer) -> None:
    with server.client() as client:
        form = {"content-type": "application/x-www-form-urlencoded"}  # what curl -d sends
        r = client.post("/v1/topics", content=b'{"name": "t", "queues": 1}', headers=form)
        assert r.status_code == 201, r.text
        r = client.post("/v1/topics", content=b'{"name": "t", "queues": 1}', headers={})
        assert r.status_code == 200, r.text
        r = client.post("/v1/topics", content=b"{}", headers={"content-type": "text/plain"})
        assert r.status_code == 415
        assert r.json()["error"]["code"] == "unsupported_media_type"
