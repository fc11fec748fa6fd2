"""Produce over HTTP (docs/api.md "Produce": queue selection, order, atomicity, limits;
docs/guarantees.md §6: dedup)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from cproxy.config import Limits
from cproxy.placement import queue_for_key
from tests.api.http_helpers import (
    JSON_HEADERS,
    assert_error,
    create_topic,
    fresh_client,
    produce,
    pull_all,
    put_group,
    queue_stats,
    shared_server,
)
from tests.support import RunningServer


def test_results_are_in_request_order(server: RunningServer) -> None:
    qids = [2, 0, 1, 2, 2, 0, 3, 1]
    with fresh_client(server) as client:
        create_topic(client, "t", 4)
        results = produce(client, "t", [{"qid": q, "body": {"i": i}} for i, q in enumerate(qids)])
        assert [r["qid"] for r in results] == qids
        # The n-th message sent to a queue gets offset n: results follow the request order.
        seen: Counter[int] = Counter()
        for r in results:
            assert r["offset"] == seen[r["qid"]]
            assert r["duplicate"] is False
            seen[r["qid"]] += 1
        assert {s["qid"]: s["next_offset"] for s in queue_stats(client, "t")} == dict(seen)


def test_key_selects_a_stable_kafka_compatible_queue(server: RunningServer) -> None:
    keys = [f"ride-{i}" for i in range(40)] + ["", "\u00fcber-\u2603", "a" * 300]
    with fresh_client(server) as client:
        create_topic(client, "t", 8)
        first = produce(client, "t", [{"key": k, "body": 1} for k in keys])
        second = produce(client, "t", [{"key": k, "body": 2} for k in reversed(keys)])
        expected = [queue_for_key(k, 8) for k in keys]
        assert [r["qid"] for r in first] == expected
        assert [r["qid"] for r in reversed(second)] == expected
        assert len(set(expected)) > 1, "the keys should spread over several queues"


def test_explicit_qid_wins_over_key(server: RunningServer) -> None:
    with fresh_client(server) as client:
        create_topic(client, "t", 4)
        hashed = queue_for_key("k", 4)
        other = (hashed + 1) % 4
        results = produce(
            client, "t", [{"key": "k", "qid": other, "body": 1}, {"key": "k", "body": 2}]
        )
        assert [r["qid"] for r in results] == [other, hashed]


@pytest.mark.parametrize("bad_qid", [4, 1000, 2**63])
def test_qid_out_of_range_rejects_the_whole_call(server: RunningServer, bad_qid: int) -> None:
    with fresh_client(server) as client:
        create_topic(client, "t", 4)
        produce(client, "t", [{"qid": 1, "body": "before"}])
        before = queue_stats(client, "t")
        batch = [
            {"qid": 0, "body": "a"},
            {"key": "k", "body": "b"},
            {"body": "c"},
            {"qid": bad_qid, "body": "d"},
        ]
        response = client.post("/v1/topics/t/messages", json={"messages": batch})
        assert_error(response, 422)
        assert queue_stats(client, "t") == before, "a rejected call must store nothing"
        # No offsets were burnt either: the next message on queue 1 gets offset 1.
        assert produce(client, "t", [{"qid": 1, "body": "after"}])[0]["offset"] == 1


def test_round_robin_without_key(server: RunningServer) -> None:
    with fresh_client(server) as client:
        create_topic(client, "t", 4)
        results = produce(client, "t", [{"body": i} for i in range(8)])
        assert Counter(r["qid"] for r in results) == {0: 2, 1: 2, 2: 2, 3: 2}
        more = produce(client, "t", [{"body": i} for i in range(4)])
        assert sorted(r["qid"] for r in more) == [0, 1, 2, 3]
        assert [s["next_offset"] for s in queue_stats(client, "t")] == [3, 3, 3, 3]


def test_body_key_and_headers_round_trip_through_pull(server: RunningServer) -> None:
    sent: list[dict[str, Any]] = [
        {
            "key": "ride-7",
            "body": {"event": "pickup", "n": [1, 2.5, None, True], "s": "\u2603"},
            "headers": {"trace-id": "abc-123", "h\u00e9": "v\u00e9", "empty": ""},
        },
        {"key": None, "body": "plain string", "headers": {"only": "one"}},
        {"body": [1, {"nested": {"deep": [[]]}}]},
        {"body": None},
        {"body": 12345678901234},
    ]
    with fresh_client(server) as client:
        create_topic(client, "t", 1)
        put_group(client, "g", {"t": "qid"})
        results = produce(client, "t", sent)
        got = sorted(pull_all(client, "g", len(sent)), key=lambda m: m["offset"])
        assert [m["offset"] for m in got] == [r["offset"] for r in results]
        for message, original in zip(got, sent, strict=True):
            assert message["topic"] == "t"
            assert message["qid"] == 0
            assert message["key"] == original.get("key")
            assert message["body"] == original["body"]
            if "headers" in original:
                assert message["headers"] == original["headers"]
            else:
                assert message["headers"] in ({}, None)
            assert message["attempt"] == 1
            assert isinstance(message["produced_at_ms"], int) and message["produced_at_ms"] > 0


def test_dedup_returns_the_original_position(server: RunningServer) -> None:
    with fresh_client(server) as client:
        create_topic(client, "t", 4)
        create_topic(client, "other", 4)
        put_group(client, "g", {"t": "none"})
        [original] = produce(client, "t", [{"id": "m-1", "key": "k", "body": "first"}])
        assert original["duplicate"] is False
        stored = queue_stats(client, "t")

        # Same id again, even with another body, key or explicit qid: not stored again.
        other_qid = (original["qid"] + 1) % 4
        again = produce(
            client, "t", [{"id": "m-1", "key": "zzz", "qid": other_qid, "body": "second"}]
        )
        assert again == [{**original, "duplicate": True}]
        assert queue_stats(client, "t") == stored

        # Within one call: the second copy refers to the first one.
        batch = produce(
            client,
            "t",
            [
                {"id": "m-2", "body": 1},
                {"id": "m-3", "body": 2},
                {"id": "m-2", "body": 3},
                {"id": "m-1", "body": 4},
            ],
        )
        assert [r["duplicate"] for r in batch] == [False, False, True, True]
        assert (batch[2]["qid"], batch[2]["offset"]) == (batch[0]["qid"], batch[0]["offset"])
        assert (batch[3]["qid"], batch[3]["offset"]) == (original["qid"], original["offset"])
        assert sum(s["next_offset"] for s in queue_stats(client, "t")) == 3

        # Ids are per topic.
        assert produce(client, "other", [{"id": "m-1", "body": 1}])[0]["duplicate"] is False

        # Only the originals are delivered.
        delivered = pull_all(client, "g", 3)
        assert sorted(repr(m["body"]) for m in delivered) == ["'first'", "1", "2"]
        more = client.post("/v1/groups/g/pull", json={"wait_ms": 300}).json()["messages"]
        assert more == []


def test_produce_to_unknown_topic_is_404(server: RunningServer) -> None:
    with fresh_client(server) as client:
        response = client.post("/v1/topics/nope/messages", json={"messages": [{"body": 1}]})
        assert_error(response, 404, "topic_not_found")
        assert client.get("/v1/topics").json() == {"topics": []}


# -- limits --------------------------------------------------------------------------------------

SMALL = Limits(max_messages_per_call=3, max_message_bytes=100, max_request_bytes=1000)


def _padded(body: bytes, total: int) -> bytes:
    """``body`` (a JSON object) with whitespace inserted so it is ``total`` bytes long."""
    assert body.startswith(b"{")
    return b"{" + b" " * (total - len(body)) + body[1:]


def _chunks(data: bytes, size: int = 128) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with shared_server(tmp_path_factory, limits=SMALL) as running:
        with fresh_client(running) as client:
            create_topic(client, "t", 2)
        yield running


@pytest.mark.parametrize(
    "request_kwargs",
    [
        pytest.param(
            {"json": {"messages": [{"body": i} for i in range(4)]}}, id="too-many-messages"
        ),
        pytest.param({"json": {"messages": [{"body": "x" * 101}]}}, id="oversize-body"),
        pytest.param(
            {"json": {"messages": [{"body": 1}, {"body": 2, "key": "k" * 120}]}},
            id="oversize-key-in-second-message",
        ),
        pytest.param(
            {"json": {"messages": [{"body": 1, "headers": {"h": "v" * 120}}]}},
            id="oversize-headers",
        ),
        pytest.param(
            {"content": _padded(b'{"messages": [{"body": 1}]}', 1001), "headers": JSON_HEADERS},
            id="request-over-limit-with-length",
        ),
        pytest.param(
            {
                "content": _chunks(_padded(b'{"messages": [{"body": 1}]}', 1001)),
                "headers": JSON_HEADERS,
            },
            id="request-over-limit-chunked",
        ),
        pytest.param(
            {
                "content": _chunks(_padded(b'{"messages": [{"body": 1}]}', 50_000)),
                "headers": JSON_HEADERS,
            },
            id="request-far-over-limit-chunked",
        ),
    ],
)
def test_limits_give_413_and_store_nothing(
    limited: RunningServer, request_kwargs: dict[str, Any]
) -> None:
    with fresh_client(limited) as client:
        before = queue_stats(client, "t")
        response = client.post("/v1/topics/t/messages", **request_kwargs)
        assert_error(response, 413, "too_large")
        assert queue_stats(client, "t") == before, "a rejected call must store nothing"


@pytest.mark.parametrize(
    "request_kwargs",
    [
        pytest.param({"json": {"messages": [{"body": "x" * 90}] * 3}}, id="at-message-limits"),
        pytest.param(
            {"content": _padded(b'{"messages": [{"body": 1}]}', 1000), "headers": JSON_HEADERS},
            id="request-at-limit-with-length",
        ),
        pytest.param(
            {
                "content": _chunks(_padded(b'{"messages": [{"body": 1}]}', 1000)),
                "headers": JSON_HEADERS,
            },
            id="request-at-limit-chunked",
        ),
    ],
)
def test_requests_within_limits_are_accepted(
    limited: RunningServer, request_kwargs: dict[str, Any]
) -> None:
    with fresh_client(limited) as client:
        before = sum(s["next_offset"] for s in queue_stats(client, "t"))
        response = client.post("/v1/topics/t/messages", **request_kwargs)
        assert response.status_code == 200, response.text
        stored = sum(s["next_offset"] for s in queue_stats(client, "t")) - before
        assert stored == len(response.json()["results"]) > 0


def test_message_size_counts_utf8_bytes_of_the_key(limited: RunningServer) -> None:
    """The limit is in bytes: a key of 60 two-byte characters is 120 bytes, over the 100 limit
    (cproxy/api/produced.py ``new_messages`` measures key and id in UTF-8 bytes, not
    characters, which would count this message as 61 "bytes" and accept it)."""
    with fresh_client(limited) as client:
        before = queue_stats(client, "t")
        response = client.post(
            "/v1/topics/t/messages", json={"messages": [{"key": "\u00e9" * 60, "body": 1}]}
        )
        assert_error(response, 413, "too_large")
        assert queue_stats(client, "t") == before
