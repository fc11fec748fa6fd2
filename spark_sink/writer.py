"""Driver-side entry points: ``write_dataframe``, ``prepare`` and the ``foreachBatch`` helper.

pyspark is imported inside the functions that need it, so ``import spark_sink`` works on a
core install; only calling into Spark requires the ``spark`` extra.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, fields
from typing import TYPE_CHECKING, Any

from spark_sink.columns import ArrowRows, arrow_supported
from spark_sink.executors import check_executors
from spark_sink.options import DEFAULT_BATCH_SIZE, SinkOptions
from spark_sink.partition import BatchHook, PartitionWriter, WriteSummary
from spark_sink.producer import check_service
from spark_sink.rowjson import RowEncoder

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)


def require_pyspark() -> None:
    """Raise a clear ImportError when the ``spark`` extra is not installed."""
    try:
        import pyspark  # noqa: F401 (optional dependency)
    except ImportError as exc:
        raise ImportError("spark_sink needs PySpark: pip install 'cproxy-ordered[spark]'") from exc


def prepare(
    df: DataFrame,
    key_col: str,
    order_col: str | None = None,
    num_partitions: int | None = None,
) -> DataFrame:
    """Repartition by key and sort within partitions by (key, order_col), nulls first.

    After this every key lives in exactly one partition, in ``order_col`` order, which is
    what per-key ordering across a distributed write needs. ``repartition`` (not
    ``rebalance``) matters: adaptive execution may coalesce whole partitions but never
    splits a key across tasks.
    """
    require_pyspark()
    from pyspark.sql import functions as F

    key = F.col(quote_column(key_col))
    parts = df.repartition(num_partitions, key) if num_partitions else df.repartition(key)
    order = [key.asc_nulls_first()]
    if order_col is not None:
        order.append(F.col(quote_column(order_col)).asc_nulls_first())
    return parts.sortWithinPartitions(*order)


def quote_column(name: str) -> str:
    """A top-level column reference: ``a.b`` is the column named so, not a struct field."""
    return "`" + name.replace("`", "``") + "`"


class _Job:
    """What Spark pickles to each task: the options, the row encoder and the batch hook."""

    def __init__(
        self, options: SinkOptions, encoder: RowEncoder, on_batch: BatchHook | None = None
    ) -> None:
        self.options = options
        self.encoder = encoder
        self.on_batch = on_batch


class PartitionJob(_Job):
    """The picklable function Spark runs per partition (``mapPartitionsWithIndex``): the row
    path, for schemas the Arrow path does not take."""

    def __call__(self, partition_id: int, rows: Iterable[Sequence[Any]]) -> Iterator[WriteSummary]:
        writer = PartitionWriter(self.options, self.encoder, partition_id, on_batch=self.on_batch)
        yield writer.write(rows)


#: The one row an :class:`ArrowPartitionJob` returns: its partition's :class:`WriteSummary`.
SUMMARY_DDL = ", ".join(f"{f.name} long" for f in fields(WriteSummary))


class ArrowPartitionJob(_Job):
    """The picklable function Spark runs per partition with ``mapInArrow``: Arrow record
    batches in (columns converted at once, see :mod:`spark_sink.columns`), one record batch
    with the partition's summary out."""

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa  # type: ignore[import-untyped]
        from pyspark import TaskContext

        context = TaskContext.get()
        partition_id = context.partitionId() if context is not None else 0
        writer = PartitionWriter(self.options, self.encoder, partition_id, on_batch=self.on_batch)
        arrow = ArrowRows(self.encoder.schema_json, self.encoder.order_index)
        summary = writer.write_chunks(arrow.chunks(writer.timed(batches), self.options.batch_size))
        yield pa.RecordBatch.from_pylist([asdict(summary)])


