"""The ``cproxy`` Python Data Source: prepared writes, dedup on re-run, driver-side checks."""

from __future__ import annotations

from typing import Any

import pytest

import spark_sink
from tests.spark_sink.sink_testing import ServerIO

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def registered(spark: Any) -> Any:
    spark_sink.register(spark)
    return spark


def events(spark: Any, keys: int = 30, per_key: int = 10) -> Any:
    from pyspark.sql import functions as F

    return (
        spark.range(keys * per_key)
        .select(
            (F.col("id") % keys).alias("ride_id"),
            (F.col("id") / keys).cast("int").alias("seq"),
        )
        .withColumn("at", F.timestamp_seconds(F.lit(1_714_550_400) + F.col("seq")))
        .orderBy(F.rand(seed=3))
        .repartition(5)
    )


def save(df: Any, url: str, topic: str, mode: str = "append", **options: str) -> None:
    writer = df.write.format("cproxy").mode(mode).option("url", url).option("topic", topic)
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()


def test_prepared_write_is_ordered_and_a_rerun_is_deduplicated(
    registered: Any, cproxy: ServerIO
) -> None:
    topic = cproxy.new_topic()
    prepared = spark_sink.prepare(events(registered), "ride_id", "seq", num_partitions=3)
    save(prepared, cproxy.url, topic, keyCol="ride_id", orderCol="seq", batchSize="25")
    by_key = cproxy.bodies_by_key(topic)
    assert len(by_key) == 30
    for key, bodies in by_key.items():
        assert [b["seq"] for b in bodies] == list(range(10)), key
        assert all(str(b["ride_id"]) == key for b in bodies)
        assert [b["at"] for b in bodies] == [f"2024-05-01T08:00:{s:02d}.000000Z" for s in range(10)]
    save(prepared, cproxy.url, topic, key_col="ride_id", order_col="seq")
    assert cproxy.total(topic) == 300


def test_unprepared_input_is_refused_instead_of_silently_misordered(
    registered: Any, cproxy: ServerIO
) -> None:
    topic = cproxy.new_topic()
    interleaved = registered.createDataFrame(
        [(1, 0), (2, 0), (1, 1)], "ride_id long, seq int"
    ).coalesce(1)
    with pytest.raises(Exception, match="rows of key '1' are not contiguous"):
        save(interleaved, cproxy.url, topic, key_col="ride_id", order_col="seq", batch_size="1")
    # The task stopped before sending the row that broke the grouping.
    stored = sorted((m["body"]["ride_id"], m["body"]["seq"]) for m in cproxy.read(topic))
    assert stored == [(1, 0), (2, 0)]


@pytest.mark.parametrize(
    ("mode", "options", "fragment"),
    [
        ("append", {}, "option 'key_col' is required"),
        ("append", {"key_col": "ride_id", "kee": "x"}, "unknown option 'kee'"),
        ("append", {"key_col": "nope"}, "'nope' not in the DataFrame"),
        ("append", {"key_col": "ride_id", "batch_size": "0"}, "batch_size must be"),
        ("append", {"key_col": "ride_id", "num_partitions": "4"}, "pass it to spark_sink.prepare"),
        ("overwrite", {"key_col": "ride_id"}, "append-only"),
    ],
)
def test_bad_options_fail_on_the_driver(
    registered: Any, cproxy: ServerIO, mode: str, options: dict[str, str], fragment: str
) -> None:
    topic = cproxy.new_topic()
    with pytest.raises(Exception, match=fragment):
        save(events(registered, 2, 2), cproxy.url, topic, mode=mode, **options)
    assert cproxy.total(topic) == 0


def test_unknown_topic_and_unreachable_service_fail_on_the_driver(registered: Any) -> None:
    df = events(registered, 2, 2)
    with pytest.raises(Exception, match=r"cannot reach cproxy at http://127\.0\.0\.1:9"):
        save(df, "http://127.0.0.1:9", "t", key_col="ride_id")
    with pytest.raises(Exception, match="url must be http"):
        save(df, "localhost:9713", "t", key_col="ride_id")
