"""The internal producer: batching on the wire, retries, and the driver-side preflight."""

from __future__ import annotations

import httpx
import orjson
import pytest

from spark_sink import ProduceRejectedError, SinkConfigError, SinkOptions, SinkUnavailableError
from spark_sink.producer import Producer, check_service

OPTIONS = SinkOptions.create(url="http://cproxy", topic="rides", key_col="k", max_retries=3)


def ok(request: httpx.Request) -> httpx.Response:
    count = len(orjson.loads(request.content)["messages"])
    return httpx.Response(
        200, json={"results": [{"qid": 0, "offset": i, "duplicate": False} for i in range(count)]}
    )


def scripted(*responses: int | Exception) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    """A transport answering with the given statuses/exceptions in turn, then 200s."""
    pending = list(responses)
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if pending:
            step = pending.pop(0)
            if isinstance(step, Exception):
                raise step
            return httpx.Response(
                step,
                json={"error": {"code": "x", "message": f"status {step}"}},
                headers={"Retry-After": "2"} if step == 429 else {},
            )
        return ok(request)

    return httpx.MockTransport(handle), seen


def test_send_posts_one_json_batch_to_the_topic() -> None:
    transport, seen = scripted()
    with Producer(OPTIONS.replace(token="tok"), transport=transport) as producer:
        results = producer.send([b'{"key":"a","body":1,"id":"x"}', b'{"key":"b","body":2}'])
    assert [r.offset for r in results] == [0, 1]
    request = seen[0]
    assert request.url.path == "/v1/topics/rides/messages"
    assert request.headers["Authorization"] == "Bearer tok"
    assert orjson.loads(request.content) == {
        "messages": [{"key": "a", "body": 1, "id": "x"}, {"key": "b", "body": 2}]
    }


def test_transient_errors_are_retried_with_backoff() -> None:
    sleeps: list[float] = []
    transport, seen = scripted(503, httpx.ConnectError("refused"), 429)
    with Producer(OPTIONS, transport=transport, sleep=sleeps.append) as producer:
        assert len(producer.send([b"{}"])) == 1
    assert len(seen) == 4 and producer.retries == 3
    assert 0.05 <= sleeps[0] <= 0.1 and 0.1 <= sleeps[1] <= 0.2
    assert sleeps[2] == 2.0  # Retry-After wins
    # Every retry re-sends the identical body, ids included: that is what makes it safe.
    assert len({r.content for r in seen}) == 1


def test_retries_are_bounded() -> None:
    transport, seen = scripted(*([503] * 10))
    with (
        Producer(OPTIONS, transport=transport, sleep=lambda _: None) as producer,
        pytest.raises(SinkUnavailableError, match="failed after 4 attempt"),
    ):
        producer.send([b"{}"])
    assert len(seen) == 4


@pytest.mark.parametrize(
    ("status", "hint"),
    [(422, "invalid"), (413, "lower batch_size"), (404, "does topic"), (401, "token")],
)
def test_client_errors_are_not_retried(status: int, hint: str) -> None:
    transport, seen = scripted(status)
    with (
        Producer(OPTIONS, transport=transport, sleep=lambda _: None) as producer,
        pytest.raises(ProduceRejectedError, match=f"HTTP {status}") as info,
    ):
        producer.send([b"{}"])
    assert len(seen) == 1
    assert info.value.status == status and info.value.code == "x"
    assert hint in str(info.value) or status == 422


def test_malformed_response_is_an_error() -> None:
    transport = httpx.MockTransport(lambda r: httpx.Response(200, json={"results": []}))
    with (
        Producer(OPTIONS, transport=transport) as producer,
        pytest.raises(SinkUnavailableError, match="sent 1 messages but got 0"),
    ):
        producer.send([b"{}"])


def test_check_service_finds_or_creates_the_topic() -> None:
    calls: list[tuple[str, str]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append((request.method, request.url.path))
        if request.method == "GET":
            return httpx.Response(404, json={"error": {"code": "topic_not_found", "message": "no"}})
        return httpx.Response(201, json={"name": "rides", "queues": 8})

    transport = httpx.MockTransport(handle)
    with pytest.raises(SinkConfigError, match="topic 'rides' does not exist"):
        check_service(OPTIONS, transport)
    assert check_service(OPTIONS.replace(create_topic_queues=8), transport) == 8
    assert calls[-1] == ("POST", "/v1/topics")


def test_check_service_reports_unreachable_and_unavailable() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    with pytest.raises(SinkUnavailableError, match="cannot reach cproxy at http://cproxy"):
        check_service(OPTIONS, httpx.MockTransport(refuse))
    down = httpx.MockTransport(lambda r: httpx.Response(503, json={}))
    with pytest.raises(SinkUnavailableError, match="unavailable: HTTP 503"):
        check_service(OPTIONS, down)