def write_dataframe(
    df: DataFrame,
    url: str,
    topic: str,
    key_col: str,
    order_col: str | None = None,
    id_cols: Sequence[str] | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    *,
    on_batch: BatchHook | None = None,
    **options: Any,
) -> WriteSummary:
    """Write ``df`` into ``topic``, one message per row, in order per key.

    Rows are repartitioned by ``key_col`` and sorted by (key, ``order_col``); each partition
    is sent in batches of ``batch_size`` by one producer. Message ids derive from the row
    (or ``id_cols``), so a retried task or a repeated write stores nothing twice. Further
    keyword options are the fields of :class:`SinkOptions` (``body_cols``, ``null_keys``,
    ``num_partitions``, ``token``, ``headers``, ``create_topic_queues``, ...).
    ``on_batch`` runs on the executor after each acknowledged batch.
    """
    sink = SinkOptions.create(
        url=url,
        topic=topic,
        key_col=key_col,
        order_col=order_col,
        id_cols=id_cols,
        batch_size=batch_size,
        **options,
    )
    return write_with_options(df, sink, on_batch=on_batch)


def write_with_options(
    df: DataFrame,
    options: SinkOptions,
    on_batch: BatchHook | None = None,
    service_checked: bool = False,
) -> WriteSummary:
    """``write_dataframe`` with already validated options."""
    require_pyspark()
    options.check_columns(df.columns)
    check_executors(df.sparkSession)
    if not service_checked:
        check_service(options)
    encoder = RowEncoder(
        df.schema.jsonValue(),
        options.key_col,
        options.id_cols,
        options.body_cols,
        options.order_col,
    )
    prepared = prepare(df, options.key_col, options.order_col, options.num_partitions)
    if arrow_supported(df.schema.jsonValue()) and _has_pandas():
        arrow_job = ArrowPartitionJob(options, encoder, on_batch)
        # Positional names: PySpark's mapInArrow resolves every column by name, and a name
        # such as "a.b" would resolve as a struct field. The job works by position.
        positional = prepared.toDF(*(f"_{i}" for i in range(len(df.columns))))
        rows = positional.mapInArrow(arrow_job, SUMMARY_DDL).collect()
        summary = WriteSummary.total(WriteSummary(**row.asDict()) for row in rows)
    else:
        job = PartitionJob(options, encoder, on_batch)
        summary = WriteSummary.total(prepared.rdd.mapPartitionsWithIndex(job).collect())
    log.info("wrote to topic %s: %s", options.topic, summary)
    return summary


def _has_pandas() -> bool:
    """PySpark refuses ``mapInArrow`` without pandas (it builds the function as a pandas UDF,
    though no pandas code runs on it) and pyarrow; the row path needs neither."""
    return all(importlib.util.find_spec(m) is not None for m in ("pandas", "pyarrow"))


class ForeachBatchWriter:
    """A ``foreachBatch`` function writing each micro-batch with batch-scoped ids.

    Ids are prefixed with ``<namespace>:<batch_id>:``, so a micro-batch that Spark replays
    after a restart (same checkpoint, same batch id) is deduplicated, while identical rows
    in a later batch are new messages. Use a distinct ``namespace`` per streaming query
    writing to the same topic.
    """

    def __init__(
        self, options: SinkOptions, namespace: str = "", on_batch: BatchHook | None = None
    ) -> None:
        self.options = options
        self.namespace = namespace
        self.on_batch = on_batch
        #: Summary of the latest micro-batch written by this process.
        self.last_summary: WriteSummary | None = None

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        prefix = f"{self.options.id_prefix}{self.namespace}:{batch_id}:"
        summary = write_with_options(
            df, self.options.replace(id_prefix=prefix), self.on_batch, service_checked=True
        )
        self.last_summary = summary
        log.info("micro-batch %d of %s written: %s", batch_id, self.namespace or "query", summary)


def foreach_batch_writer(
    url: str,
    topic: str,
    key_col: str,
    order_col: str | None = None,
    id_cols: Sequence[str] | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    *,
    namespace: str = "",
    on_batch: BatchHook | None = None,
    check: bool = True,
    **options: Any,
) -> ForeachBatchWriter:
    """Build a ``writeStream.foreachBatch(...)`` function; options are validated now.

    With ``check`` the service and topic are verified here, once, on the driver.
    """
    sink = SinkOptions.create(
        url=url,
        topic=topic,
        key_col=key_col,
        order_col=order_col,
        id_cols=id_cols,
        batch_size=batch_size,
        **options,
    )
    # The batch prefix is added per call; validate its worst-case length now, not mid-stream.
    sink.replace(id_prefix=f"{sink.id_prefix}{namespace}:{2**63 - 1}:")
    if check:
        check_service(sink)
    return ForeachBatchWriter(sink, namespace, on_batch)
