"""Per-group filter and transform (JMESPath), at the engine level."""

from __future__ import annotations

import orjson
import pytest

from cproxy.engine.group_config import GroupConfig
from cproxy.errors import ConfigError
from tests.engine.harness import Harness, keys, offsets


def _harness(**entry: object) -> Harness:
    return Harness(topics={"t": {"order_by": "key", **entry}}, max_attempts=1)


def test_a_filter_finishes_the_messages_it_rejects_without_delivery() -> None:
    h = _harness(filter="body.kind == 'ride'")
    for n, kind in enumerate(["ride", "ping", "ride", "ping"]):
        h.produce(f"k{n}", {"kind": kind})
    got = h.pull()
    assert offsets(got) == [0, 2]
    h.ack(*got)
    s = h.engine.stats(h.now)
    assert s.filtered == 2 and s.topics[0].filtered == 2
    assert s.queues[0].committed_offset == 4  # rejected ones count as finished
    assert h.engine.take_commit().dead_letters == []


def test_a_filtered_message_never_blocks_its_key() -> None:
    h = _harness(filter="body.keep")
    h.produce("a", {"keep": True})
    h.produce("a", {"keep": False})
    h.produce("a", {"keep": True})
    first = h.pull()
    h.ack(*first)
    assert offsets(h.pull()) == [2]


def test_a_transform_reshapes_the_delivered_body() -> None:
    h = _harness(transform="{ride: body.ride.id, who: key}")
    h.produce("u1", {"ride": {"id": 7}, "noise": "x"})
    (d,) = h.pull()
    assert orjson.loads(d.body_json or b"null") == {"ride": 7, "who": "u1"}
    assert orjson.loads(d.message.body_json) == {"ride": {"id": 7}, "noise": "x"}  # stored as is


def test_an_expression_that_raises_dead_letters_that_message_and_the_rest_flow() -> None:
    # abs() of a string raises a JMESPath type error for that message only.
    h = _harness(filter="abs(body.n) > `0`")
    h.produce("a", {"n": 5})
    h.produce("b", {"n": "five"})
    h.produce("c", {"n": 7})
    got = h.pull()
    assert keys(got) == ["a", "c"]
    (dead,) = h.engine.take_commit().dead_letters
    assert dead.message.key == "b" and "abs" in (dead.last_error or "")
    assert dead.attempts == 0


def test_bad_expressions_are_refused_when_the_group_is_created() -> None:
    with pytest.raises(ConfigError, match="filter is not valid JMESPath"):
        GroupConfig.from_dict({"topics": {"t": {"filter": "body.["}}})
    with pytest.raises(ConfigError, match="transform must be a non-empty"):
        GroupConfig.from_dict({"topics": {"t": {"transform": ""}}})


def test_configs_with_the_same_expressions_are_equal() -> None:
    a = GroupConfig.from_dict({"topics": {"t": {"filter": "body.x", "transform": "body"}}})
    b = GroupConfig.from_dict({"topics": {"t": {"filter": "body.x", "transform": "body"}}})
    assert a == b
    entry = a.to_dict()["topics"]["t"]
    assert entry == {"order_by": "key", "filter": "body.x", "transform": "body"}
