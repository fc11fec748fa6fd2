"""Every endpoint with every kind of token (docs/auth.md): the status of each (token, call) is
the one in ``TABLE``; a list never shows what a GET of the item refuses; and no response to a
token whose topic scope leaves out topic ``b`` carries anything produced into ``b``.

The fixture builds the case a new user tripped over: group ``g`` used to read ``b`` and kept a
dead letter of it after it was changed to read only ``a``; group ``h`` reads ``a`` and ``b`` and
has a head of ``b`` in flight (a blocked key whose order value is the marker too).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cproxy.tokens import Token
from tests.api.http_helpers import assert_error, fresh_client, group_stats, shared_server
from tests.support import RunningServer, wait_until

#: Produced into topic b as key, body and header value: it must never reach an a-only token.
MARKER = "zebra-7f3c-only-in-b"

TOKENS: dict[str, Token] = {
    "admin": Token("m-admin-000", "admin", name="admin"),
    "prod": Token("m-prod-0000", "producer", name="prod"),
    "prod_a": Token("m-prod-a-00", "producer", topics=frozenset({"a"}), name="prod_a"),
    "cons": Token("m-cons-0000", "consumer", name="cons"),
    "cons_a": Token("m-cons-a-00", "consumer", topics=frozenset({"a"}), name="cons_a"),
    "cons_g": Token("m-cons-g-00", "consumer", groups=frozenset({"g"}), name="cons_g"),
    "cons_ag": Token(
        "m-cons-ag-0", "consumer", topics=frozenset({"a"}), groups=frozenset({"g"}), name="cons_ag"
    ),
    # A pipeline worker: consumes group g and produces, within topic a (several roles).
    "pipe_ag": Token(
        "m-pipe-ag-0",
        "consumer",
        topics=frozenset({"a"}),
        groups=frozenset({"g"}),
        name="pipe_ag",
        roles=frozenset({"consumer", "producer"}),
    ),
}
#: Tokens whose topic scope leaves out b: nothing of b may come back to them.
WITHOUT_B = ("prod_a", "cons_a", "cons_ag", "pipe_ag")

G_CONFIG = {"topics": {"a": {"order_by": "key"}}, "max_attempts": 1}
H_CONFIG = {
    "topics": {"a": {"order_by": "key"}, "b": {"order_by": "key"}},
    "ack_timeout_ms": 600_000,
    "stuck_after_ms": 1,  # the head in flight is a blocked key at once
}
NOPE = {"order_value": "no-such-key"}
UNKNOWN_REF = {"topic": "a", "qid": 0, "offset": 999_999}
UNKNOWN_REF_B = {"topic": "b", "qid": 0, "offset": 999_999}
UNKNOWN_ACK = {"topic": "a", "qid": 0, "acks": [999_999]}
#: An ack with outputs naming no current delivery: refused (409 stale_results), stores nothing.
STALE_FENCED = {"topic": "a", "qid": 0, "acks": [{"offset": 999_999, "attempt": 1}]}


def _with_outputs(topic: str) -> dict[str, Any]:
    return {"results": [STALE_FENCED], "produce": [{"topic": topic, "messages": [{"body": 1}]}]}


def _calls() -> dict[str, tuple[str, str, Any]]:
    calls: dict[str, tuple[str, str, Any]] = {
        "topics-list": ("GET", "/v1/topics", None),
        "topic-create-a": ("POST", "/v1/topics", {"name": "a", "queues": 1}),
        "topic-create-b": ("POST", "/v1/topics", {"name": "b", "queues": 1}),
        "topic-get-a": ("GET", "/v1/topics/a", None),
        "topic-get-b": ("GET", "/v1/topics/b", None),
        # An empty PATCH changes nothing; b is read by h, so its delete is refused (409).
        "topic-patch-a": ("PATCH", "/v1/topics/a", {}),
        "topic-patch-b": ("PATCH", "/v1/topics/b", {}),
        "topic-delete-b": ("DELETE", "/v1/topics/b", None),
        "topic-delete-zz": ("DELETE", "/v1/topics/zz", None),
        "produce-a": ("POST", "/v1/topics/a/messages", {"messages": [{"body": "filler"}]}),
        "produce-b": ("POST", "/v1/topics/b/messages", {"messages": [{"body": "filler"}]}),
        "browse-a": ("GET", "/v1/topics/a/messages?last=5", None),
        "browse-b": ("GET", "/v1/topics/b/messages?from=0", None),
        "groups-list": ("GET", "/v1/groups", None),
        "group-delete-zz": ("DELETE", "/v1/groups/zz", None),
        "group-get-zz": ("GET", "/v1/groups/zz", None),
        "group-put-g": ("PUT", "/v1/groups/g", G_CONFIG),
        "group-put-h": ("PUT", "/v1/groups/h", H_CONFIG),
    }
    for group in ("g", "h"):
        base = f"/v1/groups/{group}"
        calls |= {
            f"{group}-get": ("GET", base, None),
            f"{group}-pull": ("POST", f"{base}/pull", {"wait_ms": 0, "max_messages": 100}),
            f"{group}-pull-b": ("POST", f"{base}/pull", {"wait_ms": 0, "topics": ["b"]}),
            f"{group}-ack": ("POST", f"{base}/ack", {"results": [UNKNOWN_ACK]}),
            f"{group}-ack-out-a": ("POST", f"{base}/ack", _with_outputs("a")),
            f"{group}-ack-out-b": ("POST", f"{base}/ack", _with_outputs("b")),
            f"{group}-extend": ("POST", f"{base}/extend", {"messages": [UNKNOWN_REF]}),
            f"{group}-seek-a": ("POST", f"{base}/seek", {"topic": "a", "to": "latest"}),
            f"{group}-seek-b": ("POST", f"{base}/seek", {"topic": "b", "to": "latest"}),
            f"{group}-dead-letters": ("GET", f"{base}/dead-letters", None),
            f"{group}-dead-letters-b": ("GET", f"{base}/dead-letters?topic=b", None),
            f"{group}-redrive-a": ("POST", f"{base}/dead-letters/redrive", {"topic": "a"}),
            f"{group}-redrive-b": ("POST", f"{base}/dead-letters/redrive", {"topic": "b"}),
            f"{group}-redrive-one-b": (
                "POST",
                f"{base}/dead-letters/redrive",
                {"messages": [UNKNOWN_REF_B]},
            ),
            f"{group}-delete-dead-a": (
                "DELETE",
                f"{base}/dead-letters",
                {"messages": [UNKNOWN_REF]},
            ),
            f"{group}-delete-dead-b": (
                "DELETE",
                f"{base}/dead-letters",
                {"messages": [UNKNOWN_REF_B]},
            ),
            f"{group}-blocked-keys": ("GET", f"{base}/blocked-keys", None),
            f"{group}-blocked-keys-b": ("GET", f"{base}/blocked-keys?topic=b", None),
            f"{group}-skip-a": ("POST", f"{base}/blocked-keys/skip", {"topic": "a", **NOPE}),
            f"{group}-skip-b": ("POST", f"{base}/blocked-keys/skip", {"topic": "b", **NOPE}),
            f"{group}-release-b": ("POST", f"{base}/blocked-keys/release", {"topic": "b", **NOPE}),
        }
    return calls


CALLS = _calls()

# Expected status per call (rows) and token (columns); "none" sends no Authorization header,
# "bad" an unknown token. The calls leave the fixture's story intact: creates are idempotent,
# puts repeat the config, unknown names and refs change nothing, skip/release name no key.
TABLE = """
call                 none bad admin prod prod_a cons cons_a cons_g cons_ag pipe_ag
topics-list          401  401 200   200  200    200  200    200    200     200
topic-create-a       401  401 200   200  200    403  403    403    403     200
topic-create-b       401  401 200   200  403    403  403    403    403     403
topic-get-a          401  401 200   200  200    200  200    200    200     200
topic-get-b          401  401 200   200  403    200  403    200    403     403
topic-patch-a        401  401 200   200  200    403  403    403    403     200
topic-patch-b        401  401 200   200  403    403  403    403    403     403
topic-delete-b       401  401 409   403  403    403  403    403    403     403
topic-delete-zz      401  401 404   403  403    403  403    403    403     403
produce-a            401  401 200   200  200    403  403    403    403     200
produce-b            401  401 200   200  403    403  403    403    403     403
browse-a             401  401 200   200  200    200  200    200    200     200
browse-b             401  401 200   200  403    200  403    200    403     403
groups-list          401  401 200   200  200    200  200    200    200     200
group-delete-zz      401  401 404   403  403    403  403    403    403     403
group-get-zz         401  401 404   403  403    404  404    403    403     403
group-put-g          401  401 200   403  403    200  200    200    200     200
group-put-h          401  401 200   403  403    200  403    403    403     403
g-get                401  401 200   403  403    200  200    200    200     200
g-pull               401  401 200   403  403    200  200    200    200     200
g-pull-b             401  401 422   403  403    422  403    422    403     403
g-ack                401  401 200   403  403    200  200    200    200     200
g-ack-out-a          401  401 409   403  403    403  403    403    403     409
g-ack-out-b          401  401 409   403  403    403  403    403    403     403
g-extend             401  401 200   403  403    200  200    200    200     200
g-seek-a             401  401 200   403  403    200  200    200    200     200
g-seek-b             401  401 422   403  403    422  403    422    403     403
g-dead-letters       401  401 200   403  403    200  200    200    200     200
g-dead-letters-b     401  401 200   403  403    200  403    200    403     403
g-redrive-a          401  401 200   403  403    200  200    200    200     200
g-redrive-b          401  401 200   403  403    200  403    200    403     403
g-redrive-one-b      401  401 200   403  403    200  403    200    403     403
g-delete-dead-a      401  401 200   403  403    200  200    200    200     200
g-delete-dead-b      401  401 200   403  403    200  403    200    403     403
g-blocked-keys       401  401 200   403  403    200  200    200    200     200
g-blocked-keys-b     401  401 200   403  403    200  403    200    403     403
g-skip-a             401  401 404   403  403    404  404    404    404     404
g-skip-b             401  401 404   403  403    404  403    404    403     403
g-release-b          401  401 404   403  403    404  403    404    403     403
h-get                401  401 200   403  403    200  403    403    403     403
h-pull               401  401 200   403  403    200  403    403    403     403
h-pull-b             401  401 200   403  403    200  403    403    403     403
h-ack                401  401 200   403  403    200  403    403    403     403
h-ack-out-a          401  401 409   403  403    403  403    403    403     403
h-ack-out-b          401  401 409   403  403    403  403    403    403     403
h-extend             401  401 200   403  403    200  403    403    403     403
h-seek-a             401  401 200   403  403    200  403    403    403     403
h-seek-b             401  401 200   403  403    200  403    403    403     403
h-dead-letters       401  401 200   403  403    200  403    403    403     403
h-dead-letters-b     401  401 200   403  403    200  403    403    403     403
h-redrive-a          401  401 200   403  403    200  403    403    403     403
h-redrive-b          401  401 200   403  403    200  403    403    403     403
h-redrive-one-b      401  401 200   403  403    200  403    403    403     403
h-delete-dead-a      401  401 200   403  403    200  403    403    403     403
h-delete-dead-b      401  401 200   403  403    200  403    403    403     403
h-blocked-keys       401  401 200   403  403    200  403    403    403     403
h-blocked-keys-b     401  401 200   403  403    200  403    403    403     403
h-skip-a             401  401 404   403  403    404  403    403    403     403
h-skip-b             401  401 404   403  403    404  403    403    403     403
h-release-b          401  401 404   403  403    404  403    403    403     403
"""


def _parse(table: str) -> dict[tuple[str, str], int]:
    header, *rows = [line.split() for line in table.strip().splitlines()]
    expected: dict[tuple[str, str], int] = {}
    for row in rows:
        assert len(row) == len(header), row
        for who, status in zip(header[1:], row[1:], strict=True):
            expected[(row[0], who)] = int(status)
    return expected


EXPECTED = _parse(TABLE)
WHO = ["none", "bad", *TOKENS]
# The table covers every call and every token, no more.
assert {c for c, _ in EXPECTED} == set(CALLS)
assert {w for _, w in EXPECTED} == set(WHO)


def client_for(server: RunningServer, who: str) -> httpx.Client:
    client = fresh_client(server)
    if who == "bad":
        client.headers["authorization"] = "Bearer not-a-configured-token"
    elif who != "none":
        client.headers["authorization"] = f"Bearer {TOKENS[who].token}"
    return client


def _ok(response: httpx.Response) -> Any:
    assert response.status_code in (200, 201), response.text
    return response.json()


def build_story(admin: httpx.Client) -> None:
    """Topics a, b; g read b, dead-lettered the marker, now reads a (plus a dead letter of a);
    h reads a and b with the marker's head in flight."""
    for name in ("a", "b"):
        _ok(admin.post("/v1/topics", json={"name": name, "queues": 1}))
    _ok(admin.put("/v1/groups/g", json={"topics": {"b": {"order_by": "key"}}, "max_attempts": 1}))
    _ok(admin.put("/v1/groups/h", json=H_CONFIG))
    marker = {"key": MARKER, "body": {"secret": MARKER}, "headers": {"x": MARKER}}
    _ok(admin.post("/v1/topics/b/messages", json={"messages": [marker]}))
    _fail_one(admin, "g", "b")
    _ok(admin.put("/v1/groups/g", json=G_CONFIG))
    _ok(admin.post("/v1/topics/a/messages", json={"messages": [{"key": "ka", "body": "in-a"}]}))
    _fail_one(admin, "g", "a")
    held = _ok(admin.post("/v1/groups/h/pull", json={"wait_ms": 5000, "topics": ["b"]}))
    assert [m["key"] for m in held["messages"]] == [MARKER]
    # The story holds: g's dead letters include the marker, h's blocked keys too.
    wait_until(lambda: group_stats(admin, "g")["dead_lettered"] == 2, message="2 dead letters")
    dead = _ok(admin.get("/v1/groups/g/dead-letters"))["dead_letters"]
    assert [(d["topic"], d["key"]) for d in dead] == [("a", "ka"), ("b", MARKER)]
    blocked = _ok(admin.get("/v1/groups/h/blocked-keys"))["blocked_keys"]
    assert [(b["topic"], b["order_value"]) for b in blocked] == [("b", MARKER)]


