"""PartitionWriter against an in-memory produce endpoint: order, ids, retries, checks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
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
    ids = [m.id for m in fake_cproxy.messages]
    assert len(ids) == 4 and ids[1] == f"{ids[0]}-1"
    assert write(fake_cproxy, data).duplicates == 4


def test_id_cols_define_identity(fake_cproxy: FakeCproxy) -> None:
    options = BASE.replace(id_cols=("ride", "seq"), id_prefix="job1:")
    summary = write(fake_cproxy, [("a", 1, "x"), ("a", 1, "changed"), ("a", 2, "y")], options)
    assert (summary.stored, summary.duplicates) == (2, 1)
    assert all(m.id and m.id.startswith("job1:") for m in fake_cproxy.messages)


def test_ids_start_with_the_key_digest_so_a_keys_ids_sort_together(
    fake_cproxy: FakeCproxy,
) -> None:
    options = BASE.replace(id_prefix="job1:", null_keys="unkeyed")
    write(fake_cproxy, [(None, 1, "x"), ("a", 1, "x"), ("a", 2, "y"), ("b", 1, "x")], options)
    ids = [m.id or "" for m in fake_cproxy.messages]
    starts = ["job1:" + key_digest(k) for k in (None, "a", "a", "b")]
    assert [i[: len(s)] for i, s in zip(ids, starts, strict=True)] == starts
    assert len(set(starts)) == 3 and all(len(i) == len("job1:") + 8 + 32 for i in ids)
    # Only the key digest differs between the layouts: the same rows under id scheme 1.
    old = FakeCproxy()
    write(
        old,
        [(None, 1, "x"), ("a", 1, "x"), ("a", 2, "y"), ("b", 1, "x")],
        BASE.replace(id_prefix="job1:", null_keys="unkeyed", id_scheme=1),
    )
    assert [m.id for m in old.messages] == [i[:5] + i[13:] for i in ids]


def test_id_scheme_1_reruns_a_write_of_an_earlier_sink(fake_cproxy: FakeCproxy) -> None:
    old = BASE.replace(id_scheme=1)
    write(fake_cproxy, rows(), old)
    assert write(fake_cproxy, rows(), old).duplicates == 20
    # The layouts give different ids: re-running an old write needs id_scheme=1.
    assert write(fake_cproxy, rows()).stored == 20


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


def test_ids_do_not_depend_on_where_chunks_and_batches_end(fake_cproxy: FakeCproxy) -> None:
    # Repeats of a row are numbered across chunk ends, null keys are skipped mid-chunk.
    data = [(None, 0, "n"), ("a", 1, "x"), ("a", 1, "x"), ("a", 1, "x"), ("a", 2, "y")]
    data += [(None, 3, "n"), ("b", 1, "x"), ("b", 1, "x")]
    skip = BASE.replace(null_keys="skip", verify_order=False)
    small = write(fake_cproxy, data, skip.replace(batch_size=2))
    ids = [m.id for m in fake_cproxy.messages]
    assert (small.sent, small.skipped) == (6, 2)
    assert ids[1:3] == [f"{ids[0]}-1", f"{ids[0]}-2"] and ids[5] == f"{ids[4]}-1"
    again = FakeCproxy()
    assert write(again, data, skip.replace(batch_size=1000)).sent == 6
    assert [m.id for m in again.messages] == ids
    assert again.calls == [6]


def test_summary_says_where_the_tasks_time_went(fake_cproxy: FakeCproxy) -> None:
    slow_server = 0.05
    handle = fake_cproxy.handle

    def slow(request: httpx.Request) -> httpx.Response:
        time.sleep(slow_server)  # the server taking its time, not a synchronisation
        return handle(request)

    def slow_input() -> Iterator[tuple[Any, ...]]:
        for row in rows(1, 3):
            time.sleep(slow_server)  # Spark computing the next row
            yield row

    writer = PartitionWriter(
        BASE, RowEncoder(SCHEMA, "ride", order_col="seq"), 0, transport=httpx.MockTransport(slow)
    )
    summary = writer.write(slow_input())
    assert summary.batches == 1 and summary.input_ms >= 3 * 50 and summary.wait_ms >= 50
    assert summary.encode_ms < summary.input_ms
    # Timings vary between runs: they do not make summaries differ.
    assert summary == WriteSummary(rows=3, sent=3, stored=3, batches=1, partitions=1)


def test_empty_partition_sends_nothing(fake_cproxy: FakeCproxy) -> None:
    assert write(fake_cproxy, []) == WriteSummary(partitions=1)
    assert not any(
        isinstance(r, httpx.Request) and r.method == "POST" for r in fake_cproxy.requests
    )
