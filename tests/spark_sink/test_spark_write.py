"""write_dataframe on a local Spark session against a real cproxy server."""

from __future__ import annotations

import datetime as dt
import socket
from decimal import Decimal
from typing import Any

import pytest

from spark_sink import (
    BatchInfo,
    SinkConfigError,
    SinkUnavailableError,
    write_dataframe,
)
from tests.spark_sink.sink_testing import ServerIO

pytestmark = pytest.mark.spark

KEYS = 60
PER_KEY = 20


def shuffled_events(spark: Any, keys: int = KEYS, per_key: int = PER_KEY) -> Any:
    """``keys * per_key`` events spread over 8 partitions in random order."""
    from pyspark.sql import functions as F

    return (
        spark.range(keys * per_key)
        .select(
            F.concat(F.lit("ride-"), (F.col("id") % keys).cast("string")).alias("ride_id"),
            (F.col("id") / keys).cast("int").alias("seq"),
        )
        .withColumn("event", F.concat(F.lit("e"), F.col("seq").cast("string")))
        .orderBy(F.rand(seed=7))
        .repartition(8)
    )


def assert_ordered_and_complete(by_key: dict[Any, list[Any]], keys: int, per_key: int) -> None:
    assert len(by_key) == keys
    for key, bodies in by_key.items():
        assert [b["seq"] for b in bodies] == list(range(per_key)), key


def test_per_key_order_survives_a_shuffled_many_partition_dataframe(
    spark: Any, cproxy: ServerIO
) -> None:
    topic = cproxy.new_topic(queues=4)
    df = shuffled_events(spark)
    summary = write_dataframe(
        df, cproxy.url, topic, "ride_id", order_col="seq", batch_size=50, num_partitions=6
    )
    assert (summary.rows, summary.stored, summary.duplicates) == (KEYS * PER_KEY, KEYS * PER_KEY, 0)
    assert summary.partitions == 6 and summary.batches >= KEYS * PER_KEY // 50
    assert_ordered_and_complete(cproxy.bodies_by_key(topic), KEYS, PER_KEY)


def test_writing_the_same_dataframe_twice_stores_nothing_new(spark: Any, cproxy: ServerIO) -> None:
    topic = cproxy.new_topic()
    df = shuffled_events(spark, keys=10, per_key=10).cache()
    first = write_dataframe(df, cproxy.url, topic, "ride_id", order_col="seq")
    # A different partition count moves keys to other tasks; ids must not care.
    second = write_dataframe(
        df, cproxy.url, topic, "ride_id", order_col="seq", num_partitions=3, batch_size=7
    )
    df.unpersist()
    assert first.stored == 100
    assert (second.stored, second.duplicates) == (0, 100)
    assert cproxy.total(topic) == 100


def test_task_failure_mid_partition_then_retry_has_no_duplicates_or_gaps(
    spark: Any, cproxy: ServerIO
) -> None:
    # Defined inside the test so that cloudpickle ships it by value: executors cannot
    # import test modules.
    def fail_first_attempt_after_two_batches(info: BatchInfo) -> None:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None and context.attemptNumber() == 0 and info.batch_index == 1:
            raise RuntimeError(f"injected failure in partition {info.partition_id}")

    topic = cproxy.new_topic()
    df = shuffled_events(spark)
    summary = write_dataframe(
        df,
        cproxy.url,
        topic,
        "ride_id",
        order_col="seq",
        batch_size=40,
        num_partitions=4,
        on_batch=fail_first_attempt_after_two_batches,
    )
    # Each first attempt stored two batches before dying; the retries re-sent them as
    # duplicates, so the failure really happened mid-partition and was retried.
    assert summary.duplicates == 4 * 2 * 40
    assert summary.stored + summary.duplicates == KEYS * PER_KEY
    assert cproxy.total(topic) == KEYS * PER_KEY
    assert_ordered_and_complete(cproxy.bodies_by_key(topic), KEYS, PER_KEY)


