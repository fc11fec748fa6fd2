"""PartitionWriter against an in-memory produce endpoint: order, ids, retries, checks."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson
import pytest

from spark_sink import (
    BatchInfo,
    MessageTooLargeError,
    NullKeyError,
    OrderViolationError,
    SinkOptions,
    SinkUnavailableError,
    UngroupedInputError,
    WriteSummary,
)
from spark_sink.partition import PartitionWriter
from spark_sink.rowjson import RowEncoder, key_digest
from tests.spark_sink.sink_testing import FakeCproxy

SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": n, "type": t, "nullable": True, "metadata": {}}
        for n, t in (("ride", "string"), ("seq", "integer"), ("event", "string"))
    ],
}
BASE = SinkOptions.create(
    url="http://cproxy",
    topic="rides",
    key_col="ride",
    order_col="seq",
    batch_size=3,
    max_retries=2,
    retry_initial_ms=0,
    retry_max_ms=0,
)


def rows(keys: int = 4, per_key: int = 5) -> list[tuple[Any, ...]]:
    return [(f"r{k}", s, f"e{s}") for k in range(keys) for s in range(per_key)]


def write(
    fake: FakeCproxy, data: list[tuple[Any, ...]], options: SinkOptions = BASE, **kwargs: Any
) -> WriteSummary:
    encoder = RowEncoder(
        SCHEMA, options.key_col, options.id_cols, options.body_cols, options.order_col
    )
    writer = PartitionWriter(
        options, encoder, 3, transport=fake.transport(), sleep=lambda _: None, **kwargs
    )
    return writer.write(iter(data))


def test_rows_are_sent_in_order_in_bounded_batches(fake_cproxy: FakeCproxy) -> None:
    batches: list[BatchInfo] = []
    summary = write(fake_cproxy, rows(), on_batch=batches.append)
    assert summary == WriteSummary(rows=20, sent=20, stored=20, batches=7, partitions=1)
    assert fake_cproxy.calls == [3, 3, 3, 3, 3, 3, 2]
    assert batches[0] == BatchInfo(3, 0, 3, 3, 0) and batches[-1].batch_index == 6
    for key, bodies in fake_cproxy.bodies_by_key().items():
        assert [b["seq"] for b in bodies] == list(range(5)), key


def test_writing_twice_stores_nothing_new(fake_cproxy: FakeCproxy) -> None:
    write(fake_cproxy, rows())
    again = write(fake_cproxy, rows())
    assert (again.stored, again.duplicates) == (0, 20)
    assert len(fake_cproxy.messages) == 20


def test_identical_rows_stay_distinct_but_deterministic(fake_cproxy: FakeCproxy) -> None:
    data = [("a", 1, "x"), ("a", 1, "x"), ("a", 2, "y"), ("b", 1, "x")]
    write(fake_cproxy, data)
    # Batches of different keys may be stored in either order; a key's are in order.
    ids = [m.id for m in fake_cproxy.messages if m.key == "a"]
    assert len(fake_cproxy.messages) == 4 and len(ids) == 3 and ids[1] == f"{ids[0]}-1"
    assert write(fake_cproxy, data).duplicates == 4


def test_id_cols_define_identity(fake_cproxy: FakeCproxy) -> None:
    options = BASE.replace(id_cols=("ride", "seq"), id_prefix="job1:")
    summary = write(fake_cproxy, [("a", 1, "x"), ("a", 1, "changed"), ("a", 2, "y")], options)
    assert (summary.stored, summary.duplicates) == (2, 1)
    assert all(m.id and m.id.startswith("job1:") for m in fake_cproxy.messages)


def test_ids_start_with_the_key_digest_so_a_keys_ids_sort_together(
    fake_cproxy: FakeCproxy,
) -> None:
    data = [(None, 1, "x"), ("a", 1, "x"), ("a", 2, "y"), ("b", 1, "x")]
    write(fake_cproxy, data, BASE.replace(id_prefix="job1:", null_keys="unkeyed"))
    ids = {(m.key, m.body["seq"]): m.id or "" for m in fake_cproxy.messages}
    for (key, _), message_id in ids.items():
        assert message_id.startswith("job1:" + key_digest(key))
        assert len(message_id) == len("job1:") + 8 + 32
    assert len({key_digest(k) for k in (None, "a", "b")}) == 3
    # Only the key digest differs between the layouts: the same rows under id scheme 1.
    old = FakeCproxy()
    options = BASE.replace(id_prefix="job1:", null_keys="unkeyed", id_scheme=1)
    write(old, data, options)
    assert {(m.key, m.body["seq"]): m.id for m in old.messages} == {
        where: i[:5] + i[13:] for where, i in ids.items()
    }


def test_id_scheme_1_reruns_a_write_of_an_earlier_sink(fake_cproxy: FakeCproxy) -> None:
    old = BASE.replace(id_scheme=1)
    write(fake_cproxy, rows(), old)
    assert write(fake_cproxy, rows(), old).duplicates == 20
    # The layouts give different ids: re-running an old write needs id_scheme=1.
    assert write(fake_cproxy, rows()).stored == 20


class Timed:
    """A transport that holds every produce call a moment and records when it ran."""

    def __init__(self, fake: FakeCproxy) -> None:
        self.fake = fake
        self.spans: list[tuple[float, float, set[str | None]]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        started = time.monotonic()
        time.sleep(0.02)
        answer = self.fake.handle(request)
        keys = {m.get("key") for m in orjson.loads(request.content)["messages"]}
        self.spans.append((started, time.monotonic(), keys))
        return answer

    def most_in_flight(self) -> int:
        return max(sum(1 for s, e, _ in self.spans if s <= at < e) for at, _, _ in self.spans)

    def key_overlaps(self) -> list[tuple[set[str | None], set[str | None]]]:
        """Pairs of calls that share a key and ran at the same time."""
        spans = sorted(self.spans)
        return [
            (a[2], b[2])
            for i, a in enumerate(spans)
            for b in spans[i + 1 :]
            if a[2] & b[2] and b[0] < a[1]
        ]


def timed_write(fake: FakeCproxy, **kwargs: Any) -> Timed:
    timed = Timed(fake)
    encoder = RowEncoder(SCHEMA, "ride", None, None, "seq")
    transport = httpx.MockTransport(timed.handle)
    PartitionWriter(BASE, encoder, transport=transport, **kwargs).write(rows())
    return timed


def test_batches_sharing_no_key_are_in_flight_together(fake_cproxy: FakeCproxy) -> None:
    timed = timed_write(fake_cproxy)
    # Full batches are cut where their last key starts, so the next one shares no key.
    assert sorted(fake_cproxy.calls) == sorted([3, 2] * 4)
    assert timed.most_in_flight() == 2
    assert timed.key_overlaps() == []
    for key, bodies in fake_cproxy.bodies_by_key().items():
        assert [b["seq"] for b in bodies] == list(range(5)), key


def test_a_batch_hook_sees_one_batch_in_flight_at_a_time(fake_cproxy: FakeCproxy) -> None:
    seen: list[BatchInfo] = []
    timed = timed_write(fake_cproxy, on_batch=seen.append)
    assert fake_cproxy.calls == [3, 3, 3, 3, 3, 3, 2]
    assert timed.most_in_flight() == 1
    assert [b.batch_index for b in seen] == list(range(7))


def test_failure_mid_partition_then_retry_has_no_duplicates_or_gaps(
    fake_cproxy: FakeCproxy,
) -> None:
    def fail_after_two(info: BatchInfo) -> None:
        if info.batch_index == 1:
            raise RuntimeError("executor lost")

    with pytest.raises(RuntimeError):
        write(fake_cproxy, rows(), on_batch=fail_after_two)
    assert len(fake_cproxy.messages) == 6
    retry = write(fake_cproxy, rows())
    assert (retry.stored, retry.duplicates) == (14, 6)
    assert len(fake_cproxy.messages) == 20
    for bodies in fake_cproxy.bodies_by_key().values():
        assert [b["seq"] for b in bodies] == list(range(5))


def test_lost_response_is_retried_and_deduplicated(fake_cproxy: FakeCproxy) -> None:
    fake_cproxy.store_then_fail = [503]
    summary = write(fake_cproxy, rows(1, 3))
    assert (summary.stored, summary.duplicates, summary.retries) == (0, 3, 1)
    assert len(fake_cproxy.messages) == 3


def test_unavailable_past_retries_fails_the_task(fake_cproxy: FakeCproxy) -> None:
    fake_cproxy.fail_next = [503, 503, 503]
    with pytest.raises(SinkUnavailableError, match="after 3 attempt"):
        write(fake_cproxy, rows(1, 1))


def test_null_key_policies(fake_cproxy: FakeCproxy) -> None:
    data = [(None, 1, "x"), ("a", 1, "y")]
    with pytest.raises(NullKeyError, match="null in key column 'ride'"):
        write(fake_cproxy, data)
    assert fake_cproxy.messages == []
    assert write(fake_cproxy, data, BASE.replace(null_keys="skip")).skipped == 1
    assert [m.key for m in fake_cproxy.messages] == ["a"]
    write(fake_cproxy, data, BASE.replace(null_keys="unkeyed"))
    assert [m.key for m in fake_cproxy.messages] == ["a", None]


def test_ungrouped_input_is_refused_before_it_is_sent(fake_cproxy: FakeCproxy) -> None:
    data = [("a", 1, "x"), ("b", 1, "x"), ("a", 2, "x")]
    with pytest.raises(UngroupedInputError, match="key 'a' are not contiguous"):
        write(fake_cproxy, data, BASE.replace(batch_size=1))
    assert len(fake_cproxy.messages) == 2
    # With explicit id columns and no order check, interleaved keys are fine.
    relaxed = BASE.replace(id_cols=("ride", "seq"), order_col=None)
    assert write(fake_cproxy, data, relaxed).sent == 3
    assert [m.key for m in fake_cproxy.messages[2:]] == ["a", "b", "a"]


def test_out_of_order_rows_are_refused(fake_cproxy: FakeCproxy) -> None:
    with pytest.raises(OrderViolationError, match="not ascending in 'seq' \\(2 before 1\\)"):
        write(fake_cproxy, [("a", 2, "x"), ("a", 1, "x")])
    write(fake_cproxy, [("a", 2, "x"), ("a", 1, "x")], BASE.replace(verify_order=False))
    assert len(fake_cproxy.messages) == 2


def test_batches_respect_the_request_byte_limit(fake_cproxy: FakeCproxy) -> None:
    big = "x" * 400
    options = BASE.replace(batch_size=100, max_message_bytes=1000, max_request_bytes=1200)
    write(fake_cproxy, [("a", i, big) for i in range(5)], options)
    assert fake_cproxy.calls == [2, 2, 1]
    with pytest.raises(MessageTooLargeError, match="over max_message_bytes=1000"):
        write(fake_cproxy, [("a", 9, "y" * 1000)], options)


def test_headers_are_attached(fake_cproxy: FakeCproxy) -> None:
    write(fake_cproxy, rows(1, 1), BASE.replace(headers=(("source", "spark"),)))
    assert fake_cproxy.messages[0].headers == {"source": "spark"}


def test_empty_partition_sends_nothing(fake_cproxy: FakeCproxy) -> None:
    assert write(fake_cproxy, []) == WriteSummary(partitions=1)
    assert not any(
        isinstance(r, httpx.Request) and r.method == "POST" for r in fake_cproxy.requests
    )
