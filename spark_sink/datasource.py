"""The ``cproxy`` Spark Python Data Source (batch writes).

Usage::

    spark_sink.register(spark)
    (spark_sink.prepare(df, "ride_id", "event_time")
        .write.format("cproxy").mode("append")
        .option("url", "http://127.0.0.1:9713").option("topic", "rides")
        .option("key_col", "ride_id").option("order_col", "event_time")
        .save())

A Data Source writer cannot repartition its input: each Spark partition is written as it
comes, in order, by one task. Per-key order therefore holds only when every key's rows sit
in one partition in the wanted order, which ``prepare()`` arranges. Within a task the
writer verifies what it can see (contiguous keys, ascending ``order_col``); a key split
across two partitions cannot be seen by any one task.

This module imports pyspark at import time; ``spark_sink`` loads it lazily.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql import Row, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from spark_sink.errors import SinkConfigError
from spark_sink.executors import check_executors
from spark_sink.options import SinkOptions
from spark_sink.partition import PartitionWriter, WriteSummary
from spark_sink.producer import check_service
from spark_sink.rowjson import RowEncoder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CproxyCommitMessage(WriterCommitMessage):
    """What one successful task reports back to the driver."""

    partition_id: int
    summary: WriteSummary


class CproxyDataSource(DataSource):
    """``df.write.format("cproxy")``: options are validated once, on the driver."""

    @classmethod
    def name(cls) -> str:
        return "cproxy"

    def writer(self, schema: StructType, overwrite: bool) -> CproxyWriter:
        if overwrite:
            raise SinkConfigError("cproxy sink: topics are append-only; use .mode('append')")
        options = SinkOptions.from_strings(dict(self.options))
        if options.num_partitions is not None:
            raise SinkConfigError(
                "cproxy sink: num_partitions has no effect on a Data Source write; pass it "
                "to spark_sink.prepare() instead"
            )
        options.check_columns(schema.fieldNames())
        check_service(options)
        active = SparkSession.getActiveSession()
        if active is not None:
            check_executors(active)
        encoder = RowEncoder(
            schema.jsonValue(),
            options.key_col,
            options.id_cols,
            options.body_cols,
            options.order_col,
        )
        return CproxyWriter(options, encoder)


class CproxyWriter(DataSourceWriter):
    """Executor side: one producer per task, batches sent in partition order."""

    def __init__(self, options: SinkOptions, encoder: RowEncoder) -> None:
        self.options = options
        self.encoder = encoder

    def write(self, iterator: Iterator[Row]) -> CproxyCommitMessage:
        context = TaskContext.get()
        partition_id = context.partitionId() if context is not None else 0
        summary = PartitionWriter(self.options, self.encoder, partition_id).write(iterator)
        return CproxyCommitMessage(partition_id, summary)

    def commit(self, messages: list[Any]) -> None:
        summary = WriteSummary.total(
            m.summary for m in messages if isinstance(m, CproxyCommitMessage)
        )
        log.info("cproxy write to topic %s committed: %s", self.options.topic, summary)

    def abort(self, messages: list[Any]) -> None:
        done = sum(1 for m in messages if isinstance(m, CproxyCommitMessage))
        # Messages already produced cannot be taken back; a re-run is safe thanks to ids.
        log.warning(
            "cproxy write to topic %s aborted after %d successful task(s); messages already "
            "stored stay, and re-running the same write stores no duplicates",
            self.options.topic,
            done,
        )


def register(spark: SparkSession) -> None:
    """Make ``format("cproxy")`` available in this Spark session."""
    spark.dataSource.register(CproxyDataSource)