def test_column_types_become_documented_json(spark: Any, cproxy: ServerIO) -> None:
    from pyspark.sql import Row

    topic = cproxy.new_topic(queues=1)
    rows = [
        Row(
            ride_id=1,
            at=dt.datetime(2024, 5, 1, 12, 0, 0, 250000, tzinfo=dt.UTC),
            day=dt.date(2024, 5, 1),
            fare=Decimal("12.50"),
            note=None,
            stop=Row(lat=52.5, lon=13.4),
            tags=["a", "b"],
            extra={"k": 1},
        ),
        Row(ride_id=2, at=None, day=None, fare=None, note="x", stop=None, tags=None, extra=None),
    ]
    schema = (
        "`ride.id` long, at timestamp, day date, fare decimal(8,2), note string, "
        "stop struct<lat:double,lon:double>, tags array<string>, extra map<string,int>"
    )
    df = spark.createDataFrame(rows, schema)
    # A dotted name is a plain top-level column here, not a struct field.
    write_dataframe(df, cproxy.url, topic, "ride.id", order_col="at", headers={"source": "test"})
    messages = cproxy.read(topic)
    assert [m["key"] for m in sorted(messages, key=lambda m: m["key"])] == ["1", "2"]
    bodies = {m["key"]: m["body"] for m in messages}
    # An aware input keeps the test independent of the machine's time zone.
    assert bodies["1"] == {
        "ride.id": 1,
        "at": "2024-05-01T12:00:00.250000Z",
        "day": "2024-05-01",
        "fare": "12.50",
        "note": None,
        "stop": {"lat": 52.5, "lon": 13.4},
        "tags": ["a", "b"],
        "extra": {"k": 1},
    }
    assert bodies["2"] == {
        "ride.id": 2,
        "at": None,
        "day": None,
        "fare": None,
        "note": "x",
        "stop": None,
        "tags": None,
        "extra": None,
    }
    assert messages[0]["headers"] == {"source": "test"}


def test_null_keys_are_skipped_or_rejected(spark: Any, cproxy: ServerIO) -> None:
    topic = cproxy.new_topic()
    df = spark.createDataFrame([("a", 1), (None, 2), ("b", 3)], "k string, v int")
    summary = write_dataframe(df, cproxy.url, topic, "k", null_keys="skip")
    assert (summary.rows, summary.stored, summary.skipped) == (3, 2, 1)
    with pytest.raises(Exception, match="null in key column 'k'"):
        write_dataframe(df, cproxy.url, topic, "k")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"key_col": "nope"}, SinkConfigError, r"column\(s\) 'nope' not in the DataFrame"),
        ({"order_col": "when"}, SinkConfigError, "'when' not in the DataFrame"),
        ({"batch_size": 5000}, SinkConfigError, "batch_size must be"),
        ({"topic": "missing-topic"}, SinkConfigError, "does not exist"),
        ({"url": "unreachable"}, SinkUnavailableError, "cannot reach cproxy"),
    ],
)
def test_bad_options_fail_on_the_driver_before_any_job(
    spark: Any,
    cproxy: ServerIO,
    kwargs: dict[str, Any],
    error: type[Exception],
    fragment: str,
) -> None:
    topic = cproxy.new_topic()
    if kwargs.get("url") == "unreachable":
        kwargs["url"] = f"http://127.0.0.1:{free_port()}"
    args: dict[str, Any] = {"url": cproxy.url, "topic": topic, "key_col": "k", **kwargs}
    df = spark.createDataFrame([("a", 1)], "k string, v int")
    context = spark.sparkContext
    group = f"bad-options-{topic}"
    context.setJobGroup(group, "must not run")
    try:
        with pytest.raises(error, match=fragment):
            write_dataframe(df, **args)
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    assert list(context.statusTracker().getJobIdsForGroup(group)) == []
    assert cproxy.total(topic) == 0
