"""Retention over HTTP (guarantee 9, docs/api.md "Topics"): old messages disappear, min_offset
moves, a lagging group reports what it lost and keeps flowing; PATCH and DELETE of topics.

Real servers (SQLite in a temp dir) with a short ``retention_interval_ms``; every wait polls
with a deadline.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from cproxy.config import settings_from_mapping
from cproxy.errors import ConfigError
from tests.api.http_helpers import (
    assert_error,
    fresh_client,
    group_stats,
    produce,
    pull_all,
    put_group,
    queue_stats,
)
from tests.conftest import ServerFactory
from tests.support import RunningServer, wait_until


def post_topic(client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post("/v1/topics", json=body)


def test_old_messages_disappear_and_a_lagging_group_reports_what_it_lost(
    server_factory: ServerFactory,
) -> None:
    server = server_factory(retention_interval_ms=50)
    with fresh_client(server) as client:
        created = post_topic(client, name="ev", queues=1, retention_ms=1500)
        assert created.status_code == 201, created.text
        assert created.json() == {
            "name": "ev",
            "queues": 1,
            "retention_ms": 1500,
            "retention_bytes": None,
        }
        # The lagging group holds at most 2 messages in memory and pulls nothing for now, so
        # most of what is produced is still unread when retention deletes it.
        put_group(client, "lag", {"ev": "key"}, max_buffered=2)
        produce(client, "ev", [{"key": f"k{i % 4}", "body": {"i": i}} for i in range(20)])
        assert queue_stats(client, "ev") == [{"qid": 0, "min_offset": 0, "next_offset": 20}]

        # Old messages disappear and min_offset moves up to next_offset.
        wait_until(
            lambda: queue_stats(client, "ev")[0]["min_offset"] == 20,
            timeout_s=15,
            message="retention to delete everything",
        )
        stats = wait_until(
            lambda: (s := group_stats(client, "lag"))["lost_to_retention"] > 0 and s,
            timeout_s=10,
            message="the group to report its loss",
        )
        lost = stats["lost_to_retention"]
        # What the group still held in memory is delivered; everything else was lost, counted.
        held = pull_all(client, "lag", 20 - lost, timeout_s=10)
        assert len(held) + lost == 20
        assert 0 < len(held) <= 2
        assert group_stats(client, "lag")["lost_to_retention"] == lost
        metrics = client.get("/metrics").text
        assert f'cproxy_lost_to_retention_messages_total{{group="lag",topic="ev"}} {lost}.0' in (
            metrics
        )

        # The group keeps flowing with what is produced next.
        produce(client, "ev", [{"key": "k0", "body": {"i": 20 + i}} for i in range(3)])
        fresh = pull_all(client, "lag", 3, timeout_s=10)
        assert [m["offset"] for m in fresh] == [20, 21, 22]
        assert group_stats(client, "lag")["lost_to_retention"] == lost


def test_retention_bytes_keeps_the_newest_messages_per_queue(
    server_factory: ServerFactory,
) -> None:
    server = server_factory(retention_interval_ms=50)
    with fresh_client(server) as client:
        assert post_topic(client, name="sized", queues=2).status_code == 201
        # Bodies of 10 bytes ("12345678" with its quotes), no key: 10 bytes each.
        produce(client, "sized", [{"qid": 0, "body": f"{i:08d}"} for i in range(30)])
        produce(client, "sized", [{"qid": 1, "body": f"{0:08d}"}])
        patched = client.patch("/v1/topics/sized", json={"retention_bytes": 55})
        assert patched.status_code == 200, patched.text
        assert patched.json()["retention_bytes"] == 55
        wait_until(
            lambda: queue_stats(client, "sized")[0]["min_offset"] == 25,
            timeout_s=10,
            message="retention_bytes to apply",
        )
        assert queue_stats(client, "sized") == [
            {"qid": 0, "min_offset": 25, "next_offset": 30},
            {"qid": 1, "min_offset": 0, "next_offset": 1},
        ]


def test_patch_changes_retention_and_validates_it(server: RunningServer) -> None:
    with fresh_client(server) as client:
        assert post_topic(client, name="t", queues=2).status_code == 201
        # A topic without retention keeps the original shape.
        assert client.get("/v1/topics").json()["topics"] == [{"name": "t", "queues": 2}]
        response = client.patch("/v1/topics/t", json={"retention_ms": 60_000})
        assert response.json() == {
            "name": "t",
            "queues": 2,
            "retention_ms": 60_000,
            "retention_bytes": None,
        }
        # A field left out keeps its value; null makes it unbounded.
        response = client.patch("/v1/topics/t", json={"retention_bytes": 1 << 20})
        assert (response.json()["retention_ms"], response.json()["retention_bytes"]) == (
            60_000,
            1 << 20,
        )
        detail = client.get("/v1/topics/t").json()
        assert (detail["retention_ms"], detail["retention_bytes"]) == (60_000, 1 << 20)
        assert detail["queue_stats"][0] == {"qid": 0, "min_offset": 0, "next_offset": 0}
        response = client.patch("/v1/topics/t", json={"retention_ms": None})
        assert (response.json()["retention_ms"], response.json()["retention_bytes"]) == (
            None,
            1 << 20,
        )
        for bad in (0, -1, "10", True, 1.5):
            for field in ("retention_ms", "retention_bytes"):
                assert_error(client.patch("/v1/topics/t", json={field: bad}), 422)
                assert_error(post_topic(client, name="u", **{field: bad}), 422)
        assert_error(client.patch("/v1/topics/t", json={"queues": 4}), 422)
        assert_error(client.patch("/v1/topics/nope", json={}), 404, "topic_not_found")
        # Creating again: without retention fields it is the same topic (200); with different
        # ones it is a conflict (PATCH changes them).
        assert post_topic(client, name="t", queues=2).status_code == 200
        same = post_topic(client, name="t", queues=2, retention_ms=None, retention_bytes=1 << 20)
        assert same.status_code == 200, same.text
        assert_error(post_topic(client, name="t", queues=2, retention_ms=5), 409, "topic_conflict")
        assert client.get("/v1/topics/u").status_code == 404


def test_delete_is_refused_while_a_group_reads_the_topic(server: RunningServer) -> None:
    with fresh_client(server) as client:
        assert post_topic(client, name="t", queues=2).status_code == 201
        assert post_topic(client, name="other", queues=1).status_code == 201
        produce(client, "t", [{"key": "a", "body": i} for i in range(5)])
        produce(client, "other", [{"body": "kept"}])
        put_group(client, "reader", {"t": "key"})
        error = assert_error(client.delete("/v1/topics/t"), 409, "topic_in_use")
        assert "reader" in error["message"]
        assert len(queue_stats(client, "t")) == 2  # still there

        # Once the group reads something else, the delete goes through.
        put_group(client, "reader", {"other": "none"})
        response = client.delete("/v1/topics/t")
        assert response.status_code == 200, response.text
        assert response.json() == {"deleted": "t"}
        assert_error(client.get("/v1/topics/t"), 404, "topic_not_found")
        assert_error(client.delete("/v1/topics/t"), 404, "topic_not_found")
        assert_error(
            client.post("/v1/topics/t/messages", json={"messages": [{"body": 1}]}),
            404,
            "topic_not_found",
        )
        assert [t["name"] for t in client.get("/v1/topics").json()["topics"]] == ["other"]
        # The name can be used again, from offset 0; the other topic is untouched.
        assert post_topic(client, name="t", queues=1).status_code == 201
        assert queue_stats(client, "t") == [{"qid": 0, "min_offset": 0, "next_offset": 0}]
        assert [m["body"] for m in pull_all(client, "reader", 1)] == ["kept"]


@pytest.mark.parametrize("spec", [{"retention_ms": 0}, {"retention_bytes": "1"}, {"x": 1}])
def test_config_file_topic_retention_is_validated(spec: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        settings_from_mapping({"topics": {"t": {"queues": 1, **spec}}})


def test_config_file_declares_retention(server_factory: ServerFactory) -> None:
    declared = settings_from_mapping(
        {
            "server": {"retention_interval_ms": 100},
            "topics": {"r": {"queues": 2, "retention_ms": 3_600_000}, "plain": {"queues": 1}},
        }
    )
    assert declared.retention_interval_ms == 100
    assert declared.topic_retention == {"r": (3_600_000, None)}
    server = server_factory(
        topics=declared.topics, topic_retention=declared.topic_retention, retention_interval_ms=100
    )
    with fresh_client(server) as client:
        topics = client.get("/v1/topics").json()["topics"]
        assert topics == [
            {"name": "plain", "queues": 1},
            {"name": "r", "queues": 2, "retention_ms": 3_600_000, "retention_bytes": None},
        ]
