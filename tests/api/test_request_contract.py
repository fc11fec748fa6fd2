"""The request contract (DESIGN §4, Auth): every route, hot or cold, makes the same checks in
the same order, so a request that is wrong in the same way gets the same status and error code
on every route it applies to. Two ``Authorization`` headers are a 401 everywhere, whatever
their order and mix (issue 27: the hot routes took the last header, the others the first).

One real server over HTTP (the lean protocol, or ASGI with ``CPROXY_LEAN_HTTP=0``); the
matrix walks every defect over every route it applies to. Each request has exactly one
defect, so none may change stored data (a produce refused for two headers stores nothing).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from cproxy.config import Limits
from cproxy.tokens import Token
from tests.api.http_helpers import assert_error, queue_stats, shared_server
from tests.support import RunningServer

ADMIN, PRODUCER_O, CONSUMER_O = "admin-secret", "producer-o-secret", "consumer-o-secret"
TOKENS = (
    Token(ADMIN, "admin", name="admin"),
    # In scope of another topic and group only: valid tokens that may not touch t or g.
    Token(PRODUCER_O, "producer", topics=frozenset({"o"}), name="producer-o"),
    Token(CONSUMER_O, "consumer", topics=frozenset({"o"}), groups=frozenset({"o"}), name="c-o"),
)
LIMIT = 4096


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    #: A valid body (None: the route reads none).
    body: dict[str, Any] | None = None
    #: A token of the right role whose scope leaves out the path's (or body's) topic/group;
    #: None for listings, which filter instead of refusing.
    outsider: str | None = None


REF = {"topic": "t", "qid": 0, "offset": 999}
ACKS = {"results": [{"topic": "t", "qid": 0, "acks": [9]}]}
HEAD = {"topic": "t", "order_value": "k"}
BLOCKED = "/v1/groups/g/blocked-keys"
ROUTES = {
    # The consumer's fast path and produce (answered below ASGI by the lean protocol).
    "produce": Route("POST", "/v1/topics/t/messages", {"messages": [{"body": 1}]}, PRODUCER_O),
    "pull": Route("POST", "/v1/groups/g/pull", {"wait_ms": 0}, CONSUMER_O),
    "ack": Route("POST", "/v1/groups/g/ack", ACKS, CONSUMER_O),
    "extend": Route("POST", "/v1/groups/g/extend", {"messages": [REF]}, CONSUMER_O),
    # The others.
    "create-topic": Route("POST", "/v1/topics", {"name": "t2", "queues": 1}, PRODUCER_O),
    "patch-topic": Route("PATCH", "/v1/topics/t", {"retention_ms": None}, PRODUCER_O),
    "put-group": Route("PUT", "/v1/groups/g", {"topics": {"t": {"order_by": "key"}}}, CONSUMER_O),
    "seek": Route("POST", "/v1/groups/g/seek", {"topic": "t", "to": "latest"}, CONSUMER_O),
    "redrive": Route("POST", "/v1/groups/g/dead-letters/redrive", {"topic": "t"}, CONSUMER_O),
    "skip": Route("POST", f"{BLOCKED}/skip", HEAD, CONSUMER_O),
    "release": Route("POST", f"{BLOCKED}/release", HEAD, CONSUMER_O),
    "list-topics": Route("GET", "/v1/topics"),
    "get-topic": Route("GET", "/v1/topics/t", outsider=PRODUCER_O),
    "delete-topic": Route("DELETE", "/v1/topics/t", outsider=PRODUCER_O),
    "list-groups": Route("GET", "/v1/groups"),
    "get-group": Route("GET", "/v1/groups/g", outsider=CONSUMER_O),
    "delete-group": Route("DELETE", "/v1/groups/g", outsider=CONSUMER_O),
    "dead-letters": Route("GET", "/v1/groups/g/dead-letters?topic=t", outsider=CONSUMER_O),
    "blocked-keys": Route("GET", BLOCKED, outsider=CONSUMER_O),
    "cluster": Route("GET", "/v1/cluster"),
}  # fmt: skip
WITH_BODY = [name for name, r in ROUTES.items() if r.body is not None]
SCOPED = [name for name, r in ROUTES.items() if r.outsider is not None]

Headers = list[tuple[str, str]]


def bearer(token: str) -> tuple[str, str]:
    return ("Authorization", f"Bearer {token}")


#: Two headers, in both orders, of every mix: valid and unknown, two valid ones, a valid one
#: and one of another scope, a valid one and another scheme.
TWO_HEADERS = {
    "unknown-then-admin": [bearer("wrong-token"), bearer(ADMIN)],
    "admin-then-unknown": [bearer(ADMIN), bearer("wrong-token")],
    "admin-twice": [bearer(ADMIN), bearer(ADMIN)],
    "other-scope-then-admin": [bearer(PRODUCER_O), bearer(ADMIN)],
    "admin-then-other-scope": [bearer(ADMIN), bearer(CONSUMER_O)],
    "admin-then-basic": [bearer(ADMIN), ("Authorization", "Basic YTpi")],
}


def send(
    client: httpx.Client, route: Route, headers: Headers, content: Any = None, json: Any = None
) -> httpx.Response:
    if json is not None:
        content = orjson.dumps(json)
        headers = [*headers, ("Content-Type", "application/json")]
    return client.request(route.method, route.path, headers=headers, content=content)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with shared_server(
        tmp_path_factory, tokens=TOKENS, limits=Limits(max_request_bytes=LIMIT)
    ) as server:
        with server.sdk(token=ADMIN) as sdk:
            sdk.create_topic("t", 1)
            sdk.put_group("g", {"topics": {"t": {"order_by": "key"}}})
        yield server


@pytest.fixture(scope="module")
def client(running: RunningServer) -> Iterator[httpx.Client]:
    with running.client(verify=False) as c:
        yield c


def _unauthorized(response: httpx.Response, invalid_token: bool = False) -> None:
    assert_error(response, 401, "unauthorized")
    challenge = 'Bearer realm="cproxy"' + (', error="invalid_token"' if invalid_token else "")
    assert response.headers["www-authenticate"] == challenge


@pytest.mark.parametrize("name", ROUTES)
def test_no_token_is_401(client: httpx.Client, name: str) -> None:
    route = ROUTES[name]
    _unauthorized(send(client, route, [], json=route.body))


@pytest.mark.parametrize("name", ROUTES)
def test_an_unknown_token_is_401(client: httpx.Client, name: str) -> None:
    route = ROUTES[name]
    _unauthorized(send(client, route, [bearer("wrong-token")], json=route.body), True)


@pytest.mark.parametrize("mix", TWO_HEADERS)
@pytest.mark.parametrize("name", ROUTES)
def test_two_authorization_headers_are_401(client: httpx.Client, name: str, mix: str) -> None:
    route = ROUTES[name]
    response = send(client, route, TWO_HEADERS[mix], json=route.body)
    _unauthorized(response)
    assert "more than one Authorization header" in response.json()["error"]["message"]


@pytest.mark.parametrize("name", WITH_BODY)
def test_two_authorization_headers_are_401_before_the_body_is_read(
    client: httpx.Client, name: str
) -> None:
    headers = [*TWO_HEADERS["unknown-then-admin"], ("Content-Type", "application/json")]
    _unauthorized(send(client, ROUTES[name], headers, content=b"{nope"))


@pytest.mark.parametrize("name", SCOPED)
def test_a_topic_or_group_outside_the_scope_is_403(client: httpx.Client, name: str) -> None:
    route = ROUTES[name]
    assert route.outsider is not None
    assert_error(send(client, route, [bearer(route.outsider)], json=route.body), 403, "forbidden")


@pytest.mark.parametrize("name", WITH_BODY)
def test_a_wrong_media_type_is_415(client: httpx.Client, name: str) -> None:
    route = ROUTES[name]
    headers = [bearer(ADMIN), ("Content-Type", "text/plain")]
    response = send(client, route, headers, content=orjson.dumps(route.body))
    assert_error(response, 415, "unsupported_media_type")


@pytest.mark.parametrize("name", WITH_BODY)
def test_a_body_that_is_not_json_is_400(client: httpx.Client, name: str) -> None:
    headers = [bearer(ADMIN), ("Content-Type", "application/json")]
    assert_error(send(client, ROUTES[name], headers, content=b"{nope"), 400, "invalid_json")


@pytest.mark.parametrize("name", WITH_BODY)
def test_a_body_of_the_wrong_shape_is_422(client: httpx.Client, name: str) -> None:
    response = send(client, ROUTES[name], [bearer(ADMIN)], json=[1, 2])
    assert_error(response, 422, "validation_error")


@pytest.mark.parametrize("name", WITH_BODY)
def test_an_unknown_field_is_422(client: httpx.Client, name: str) -> None:
    route = ROUTES[name]
    assert route.body is not None
    response = send(client, route, [bearer(ADMIN)], json={**route.body, "bogus": 1})
    # A group's settings are an object the engine validates (GroupConfig.from_dict), with
    # its own code for what it refuses; every other body is refused by its type.
    assert_error(response, 422, "invalid_config" if name == "put-group" else "validation_error")


@pytest.mark.parametrize("name", ROUTES)
def test_a_declared_body_over_the_limit_is_413(client: httpx.Client, name: str) -> None:
    route = ROUTES[name]
    headers = [bearer(ADMIN), ("Content-Type", "application/json")]
    response = send(client, route, headers, content=b" " * (LIMIT + 1))
    assert_error(response, 413, "too_large")


@pytest.mark.parametrize("name", WITH_BODY)
def test_a_streamed_body_over_the_limit_is_413(client: httpx.Client, name: str) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: sent chunked
        for _ in range(LIMIT // 512 + 2):
            yield b" " * 512

    headers = [bearer(ADMIN), ("Content-Type", "application/json")]
    response = send(client, ROUTES[name], headers, content=chunks())
    assert "content-length" not in response.request.headers
    assert_error(response, 413, "too_large")


@pytest.mark.parametrize("mix", ["unknown-then-admin", "other-scope-then-admin"])
def test_a_produce_refused_for_two_headers_stores_nothing(
    running: RunningServer, client: httpx.Client, mix: str
) -> None:
    """Issue 27's escalation: the hot route took the last header and stored the message."""
    route = ROUTES["produce"]
    _unauthorized(send(client, route, TWO_HEADERS[mix], json=route.body))
    with running.client(verify=False, headers=[bearer(ADMIN)]) as admin:
        assert [q["next_offset"] for q in queue_stats(admin, "t")] == [0]


def test_the_valid_requests_pass_the_prologue(client: httpx.Client) -> None:
    """The matrix's baseline: without a defect, produce is stored and ack and extend
    answer (nothing else is sent valid: the matrix leaves the data alone)."""
    for name in ("ack", "extend"):
        route = ROUTES[name]
        response = send(client, route, [bearer(ADMIN)], json=route.body)
        assert response.status_code == 200, response.text
        assert response.json()["applied"] == 0
