"""Filter and transform per group over HTTP (JMESPath), with a real server."""

from __future__ import annotations

from tests.api.test_delivery import pull, setup
from tests.support import RunningServer


def test_filter_transform_and_a_failing_expression_over_http(server: RunningServer) -> None:
    with server.client() as client:
        bad = client.put("/v1/groups/g", json={"topics": {"t": {"filter": "body.["}}})
        assert bad.status_code == 422
        assert bad.json()["error"]["code"] == "invalid_config"
        assert "not valid JMESPath" in bad.json()["error"]["message"]
        entry = {
            "order_by": "key",
            "filter": "abs(body.n) > `1`",
            "transform": "{n: body.n, tag: headers.tag}",
        }
        setup(client, {"topics": {"t": entry}, "max_attempts": 1}, queues=1)
        messages = [
            {"key": "a", "body": {"n": 5}, "headers": {"tag": "x"}},
            {"key": "b", "body": {"n": 1}},  # filtered out
            {"key": "c", "body": {"n": "oops"}},  # abs() raises: dead-lettered at once
            {"key": "d", "body": {"n": 9}},
        ]
        assert client.post("/v1/topics/t/messages", json={"messages": messages}).status_code == 200
        got = pull(client, wait_ms=1000)
        assert [(m["key"], m["body"]) for m in got] == [
            ("a", {"n": 5, "tag": "x"}),
            ("d", {"n": 9, "tag": None}),
        ]
        group = client.get("/v1/groups/g").json()
        assert group["topics"]["t"]["filter"] == entry["filter"]
        assert group["stats"]["filtered"] == 1
        dead = client.get("/v1/groups/g/dead-letters").json()["dead_letters"]
        assert [(d["key"], d["attempts"]) for d in dead] == [("c", 0)]
        assert "abs" in dead[0]["last_error"]
        metrics = client.get("/metrics").text
        assert 'cproxy_filtered_messages_total{group="g",topic="t"} 1.0' in metrics
