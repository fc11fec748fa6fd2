"""Produced bodies (cproxy/api/produced.py): stored as sent when that cannot change their
meaning, the documented reading of everything else; 422s that name the field; the router's
405 for other methods and 404 for unknown names. (The checks every route shares:
test_request_contract.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.api.http_helpers import (
    JSON_HEADERS,
    assert_error,
    create_topic,
    fresh_client,
    put_group,
    queue_stats,
    shared_server,
)
from tests.support import RunningServer

PRODUCE = "/v1/topics/t/messages"


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with shared_server(tmp_path_factory) as server:
        with fresh_client(server) as client:
            create_topic(client, "t", 1)
            put_group(client, "g", {"t": "qid"})
        yield server


def _nested(depth: int) -> Any:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _deliver(server: RunningServer, body_text: bytes) -> bytes:
    """Produce one message whose body is ``body_text``, pull it and ack it; the pull answer."""
    with fresh_client(server) as client:
        sent = b'{"messages": [{"body": ' + body_text + b"}]}"
        response = client.post(PRODUCE, content=sent, headers=JSON_HEADERS)
        assert response.status_code == 200, response.text
        answer = client.post("/v1/groups/g/pull", json={"wait_ms": 5000}).content
        messages = orjson.loads(answer)["messages"]
        assert len(messages) == 1, answer
        acks = [{"topic": "t", "qid": 0, "acks": [messages[0]["offset"]]}]
        ack = client.post("/v1/groups/g/ack", json={"results": acks})
        assert ack.json() == {"applied": 1, "unknown": []}
        return answer


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param(b'{"a" : 1,  "b": [true, null, "x y"]}', {"a": 1, "b": [True, None, "x y"]}),
        pytest.param(b'"caf\\u00e9"', "caf\u00e9", id="escaped-non-ascii"),
        pytest.param('{"name": "café"}'.encode(), {"name": "café"}, id="utf8"),
        pytest.param(b"-0.5", -0.5, id="float"),
        # Integers beyond 64 bits are read as floating point (docs/api.md).
        pytest.param(b"18446744073709551616", 1.8446744073709552e19, id="int-beyond-64-bits"),
        pytest.param(b"-9223372036854775809", -9.223372036854776e18, id="int-below-int64"),
        pytest.param(b"18446744073709551615", 18446744073709551615, id="largest-uint64"),
        pytest.param(b"9999999999999999999", 9999999999999999999, id="largest-19-digits"),
        pytest.param(b"-9223372036854775808", -9223372036854775808, id="smallest-int64"),
        pytest.param(b"2.5e3", 2500.0, id="exponent"),
        pytest.param(b"[" * 200 + b"]" * 200, _nested(200), id="nested-200"),
    ],
)
def test_bodies_are_delivered_with_the_meaning_sent(
    running: RunningServer, text: bytes, value: Any
) -> None:
    delivered = orjson.loads(_deliver(running, text))["messages"][0]["body"]
    assert delivered == value
    assert type(delivered) is type(value)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(b'{"k" :  [1,2 , 3]}', id="plain-request"),
        # The request as a whole looks risky ("e1000" reads like an exponent): the body is
        # then checked on its own, and is still stored as sent.
        pytest.param(b'{"k" :  [1,2 , 3]}, "key": "e1000"', id="risky-looking-key"),
    ],
)
def test_a_plain_body_is_stored_as_the_bytes_sent(running: RunningServer, text: bytes) -> None:
    """Not parsed and encoded again: the client's own spacing reaches the consumer."""
    assert b'"body":{"k" :  [1,2 , 3]}' in _deliver(running, text)


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        # A nanosecond timestamp (19 digits, positive) reads exactly: kept as sent.
        (b'{"t" :  1764111111111111111}', b'{"t" :  1764111111111111111}'),
        # A negative 19-digit integer may be below -2**63: parsed and re-encoded (compact).
        (b'{"t" :  -1764111111111111111}', b'{"t":-1764111111111111111}'),
        (b'{"t" :  17641111111111111110}', b'{"t":17641111111111111110}'),
    ],
)
def test_long_integers_are_kept_as_sent_only_when_they_read_exactly(
    running: RunningServer, text: bytes, stored: bytes
) -> None:
    assert b'"body":' + stored in _deliver(running, text)


@pytest.mark.parametrize(
    ("text", "status", "code"),
    [
        pytest.param(b"1e400", 400, "invalid_json", id="beyond-double-range"),
        pytest.param(b'"\xff"', 400, "invalid_json", id="invalid-utf8"),
        pytest.param(b"[" * 300 + b"]" * 300, 422, None, id="nested-300"),
    ],
)
def test_bodies_that_cannot_be_stored_are_refused(
    running: RunningServer, text: bytes, status: int, code: str | None
) -> None:
    with fresh_client(running) as client:
        before = queue_stats(client, "t")
        sent = b'{"messages": [{"body": 1}, {"body": ' + text + b"}]}"
        assert_error(client.post(PRODUCE, content=sent, headers=JSON_HEADERS), status, code)
        assert queue_stats(client, "t") == before


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        (PRODUCE, {"messages": [{"body": 1}, {"qid": "0"}]}, "messages.1.qid: "),
        ("/v1/groups/g/pull", {"max_messages": 0}, "max_messages: "),
        (
            "/v1/groups/g/ack",
            {"results": [{"topic": "t", "qid": 0, "acks": [-1]}]},
            "results.0.acks.0: ",
        ),
        ("/v1/groups/g/ack", {"results": [{"topic": "t"}]}, "results.0: "),
        ("/v1/groups/g/pull", {"wait": 1}, "body: "),
    ],
)
def test_wrong_shapes_name_the_field(
    running: RunningServer, path: str, body: dict[str, Any], where: str
) -> None:
    with fresh_client(running) as client:
        error = assert_error(client.post(path, json=body), 422, "validation_error")
        assert error["message"].startswith(where), error


@pytest.mark.parametrize("path", [PRODUCE, "/v1/groups/g/pull", "/v1/groups/g/ack"])
def test_other_methods_get_405(running: RunningServer, path: str) -> None:
    with fresh_client(running) as client:
        # (GET of the produce path is the message browser, a route of its own.)
        assert_error(client.delete(path), 405, "method_not_allowed")
        assert_error(client.put(path, json={}), 405, "method_not_allowed")


def test_unknown_group_and_topic_are_404(running: RunningServer) -> None:
    with fresh_client(running) as client:
        assert_error(client.post("/v1/groups/nope/pull", json={"wait_ms": 0}), 404)
        assert_error(client.post("/v1/groups/nope/ack", json={"results": []}), 404)
        assert_error(
            client.post("/v1/topics/nope/messages", json={"messages": [{"body": 1}]}),
            404,
            "topic_not_found",
        )
        # An empty path segment is no topic: the router's 404.
        assert_error(client.post("/v1/topics//messages", json={"messages": [{}]}), 404)
