"""The foreachBatch helper: batch-scoped ids, and a replayed micro-batch is deduplicated."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from spark_sink import SinkUnavailableError, foreach_batch_writer
from tests.spark_sink.sink_testing import ServerIO

pytestmark = pytest.mark.spark


def test_ids_include_the_batch_id(spark: Any, cproxy: ServerIO) -> None:
    topic = cproxy.new_topic()
    write = foreach_batch_writer(cproxy.url, topic, "k", order_col="v", namespace="q1")
    df = spark.createDataFrame([("a", 1), ("a", 2), ("b", 1)], "k string, v int")
    write(df, 0)
    write(df, 0)  # the same micro-batch again: a replay
    assert write.last_summary is not None
    assert (write.last_summary.stored, write.last_summary.duplicates) == (0, 3)
    write(df, 1)  # the same rows in a later micro-batch are new messages
    assert write.last_summary.stored == 3
    assert cproxy.total(topic) == 6


def test_a_replayed_micro_batch_after_restart_stores_nothing_twice(
    spark: Any, cproxy: ServerIO, tmp_path: Path
) -> None:
    topic = cproxy.new_topic()
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    for batch in range(2):
        lines = [
            json.dumps({"ride": f"r{r}", "seq": batch * 10 + s})
            for r in range(5)
            for s in range(10)
        ]
        path = source / f"part-{batch}.json"
        path.write_text("\n".join(lines))
        # The file source takes files oldest first: make part-0 clearly the first batch.
        os.utime(path, (1_700_000_000 + batch, 1_700_000_000 + batch))
    write = foreach_batch_writer(cproxy.url, topic, "ride", order_col="seq", namespace="rides")

    def run() -> None:
        stream = (
            spark.readStream.schema("ride string, seq int")
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
        )
        query = (
            stream.writeStream.foreachBatch(write)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    run()
    assert cproxy.total(topic) == 100
    # Forget that batch 1 was committed: on restart Spark runs batch 1 again.
    # (with its checksum file, or Spark takes the rewrite for a concurrent writer).
    for name in ("1", ".1.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    run()
    assert write.last_summary is not None
    assert (write.last_summary.stored, write.last_summary.duplicates) == (0, 50)
    by_key = cproxy.bodies_by_key(topic)
    assert sorted(str(k) for k in by_key) == [f"r{r}" for r in range(5)]
    for bodies in by_key.values():
        assert [b["seq"] for b in bodies] == list(range(20))


def test_the_helper_checks_options_and_service_up_front(cproxy: ServerIO) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        foreach_batch_writer(cproxy.url, "t", "k", batch_size=0)
    with pytest.raises(SinkUnavailableError, match="cannot reach"):
        foreach_batch_writer("http://127.0.0.1:9", "t", "k")
