from __future__ import annotations

from typing import Any

import orjson
import pytest

from cproxy.engine.orderkey import OrderBy, parse_json_path
from cproxy.errors import InvalidOrderBy
from cproxy.model import Record


def msg(body: Any = None, key: str | None = "k", qid: int = 3, raw: bytes | None = None) -> Record:
    return Record("t", qid, 0, key, raw if raw is not None else orjson.dumps(body), None, None, 0)


@pytest.mark.parametrize(
    ("path", "segments"),
    [
        ("$.a", ("a",)),
        ("$.user.id", ("user", "id")),
        ("$.items[0].sku", ("items", 0, "sku")),
        ("$['a.b'].c", ("a.b", "c")),
        ('$["x y"][2]', ("x y", 2)),
        ("$.a[-1]", ("a", -1)),
        ("$.snake_case-and-dash", ("snake_case-and-dash",)),
    ],
)
def test_parse_valid_paths(path: str, segments: tuple[Any, ...]) -> None:
    assert parse_json_path(path) == segments


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("a.b", "must start with '$'"),
        ("$", "whole body"),
        ("$..a", "recursive descent"),
        ("$.a[*]", "unsupported selector"),
        ("$.a[?(@.b)]", "unsupported selector"),
        ("$.", "expected a field name"),
        ("$[", "unsupported selector"),
        ("$a", "unexpected 'a'"),
        ("$." + "a" * 600, "longer than"),
    ],
)
def test_parse_invalid_paths(path: str, fragment: str) -> None:
    with pytest.raises(InvalidOrderBy) as info:
        parse_json_path(path)
    assert fragment in info.value.message


def test_modes() -> None:
    assert OrderBy.parse("qid").extract(msg()) == "3"
    assert OrderBy.parse("key").extract(msg(key="ride-7")) == "ride-7"
    assert OrderBy.parse("key").extract(msg(key=None)) is None
    assert OrderBy.parse("none").extract(msg()) is None
    with pytest.raises(InvalidOrderBy, match="order_by must be"):
        OrderBy.parse("keys")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"user": {"id": "u1"}}, "u1"),
        ({"user": {"id": 7}}, "7"),
        ({"user": {"id": 7.5}}, "7.5"),
        ({"user": {"id": True}}, "true"),
        ({"user": {"id": {"b": 1, "a": 2}}}, '{"a":2,"b":1}'),
        ({"user": {"id": None}}, None),
        ({"user": {}}, None),
        ({"user": "flat"}, None),
        ([1, 2], None),
        ("string body", None),
        (None, None),
    ],
)
def test_json_path_extraction(body: Any, expected: str | None) -> None:
    assert OrderBy.parse("$.user.id").extract(msg(body)) == expected


def test_json_path_indexes() -> None:
    order = OrderBy.parse("$.items[1].sku")
    assert order.extract(msg({"items": [{"sku": "a"}, {"sku": "b"}]})) == "b"
    assert order.extract(msg({"items": [{"sku": "a"}]})) is None
    assert OrderBy.parse("$.items[-1]").extract(msg({"items": [1, 2, 3]})) == "3"


def test_string_and_number_with_same_text_share_a_chain() -> None:
    # docs/guarantees.md: chains are keyed by the value's string form.
    order = OrderBy.parse("$.id")
    assert order.extract(msg({"id": "7"})) == order.extract(msg({"id": 7}))