def _fail_one(admin: httpx.Client, group: str, topic: str) -> None:
    """Pull one message of ``topic`` and fail it (max_attempts 1: it is dead-lettered)."""
    pulled = _ok(admin.post(f"/v1/groups/{group}/pull", json={"wait_ms": 5000, "topics": [topic]}))
    [m] = pulled["messages"]
    results = [{"topic": topic, "qid": m["qid"], "fails": [m["offset"]]}]
    assert _ok(admin.post(f"/v1/groups/{group}/ack", json={"results": results}))["applied"] == 1


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tokens = tuple(TOKENS.values())
    with shared_server(tmp_path_factory, tokens=tokens) as running:
        with client_for(running, "admin") as admin:
            build_story(admin)
        yield running


def send(client: httpx.Client, call: str) -> httpx.Response:
    method, path, body = CALLS[call]
    return client.request(method, path, json=body)


@pytest.mark.parametrize("who", WHO)
def test_every_call_answers_as_the_table_says(story: RunningServer, who: str) -> None:
    """All calls of one token in one test; every mismatch is reported, not only the first."""
    if who in WITHOUT_B:
        with client_for(story, "admin") as admin:
            kept = _ok(admin.get("/v1/groups/g/dead-letters?topic=b"))["dead_letters"]
            assert [d["key"] for d in kept] == [MARKER], "g's dead letter of b is there to leak"
    wrong = []
    with client_for(story, who) as client:
        for call in CALLS:
            response = send(client, call)
            if response.status_code != EXPECTED[(call, who)]:
                wrong.append(f"{call}: {response.status_code} {response.text[:200]}")
            elif response.status_code >= 400:
                assert_error(response, EXPECTED[(call, who)])
            if who in WITHOUT_B:
                assert MARKER not in response.text, f"{who} {call} leaked topic b: {response.text}"
    assert not wrong, f"token {who}: " + "; ".join(wrong)


