"""Topics over HTTP (docs/api.md "Topics"): create, idempotency, conflicts, validation, describe."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.api.http_helpers import (
    assert_error,
    create_topic,
    fresh_client,
    produce,
    queue_stats,
    shared_server,
)
from tests.support import RunningServer


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One server for the read-only cases (rejected creates, unknown topics)."""
    with shared_server(tmp_path_factory) as running:
        with fresh_client(running) as client:
            create_topic(client, "exists", 2)
        yield running


def test_create_is_idempotent_and_conflicts_on_other_queue_count(server: RunningServer) -> None:
    with fresh_client(server) as client:
        first = client.post("/v1/topics", json={"name": "orders", "queues": 8})
        assert first.status_code == 201, first.text
        assert first.json() == {"name": "orders", "queues": 8}

        again = client.post("/v1/topics", json={"name": "orders", "queues": 8})
        assert again.status_code == 200, again.text
        assert again.json() == {"name": "orders", "queues": 8}

        conflict = client.post("/v1/topics", json={"name": "orders", "queues": 4})
        assert_error(conflict, 409, "topic_conflict")

        # The conflicting call changed nothing.
        described = client.get("/v1/topics/orders").json()
        assert described["queues"] == 8
        assert len(described["queue_stats"]) == 8


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"name": "t", "queues": 0}, id="queues-0"),
        pytest.param({"name": "t", "queues": -1}, id="queues-negative"),
        pytest.param({"name": "t", "queues": 1025}, id="queues-1025"),
        pytest.param({"name": "t", "queues": "4"}, id="queues-string"),
        pytest.param({"name": "t", "queues": 2.5}, id="queues-float"),
        pytest.param({"name": "t", "queues": True}, id="queues-bool"),
        pytest.param({"name": "t", "queues": None}, id="queues-null"),
        pytest.param({"name": "x" * 201, "queues": 1}, id="name-201-chars"),
        pytest.param({"name": "bad name", "queues": 1}, id="name-space"),
        pytest.param({"name": "", "queues": 1}, id="name-empty"),
        pytest.param({"name": "a/b", "queues": 1}, id="name-slash"),
        pytest.param({"name": "caf\u00e9", "queues": 1}, id="name-non-ascii"),
        pytest.param({"name": "t\n", "queues": 1}, id="name-trailing-newline"),
        pytest.param({"name": 7, "queues": 1}, id="name-int"),
        pytest.param({"queues": 1}, id="name-missing"),
        pytest.param({"name": "t", "queues": 1, "replicas": 3}, id="extra-field"),
    ],
)
def test_invalid_topic_is_rejected_with_422(shared: RunningServer, body: dict[str, Any]) -> None:
    with fresh_client(shared) as client:
        assert_error(client.post("/v1/topics", json=body), 422)
        assert client.get("/v1/topics").json() == {"topics": [{"name": "exists", "queues": 2}]}


@pytest.mark.parametrize(
    ("name", "queues"),
    [("x" * 200, 1), ("A.b-c_9", 1024), ("1", 1)],
    ids=["name-200-chars", "queues-1024-and-punctuation", "single-char"],
)
def test_boundary_values_are_accepted(server: RunningServer, name: str, queues: int) -> None:
    with fresh_client(server) as client:
        response = client.post("/v1/topics", json={"name": name, "queues": queues})
        assert response.status_code == 201, response.text
        assert response.json() == {"name": name, "queues": queues}
        described = client.get(f"/v1/topics/{name}").json()
        assert [s["qid"] for s in described["queue_stats"]] == list(range(queues))


def test_list_topics(server: RunningServer) -> None:
    with fresh_client(server) as client:
        assert client.get("/v1/topics").json() == {"topics": []}
        expected = {"rides": 4, "orders": 2, "audit.log": 1}
        for name, queues in expected.items():
            create_topic(client, name, queues)
        response = client.get("/v1/topics")
        assert response.status_code == 200
        topics = response.json()["topics"]
        assert all(set(t) == {"name", "queues"} for t in topics)
        assert {t["name"]: t["queues"] for t in topics} == expected
        assert len(topics) == len(expected)


def test_describe_reports_queue_stats(server: RunningServer) -> None:
    with fresh_client(server) as client:
        create_topic(client, "rides", 3)
        empty = client.get("/v1/topics/rides")
        assert empty.status_code == 200
        assert empty.json() == {
            "name": "rides",
            "queues": 3,
            "queue_stats": [{"qid": q, "min_offset": 0, "next_offset": 0} for q in range(3)],
        }
        produce(
            client,
            "rides",
            [{"qid": 0, "body": i} for i in range(2)] + [{"qid": 2, "body": i} for i in range(5)],
        )
        stats = queue_stats(client, "rides")
        assert stats == [
            {"qid": 0, "min_offset": 0, "next_offset": 2},
            {"qid": 1, "min_offset": 0, "next_offset": 0},
            {"qid": 2, "min_offset": 0, "next_offset": 5},
        ]


@pytest.mark.parametrize("name", ["nope", "bad name", "x" * 300])
def test_unknown_topic_is_404(shared: RunningServer, name: str) -> None:
    with fresh_client(shared) as client:
        assert client.get("/v1/topics/exists").status_code == 200
        assert_error(client.get(f"/v1/topics/{name}"), 404, "topic_not_found")
