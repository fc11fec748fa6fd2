"""Malformed input on every endpoint: always a 4xx with the contract's error body, never a 5xx,
and never a change to stored data (docs/api.md: "Malformed input never yields a 5xx")."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.api.http_helpers import (
    JSON_HEADERS,
    StateWatch,
    assert_error,
    create_topic,
    fresh_client,
    group_stats,
    produce,
    pull_all,
    put_group,
    queue_stats,
    shared_server,
)
from tests.support import RunningServer, wait_until

BIG = 2**64  # one past the largest unsigned 64-bit integer

# -- the table -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    method: str
    path: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    status: int | tuple[int, ...] = 422
    code: str | None = None

    def send(self, client: httpx.Client) -> httpx.Response:
        return client.request(self.method, self.path, **self.kwargs)


def js(
    method: str, path: str, body: Any, status: int | tuple[int, ...] = 422, code: str | None = None
) -> Case:
    """A request whose body is ``body`` encoded as JSON."""
    return Case(method, path, {"json": body}, status, code)


def raw(
    method: str,
    path: str,
    content: bytes | str,
    status: int | tuple[int, ...] = 400,
    code: str | None = "invalid_json",
) -> Case:
    """A request with a literal body labelled application/json."""
    data = content.encode() if isinstance(content, str) else content
    return Case(method, path, {"content": data, "headers": JSON_HEADERS}, status, code)


def bare(
    method: str, path: str, status: int | tuple[int, ...] = 422, code: str | None = None
) -> Case:
    """A request without a body (query parameters go in the path)."""
    return Case(method, path, {}, status, code)


def body_endpoint_cases(name: str, method: str, path: str) -> list[Any]:
    """Cases every endpoint taking a JSON object body must reject."""
    return [
        pytest.param(raw(method, path, '{"a": '), id=f"{name}-truncated-json"),
        pytest.param(raw(method, path, "{'a': 1}"), id=f"{name}-single-quoted-json"),
        pytest.param(raw(method, path, '{"a": 1} trailing'), id=f"{name}-trailing-garbage"),
        pytest.param(raw(method, path, b"\xff\xfe{}"), id=f"{name}-not-utf8"),
        pytest.param(js(method, path, []), id=f"{name}-array-body"),
        pytest.param(js(method, path, "text"), id=f"{name}-string-body"),
        pytest.param(js(method, path, 42), id=f"{name}-number-body"),
        pytest.param(js(method, path, {"no_such_field": 1}), id=f"{name}-unknown-field"),
    ]


def no_body_case(name: str, method: str, path: str) -> Any:
    return pytest.param(
        Case(method, path, {"headers": JSON_HEADERS}, 400, "missing_body"), id=f"{name}-no-body"
    )


G = "/v1/groups/g"
PRODUCE = "/v1/topics/t/messages"
DEEP = "[" * 300 + "]" * 300

TOPIC_CASES = [
    *body_endpoint_cases("topics-post", "POST", "/v1/topics"),
    no_body_case("topics-post", "POST", "/v1/topics"),
    pytest.param(js("POST", "/v1/topics", {"name": 5}), id="topics-post-name-int"),
    pytest.param(
        js("POST", "/v1/topics", {"name": "x", "queues": -1}), id="topics-post-queues-neg"
    ),
    pytest.param(
        js("POST", "/v1/topics", {"name": "x", "queues": BIG}), id="topics-post-queues-big"
    ),
    pytest.param(
        js("POST", "/v1/topics", {"name": "t", "queues": 3}, 409, "topic_conflict"),
        id="topics-post-conflict",
    ),
    pytest.param(bare("GET", "/v1/topics/nope", 404, "topic_not_found"), id="topics-get-unknown"),
    pytest.param(bare("GET", "/v1/topics/%20", 404, "topic_not_found"), id="topics-get-space"),
    pytest.param(bare("PATCH", "/v1/topics", 405, "method_not_allowed"), id="topics-patch"),
    pytest.param(bare("DELETE", "/v1/topics", 405, "method_not_allowed"), id="topics-delete"),
    pytest.param(
        bare("DELETE", "/v1/topics/nope", 404, "topic_not_found"), id="topics-delete-unknown"
    ),
    pytest.param(bare("GET", "/v1/no-such-route", 404, "not_found"), id="unknown-route"),
]

PRODUCE_CASES = [
    *body_endpoint_cases("produce", "POST", PRODUCE),
    no_body_case("produce", "POST", PRODUCE),
    pytest.param(js("POST", PRODUCE, {}), id="produce-messages-missing"),
    pytest.param(js("POST", PRODUCE, {"messages": []}), id="produce-messages-empty"),
    pytest.param(js("POST", PRODUCE, {"messages": {}}), id="produce-messages-object"),
    pytest.param(js("POST", PRODUCE, {"messages": [1]}), id="produce-message-not-object"),
    pytest.param(js("POST", PRODUCE, {"messages": [{"body": 1, "qid": -1}]}), id="produce-qid-neg"),
    pytest.param(
        js("POST", PRODUCE, {"messages": [{"body": 1, "qid": 2}]}), id="produce-qid-out-of-range"
    ),
    pytest.param(
        js("POST", PRODUCE, {"messages": [{"body": 1, "qid": BIG}]}), id="produce-qid-big"
    ),
    pytest.param(
        js("POST", PRODUCE, {"messages": [{"body": 1, "qid": "0"}]}), id="produce-qid-string"
    ),
    pytest.param(js("POST", PRODUCE, {"messages": [{"body": 1, "key": 5}]}), id="produce-key-int"),
    pytest.param(
        js("POST", PRODUCE, {"messages": [{"body": 1, "key": ["a"]}]}), id="produce-key-list"
    ),
    pytest.param(
        js("POST", PRODUCE, {"messages": [{"body": 1, "headers": {"a": 1}}]}),
        id="produce-header-value-int",
    ),
    pytest.param(
        js("POST", PRODUCE, {"messages": [{"body": 1, "headers": ["a"]}]}),
        id="produce-headers-list",
    ),
    pytest.param(
        js("POST", PRODUCE, {"messages": [{"body": 1, "headers": "a=b"}]}),
        id="produce-headers-string",
    ),
    pytest.param(js("POST", PRODUCE, {"messages": [{"body": 1, "id": ""}]}), id="produce-id-empty"),
    pytest.param(js("POST", PRODUCE, {"messages": [{"body": 1, "id": 5}]}), id="produce-id-int"),
    pytest.param(
        js("POST", PRODUCE, {"messages": [{"body": 1, "id": "x" * 513}]}), id="produce-id-too-long"
    ),
    pytest.param(
        js("POST", PRODUCE, {"messages": [{"body": 1, "partition": 0}]}),
        id="produce-message-extra-field",
    ),
    pytest.param(
        js("POST", "/v1/topics/nope/messages", {"messages": [{"body": 1}]}, 404, "topic_not_found"),
        id="produce-unknown-topic",
    ),
    pytest.param(
        Case(
            "POST",
            PRODUCE,
            {"content": b'{"messages": [{"body": 1}]}', "headers": {"content-type": "text/plain"}},
            (400, 415, 422),
        ),
        id="produce-text-plain",
    ),
    # Bodies that are JSON to Python's parser but cannot be stored faithfully. (Integers
    # beyond 64 bits are parsed as floats, as JavaScript does: see docs/operations.md.)
    pytest.param(
        raw("POST", PRODUCE, '{"messages": [{"body": ' + DEEP + "}]}", 422, None),
        id="produce-body-nested-300-deep",
    ),
    pytest.param(
        raw("POST", PRODUCE, r'{"messages": [{"body": "\ud800"}]}', (400, 422), None),
        id="produce-body-lone-surrogate",
    ),
    pytest.param(
        raw("POST", PRODUCE, r'{"messages": [{"body": 1, "key": "\ud800"}]}', (400, 422), None),
        id="produce-key-lone-surrogate",
    ),
    pytest.param(
        raw(
            "POST",
            PRODUCE,
            r'{"messages": [{"body": 1, "qid": 0, "key": "\udfff"}]}',
            (400, 422),
            None,
        ),
        id="produce-key-lone-surrogate-explicit-qid",
    ),
    pytest.param(
        raw(
            "POST",
            PRODUCE,
            r'{"messages": [{"body": 1, "headers": {"h": "\ud800"}}]}',
            (400, 422),
            None,
        ),
        id="produce-header-lone-surrogate",
    ),
    pytest.param(
        raw(
            "POST",
            PRODUCE,
            r'{"messages": [{"body": 1, "headers": {"\ud800": "v"}}]}',
            (400, 422),
            None,
        ),
        id="produce-header-name-lone-surrogate",
    ),
    # NaN and Infinity are not JSON (RFC 8259); accepting them stores null instead.
    pytest.param(
        raw("POST", PRODUCE, '{"messages": [{"body": NaN}]}', (400, 422), None),
        id="produce-body-nan",
    ),
    pytest.param(
        raw("POST", PRODUCE, '{"messages": [{"body": -Infinity}]}', (400, 422), None),
        id="produce-body-infinity",
    ),
]

ORDER_BY_CASES = [
    pytest.param(
        js("PUT", G, {"topics": {"t": {"order_by": spec}}}, 422, "invalid_order_by"),
        id=f"group-put-order-by-{label}",
    )
    for label, spec in [
        ("recursive", "$..a"),
        ("wildcard", "$.a[*]"),
        ("open-bracket", "$["),
        ("no-dollar", "a.b"),
        ("root-only", "$"),
        ("empty", ""),
        ("slice", "$.a[0:2]"),
        ("filter", "$.a[?(@.x)]"),
        ("upper-case-key", "KEY"),
        ("trailing-dot", "$."),
        ("space", "$.a b"),
        ("too-long", "$." + "a" * 600),
    ]
] + [
    pytest.param(
        # A lone surrogate is rejected as JSON before the path is even parsed.
        raw("PUT", G, r'{"topics": {"t": {"order_by": "$[\"\ud800\"]"}}}', 400, "invalid_json"),
        id="group-put-order-by-lone-surrogate",
    ),
]

GROUP_CASES = [
    *body_endpoint_cases("group-put", "PUT", G),
    no_body_case("group-put", "PUT", G),
    pytest.param(js("PUT", G, {}), id="group-put-empty-object"),
    pytest.param(js("PUT", G, {"topics": {}}), id="group-put-no-topics"),
    pytest.param(js("PUT", G, {"topics": ["t"]}), id="group-put-topics-list"),
    pytest.param(js("PUT", G, {"topics": {"t": "key"}}), id="group-put-topic-spec-string"),
    pytest.param(
        js("PUT", G, {"topics": {"t": {"order_by": "key", "x": 1}}}),
        id="group-put-topic-spec-extra",
    ),
    pytest.param(js("PUT", G, {"topics": {"t": {"order_by": 5}}}), id="group-put-order-by-int"),
    pytest.param(
        js("PUT", G, {"topics": {"nope": {"order_by": "key"}}}, 404, "topic_not_found"),
        id="group-put-unknown-topic",
    ),
    *ORDER_BY_CASES,
    *[
        pytest.param(
            js("PUT", G, {"topics": {"t": {"order_by": "qid"}}, setting: value}),
            id=f"group-put-{setting}-{label}",
        )
        for setting, label, value in [
            ("max_attempts", "zero", 0),
            ("max_attempts", "1001", 1001),
            ("max_attempts", "string", "5"),
            ("max_attempts", "bool", True),
            ("max_attempts", "float", 2.0),
            ("max_attempts", "big", BIG),
            ("retry_backoff_ms", "empty", []),
            ("retry_backoff_ms", "negative", [-1]),
            ("retry_backoff_ms", "string", "1000"),
            ("retry_backoff_ms", "float", [1.5]),
            ("retry_backoff_ms", "bool", [True]),
            ("retry_backoff_ms", "too-big", [86_400_001]),
            ("retry_backoff_ms", "101-values", [1] * 101),
            ("ack_timeout_ms", "9", 9),
            ("ack_timeout_ms", "too-big", 43_200_001),
            ("ack_timeout_ms", "null", None),
            ("start", "middle", "middle"),
            ("start", "int", 0),
            ("on_exhausted", "retry", "retry"),
            ("max_buffered", "zero", 0),
            ("max_buffered", "too-big", 10_000_001),
            ("stuck_after_ms", "zero", 0),
            ("stuck_after_ms", "too-big", 86_400_001),
            ("stuck_after_ms", "string", "60000"),
            ("stuck_after_ms", "null", None),
            ("dead_letter_retention_ms", "zero", 0),
            ("dead_letter_retention_ms", "float", 1.5),
            ("dead_letter_retention_ms", "bool", True),
            ("partitions", "extra-field", 3),
        ]
    ],
    pytest.param(
        js("PUT", "/v1/groups/bad%20name", {"topics": {"t": {"order_by": "key"}}}),
        id="group-put-name-space",
    ),
    pytest.param(
        js("PUT", "/v1/groups/" + "x" * 201, {"topics": {"t": {"order_by": "key"}}}),
        id="group-put-name-201-chars",
    ),
    pytest.param(bare("GET", "/v1/groups/nope", 404, "group_not_found"), id="group-get-unknown"),
    pytest.param(
        bare("DELETE", "/v1/groups/nope", 404, "group_not_found"), id="group-delete-unknown"
    ),
]


def _results(*items: dict[str, Any]) -> dict[str, Any]:
    return {"results": list(items)}


def results_cases(name: str, path: str, extra: dict[str, Any]) -> list[Any]:
    """Malformed ``results`` (shared by pull and ack)."""
    bad_results: list[tuple[str, Any]] = [
        ("results-object", {}),
        ("results-missing-qid", [{"topic": "t"}]),
        ("results-missing-topic", [{"qid": 0}]),
        ("results-topic-int", [{"topic": 1, "qid": 0}]),
        ("results-qid-negative", [{"topic": "t", "qid": -1}]),
        ("results-qid-string", [{"topic": "t", "qid": "0"}]),
        ("results-ack-negative", [{"topic": "t", "qid": 0, "acks": [-1]}]),
        ("results-ack-string", [{"topic": "t", "qid": 0, "acks": ["1"]}]),
        ("results-ack-float", [{"topic": "t", "qid": 0, "acks": [1.5]}]),
        ("results-acks-not-list", [{"topic": "t", "qid": 0, "acks": 1}]),
        ("results-fail-negative", [{"topic": "t", "qid": 0, "fails": [{"offset": -1}]}]),
        (
            "results-fail-error-int",
            [{"topic": "t", "qid": 0, "fails": [{"offset": 1, "error": 5}]}],
        ),
        (
            "results-fail-error-too-long",
            [{"topic": "t", "qid": 0, "fails": [{"offset": 1, "error": "e" * 4097}]}],
        ),
        ("results-fail-extra", [{"topic": "t", "qid": 0, "fails": [{"offset": 1, "why": "x"}]}]),
        ("results-extra-field", [{"topic": "t", "qid": 0, "nacks": [1]}]),
    ]
    return [
        pytest.param(js("POST", path, {**extra, "results": value}), id=f"{name}-{label}")
        for label, value in bad_results
    ]


PULL = f"{G}/pull"
PULL_CASES = [
    *body_endpoint_cases("pull", "POST", PULL),
    *[
        pytest.param(js("POST", PULL, {"wait_ms": 0, field_: value}), id=f"pull-{label}")
        for field_, label, value in [
            ("max_messages", "max-messages-0", 0),
            ("max_messages", "max-messages-neg", -1),
            ("max_messages", "max-messages-1001", 1001),
            ("max_messages", "max-messages-big", BIG),
            ("max_messages", "max-messages-string", "5"),
            ("max_messages", "max-messages-float", 2.5),
            ("max_messages", "max-messages-bool", True),
            ("max_messages", "max-messages-null", None),
            ("topics", "topics-string", "t"),
            ("topics", "topics-ints", [1]),
            ("topics", "topics-unknown", ["nope"]),
            ("topics", "topics-unsubscribed", ["empty"]),
        ]
    ],
    *[
        pytest.param(js("POST", PULL, {"wait_ms": value}), id=f"pull-wait-ms-{label}")
        for label, value in [("30001", 30_001), ("neg", -1), ("string", "1"), ("big", BIG)]
    ],
    *results_cases("pull", PULL, {"wait_ms": 0}),
    pytest.param(
        js("POST", "/v1/groups/nope/pull", {"wait_ms": 0}, 404, "group_not_found"),
        id="pull-unknown-group",
    ),
]

ACK = f"{G}/ack"
ACK_CASES = [
    *body_endpoint_cases("ack", "POST", ACK),
    no_body_case("ack", "POST", ACK),
    pytest.param(js("POST", ACK, {}), id="ack-results-missing"),
    *results_cases("ack", ACK, {}),
    pytest.param(
        js("POST", "/v1/groups/nope/ack", _results(), 404, "group_not_found"),
        id="ack-unknown-group",
    ),
]

EXTEND = f"{G}/extend"
REF = {"topic": "t", "qid": 0, "offset": 0}
EXTEND_CASES = [
    *body_endpoint_cases("extend", "POST", EXTEND),
    no_body_case("extend", "POST", EXTEND),
    pytest.param(js("POST", EXTEND, {}), id="extend-messages-missing"),
    pytest.param(js("POST", EXTEND, {"messages": []}), id="extend-messages-empty"),
    pytest.param(
        js("POST", EXTEND, {"messages": [{"topic": "t", "qid": 0}]}), id="extend-offset-missing"
    ),
    pytest.param(js("POST", EXTEND, {"messages": [{**REF, "offset": -1}]}), id="extend-offset-neg"),
    pytest.param(js("POST", EXTEND, {"messages": [{**REF, "x": 1}]}), id="extend-ref-extra"),
    pytest.param(
        js("POST", EXTEND, {"messages": [REF], "ack_timeout_ms": 9}), id="extend-timeout-9"
    ),
    pytest.param(
        js("POST", EXTEND, {"messages": [REF], "ack_timeout_ms": 43_200_001}),
        id="extend-timeout-too-big",
    ),
    pytest.param(
        js("POST", EXTEND, {"messages": [REF], "ack_timeout_ms": "100"}), id="extend-timeout-string"
    ),
    pytest.param(
        js("POST", "/v1/groups/nope/extend", {"messages": [REF]}, 404, "group_not_found"),
        id="extend-unknown-group",
    ),
]

SEEK = f"{G}/seek"
SEEK_CASES = [
    *body_endpoint_cases("seek", "POST", SEEK),
    no_body_case("seek", "POST", SEEK),
    pytest.param(js("POST", SEEK, {}), id="seek-empty-object"),
    pytest.param(js("POST", SEEK, {"topic": "t"}), id="seek-to-missing"),
    pytest.param(js("POST", SEEK, {"to": "earliest"}), id="seek-topic-missing"),
    *[
        pytest.param(js("POST", SEEK, {"topic": "t", "to": to}), id=f"seek-to-{label}")
        for label, to in [
            ("negative", -1),
            ("middle", "middle"),
            ("float", 1.5),
            ("null", None),
            ("bool", True),
            ("timestamp-negative", {"timestamp_ms": -1}),
            ("timestamp-string", {"timestamp_ms": "0"}),
            ("other-object", {"ts": 1}),
            ("list", [0]),
        ]
    ],
    pytest.param(js("POST", SEEK, {"topic": "t", "qid": -1, "to": "earliest"}), id="seek-qid-neg"),
    pytest.param(
        js("POST", SEEK, {"topic": "t", "qid": "0", "to": "earliest"}), id="seek-qid-string"
    ),
    pytest.param(
        js("POST", SEEK, {"topic": "t", "qid": 2, "to": "earliest"}), id="seek-qid-out-of-range"
    ),
    pytest.param(
        js("POST", SEEK, {"topic": "nope", "to": "earliest"}, (404, 422)), id="seek-unknown-topic"
    ),
    pytest.param(
        js("POST", SEEK, {"topic": "empty", "to": "earliest"}), id="seek-unsubscribed-topic"
    ),
    pytest.param(js("POST", SEEK, {"topic": "t", "to": "earliest", "x": 1}), id="seek-extra"),
    pytest.param(
        js(
            "POST", "/v1/groups/nope/seek", {"topic": "t", "to": "earliest"}, 404, "group_not_found"
        ),
        id="seek-unknown-group",
    ),
]

QUERY_CASES = [
    *[
        pytest.param(
            bare("GET", f"{G}/dead-letters?limit={value}"), id=f"dead-letters-limit-{value}"
        )
        for value in ["0", "-1", "abc", "10001", "1.5", ""]
    ],
    pytest.param(
        bare("GET", "/v1/groups/nope/dead-letters", 404, "group_not_found"),
        id="dead-letters-unknown-group",
    ),
    *[
        pytest.param(bare("GET", f"{G}/blocked-keys?{query}"), id=f"blocked-keys-{query}")
        for query in [
            "min_blocked_ms=-1",
            "min_blocked_ms=abc",
            "limit=0",
            "limit=100001",
            "limit=abc",
        ]
    ],
    pytest.param(
        bare("GET", "/v1/groups/nope/blocked-keys", 404, "group_not_found"),
        id="blocked-keys-unknown-group",
    ),
]

BROWSE_CASES = [
    *[
        pytest.param(bare("GET", f"{PRODUCE}?{query}"), id=f"browse-{query}")
        for query in [
            "qid=-1",
            "qid=abc",
            "from=-1",
            "from=abc",
            "from_ms=-1",
            "limit=0",
            "limit=1001",
            "last=0",
            "last=1001",
        ]
    ],
    pytest.param(
        bare("GET", f"{PRODUCE}?qid=0&from=1&last=5", 422, "invalid_request"),
        id="browse-two-starts",
    ),
    pytest.param(bare("GET", f"{PRODUCE}?qid=99", 422, "invalid_request"), id="browse-qid-outside"),
    pytest.param(
        bare("GET", "/v1/topics/nope/messages", 404, "topic_not_found"), id="browse-unknown-topic"
    ),
]

DEAD = f"{G}/dead-letters"
DELETE_DEAD_CASES = [
    *body_endpoint_cases("dead-delete", "DELETE", DEAD),
    pytest.param(bare("DELETE", DEAD, 422, "invalid_request"), id="dead-delete-nothing-named"),
    pytest.param(js("DELETE", DEAD, {"messages": []}), id="dead-delete-empty"),
    pytest.param(
        js("DELETE", DEAD, {"messages": [{"topic": "t", "qid": -1, "offset": 0}]}),
        id="dead-delete-qid-neg",
    ),
    pytest.param(
        js("DELETE", f"{DEAD}?topic=t", {"messages": [{"topic": "t", "qid": 0, "offset": 0}]}),
        id="dead-delete-both",
    ),
    pytest.param(
        bare("DELETE", "/v1/groups/nope/dead-letters?topic=t", 404, "group_not_found"),
        id="dead-delete-unknown-group",
    ),
]

REDRIVE = f"{G}/dead-letters/redrive"
REDRIVE_CASES = [
    *body_endpoint_cases("redrive", "POST", REDRIVE),
    pytest.param(js("POST", REDRIVE, {"topic": 5}), id="redrive-topic-int"),
    pytest.param(js("POST", REDRIVE, {"messages": [{"topic": "t"}]}), id="redrive-ref-partial"),
    pytest.param(
        js("POST", "/v1/groups/nope/dead-letters/redrive", {}, 404, "group_not_found"),
        id="redrive-unknown-group",
    ),
]


def blocked_key_action_cases(action: str) -> list[Any]:
    path = f"{G}/blocked-keys/{action}"
    return [
        *body_endpoint_cases(action, "POST", path),
        no_body_case(action, "POST", path),
        pytest.param(js("POST", path, {}), id=f"{action}-empty-object"),
        pytest.param(js("POST", path, {"topic": 5, "order_value": "0"}), id=f"{action}-topic-int"),
        pytest.param(
            js("POST", path, {"topic": "t"}, 422, "invalid_request"), id=f"{action}-no-target"
        ),
        pytest.param(
            js("POST", path, {"topic": "t", "qid": 0}, 422, "invalid_request"),
            id=f"{action}-qid-without-offset",
        ),
        pytest.param(
            js("POST", path, {"topic": "t", "order_value": 5}), id=f"{action}-order-value-int"
        ),
        pytest.param(
            js("POST", path, {"topic": "t", "qid": -1, "offset": 0}), id=f"{action}-qid-neg"
        ),
        pytest.param(
            js("POST", path, {"topic": "t", "order_value": "nope"}, 404, "blocked_key_not_found"),
            id=f"{action}-unknown-order-value",
        ),
        pytest.param(
            js("POST", path, {"topic": "t", "qid": 0, "offset": 999}, 404, "blocked_key_not_found"),
            id=f"{action}-unknown-offset",
        ),
        # With order_by "qid", queue 0's chain has a head that is ready, not blocked.
        pytest.param(
            js("POST", path, {"topic": "t", "order_value": "0"}, 409, "not_blocked"),
            id=f"{action}-head-not-blocked",
        ),
        pytest.param(
            js(
                "POST",
                f"/v1/groups/nope/blocked-keys/{action}",
                {"topic": "t", "order_value": "0"},
                404,
                "group_not_found",
            ),
            id=f"{action}-unknown-group",
        ),
    ]


ALL_CASES = [
    *TOPIC_CASES,
    *PRODUCE_CASES,
    *GROUP_CASES,
    *PULL_CASES,
    *ACK_CASES,
    *EXTEND_CASES,
    *SEEK_CASES,
    *QUERY_CASES,
    *BROWSE_CASES,
    *DELETE_DEAD_CASES,
    *REDRIVE_CASES,
    *blocked_key_action_cases("skip"),
    *blocked_key_action_cases("release"),
]

# -- the data the table must not disturb ---------------------------------------------------------

MESSAGES = [{"qid": q, "key": f"k{q}", "body": {"q": q, "n": n}} for n in range(3) for q in (0, 1)]


def seed(client: httpx.Client) -> None:
    """Topic t (2 queues, 6 messages), empty topic, group g (order_by qid), idle group."""
    create_topic(client, "t", 2)
    create_topic(client, "empty", 1)
    put_group(client, "g", {"t": "qid"}, max_attempts=3, retry_backoff_ms=[100, 200])
    put_group(client, "idle", {"empty": "key"})
    produce(client, "t", MESSAGES)
    # Everything is read into the group: both chain heads ready, the rest waiting.
    wait_until(
        lambda: (s := group_stats(client, "g"))["ready"] == 2 and s["waiting"] == 4,
        message="group g to read all messages",
    )


def state(client: httpx.Client, full: bool = False) -> dict[str, Any]:
    """What a rejected request must not change (``full`` adds the rarely touched parts)."""
    names = ("g", "idle") if full else ("g",)
    snapshot: dict[str, Any] = {"t": queue_stats(client, "t")}
    for name in names:
        described = client.get(f"/v1/groups/{name}").json()
        stats = described.pop("stats")
        snapshot[name] = described
        snapshot[f"{name}.stats"] = {
            k: stats[k]
            for k in (
                "queues",
                "ready",
                "in_flight",
                "waiting",
                "retrying",
                "dead_lettered",
                "blocked_keys",
            )
        }
    if full:
        snapshot["empty"] = queue_stats(client, "empty")
        snapshot["topics"] = client.get("/v1/topics").json()
        snapshot["groups"] = client.get("/v1/groups").json()
    return snapshot


@dataclass
class World:
    server: RunningServer
    observer: httpx.Client
    watch: StateWatch


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with shared_server(tmp_path_factory) as running, fresh_client(running) as client:
        seed(client)
        yield World(running, client, StateWatch(lambda: state(client)))


# -- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ALL_CASES)
def test_malformed_request_is_a_4xx_with_error_body(world: World, case: Case) -> None:
    # A fresh connection per case: a 5xx may leave a shared connection closed.
    with fresh_client(world.server) as client:
        response = case.send(client)
    try:
        assert_error(response, case.status, case.code)
    finally:
        world.watch.assert_unchanged()


def test_stored_data_intact_after_the_whole_table(server: RunningServer) -> None:
    """Replay every case on a fresh server, then check nothing moved and delivery still works."""
    with fresh_client(server) as client:
        seed(client)
        before = state(client, full=True)
    accepted = []  # cases answered 2xx: the likely culprits if data changed
    for param in ALL_CASES:
        case: Case = param.values[0]
        with fresh_client(server) as client:
            if case.send(client).status_code < 300:
                accepted.append(param.id)
    with fresh_client(server) as client:
        assert state(client, full=True) == before, f"changed; cases answered 2xx: {accepted}"
        got = pull_all(client, "g", len(MESSAGES))
        for qid in (0, 1):
            mine = [m for m in got if m["qid"] == qid]
            assert [m["offset"] for m in mine] == [0, 1, 2]
            assert [m["body"] for m in mine] == [{"q": qid, "n": n} for n in range(3)]
            assert all(m["attempt"] == 1 and m["key"] == f"k{qid}" for m in mine)
        assert client.post("/v1/groups/g/pull", json={"wait_ms": 100}).json()["messages"] == []


@pytest.mark.parametrize(
    ("path", "body", "unknown"),
    [
        pytest.param(
            f"{G}/ack",
            _results(
                {"topic": "t", "qid": 0, "acks": [999, 0], "fails": [998]},
                {"topic": "t", "qid": 1, "fails": [{"offset": 1, "error": "boom"}]},
            ),
            [("t", 0, 999), ("t", 0, 0), ("t", 0, 998), ("t", 1, 1)],
            id="ack-never-delivered-and-beyond-end",
        ),
        pytest.param(
            f"{G}/ack",
            _results(
                {"topic": "nope", "qid": 0, "acks": [0]},
                {"topic": "t", "qid": 7, "acks": [0]},
                {"topic": "t", "qid": 0, "acks": [2**63 - 1]},
            ),
            [("nope", 0, 0), ("t", 7, 0), ("t", 0, 2**63 - 1)],
            id="ack-unknown-topic-qid-and-max-offset",
        ),
        pytest.param(
            "/v1/groups/idle/pull",
            {
                "wait_ms": 0,
                **_results(
                    {"topic": "empty", "qid": 0, "acks": [0, 1], "fails": [2]},
                    {"topic": "t", "qid": 1, "acks": [3]},
                ),
            },
            [("empty", 0, 0), ("empty", 0, 1), ("empty", 0, 2), ("t", 1, 3)],
            id="pull-results",
        ),
        pytest.param(
            f"{G}/extend",
            {
                "messages": [
                    {"topic": "t", "qid": 0, "offset": 0},
                    {"topic": "nope", "qid": 9, "offset": 9},
                ]
            },
            [("t", 0, 0), ("nope", 9, 9)],
            id="extend",
        ),
    ],
)
def test_results_for_unknown_offsets_are_listed(
    world: World, path: str, body: dict[str, Any], unknown: list[tuple[str, int, int]]
) -> None:
    before = state(world.observer, full=True)
    with fresh_client(world.server) as client:
        response = client.post(path, json=body)
        assert response.status_code == 200, response.text
        data = response.json()
        outcome = data["results"] if path.endswith("/pull") else data
        if path.endswith("/pull"):
            assert data["messages"] == []
        assert outcome["applied"] == 0
        got = [(u["topic"], u["qid"], u["offset"]) for u in outcome["unknown"]]
        assert sorted(got) == sorted(unknown)
    after = state(world.observer, full=True)
    world.watch.assert_unchanged()
    assert after == before, "the request changed stored data"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param(
            f"{G}/ack", _results({"topic": "t", "qid": 0, "acks": [BIG]}), id="ack-offset"
        ),
        pytest.param(f"{G}/ack", _results({"topic": "t", "qid": BIG, "acks": [0]}), id="ack-qid"),
        pytest.param(
            f"{G}/ack", _results({"topic": "t", "qid": 0, "fails": [BIG]}), id="fail-offset"
        ),
        pytest.param(
            "/v1/groups/idle/pull",
            {"wait_ms": 0, **_results({"topic": "empty", "qid": 0, "acks": [BIG]})},
            id="pull-result-offset",
        ),
        pytest.param(
            f"{G}/extend",
            {"messages": [{"topic": "t", "qid": 0, "offset": BIG}]},
            id="extend-offset",
        ),
        pytest.param(
            f"{G}/extend", {"messages": [{"topic": "t", "qid": BIG, "offset": 0}]}, id="extend-qid"
        ),
    ],
)
def test_offsets_beyond_64_bits_are_rejected_or_unknown(
    world: World, path: str, body: dict[str, Any]
) -> None:
    """Either a 422 or a 200 listing them as unknown is fine; a 5xx is not."""
    before = state(world.observer, full=True)
    with fresh_client(world.server) as client:
        response = client.post(path, json=body)
        if response.status_code == 200:
            data = response.json()
            outcome = data["results"] if path.endswith("/pull") else data
            assert outcome["applied"] == 0 and len(outcome["unknown"]) == 1
        else:
            assert_error(response, 422)
    after = state(world.observer, full=True)
    world.watch.assert_unchanged()
    assert after == before, "the request changed stored data"