@pytest.mark.parametrize("who", ["none", "bad"])
def test_401_carries_a_bearer_challenge(story: RunningServer, who: str) -> None:
    """RFC 6750: a 401 names the scheme and realm; an unknown token adds invalid_token."""
    expected = 'Bearer realm="cproxy"'
    if who == "bad":
        expected += ', error="invalid_token"'
    with client_for(story, who) as client:
        for call in ("topics-list", "produce-a", "g-pull", "g-dead-letters"):
            response = send(client, call)
            assert_error(response, 401, "unauthorized")
            assert response.headers.get("www-authenticate") == expected, call


def test_403_and_200_carry_no_challenge(story: RunningServer) -> None:
    with client_for(story, "cons_a") as client:
        for call in ("h-get", "g-get"):
            assert "www-authenticate" not in send(client, call).headers


@pytest.mark.parametrize("who", list(TOKENS))
def test_a_list_shows_exactly_what_a_get_allows(story: RunningServer, who: str) -> None:
    with client_for(story, who) as client:
        listed_groups = {g["name"] for g in _ok(client.get("/v1/groups"))["groups"]}
        gettable = {g for g in ("g", "h") if client.get(f"/v1/groups/{g}").status_code == 200}
        assert listed_groups == gettable
        listed_topics = {t["name"] for t in _ok(client.get("/v1/topics"))["topics"]}
        readable = {t for t in ("a", "b") if client.get(f"/v1/topics/{t}").status_code == 200}
        assert listed_topics == readable
        # The topics shown next to a listed group are all readable by the same token.
        for group in _ok(client.get("/v1/groups"))["groups"]:
            assert set(group["topics"]) <= readable, group
    if who.startswith("prod"):
        assert listed_groups == set(), "producers cannot use groups, so they see none"


def test_dead_letters_follow_their_own_topic(story: RunningServer) -> None:
    """The reported leak: g reads only a now, its dead letter of b stays, and the a-scoped
    token may use g, but gets only g's dead letters of a."""
    with client_for(story, "admin") as admin, client_for(story, "cons_a") as cons_a:
        # Redrive nothing on the way: read first (other tests may have redriven a's letter).
        all_dead = _ok(admin.get("/v1/groups/g/dead-letters"))["dead_letters"]
        assert ("b", MARKER) in [(d["topic"], d["key"]) for d in all_dead]
        mine = _ok(cons_a.get("/v1/groups/g/dead-letters"))["dead_letters"]
        assert [d for d in all_dead if d["topic"] == "a"] == mine
        assert_error(cons_a.get("/v1/groups/g/dead-letters?topic=b"), 403, "forbidden")
        # A redrive by the a-scoped token leaves b's dead letter where it is; one by the admin
        # cannot deliver it (g no longer reads b), so it stays listed as a dead letter.
        for who, body in ((cons_a, {}), (admin, {}), (admin, {"topic": "b"})):
            _ok(who.post("/v1/groups/g/dead-letters/redrive", json=body))
            after = _ok(admin.get("/v1/groups/g/dead-letters?topic=b"))["dead_letters"]
            assert [d["key"] for d in after] == [MARKER]
