"""Spark sink throughput: rows/s into cproxy, and what per-key ordering costs.

Measures on ``local[2]`` against a real ``cproxy serve`` (started here in a temp dir unless
``--url`` is given), each run into a fresh topic so dedup never short-cuts the work:

- ``ordered``: ``write_dataframe`` (repartition by key + sort + ordered batches);
- ``unordered``: the same partition writer on the input partitions as they are;
- ``rewrite``: the ordered write again into the same topic (everything a duplicate);
- ``spark only``: the Spark side alone (prepare or not, then iterate the rows in Python),
  which isolates the shuffle+sort cost from HTTP and the server.

A small warm-up write runs first. On a shared 2-core machine the numbers move with whatever
else runs; compare runs made back to back. Needs pyspark and Java 17.

    python -m benchmarks.spark_sink --quick       # 100k rows, best of 3
    python -m benchmarks.spark_sink --json spark.json   # 1M rows, one run
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from benchmarks.harness.report import arg_parser, finish, machine_facts
from benchmarks.harness.server import servers
from spark_sink import SinkOptions, WriteSummary, prepare
from spark_sink.producer import check_service
from spark_sink.rowjson import RowEncoder
from spark_sink.writer import PartitionJob, write_with_options


def dataset(spark: Any, rows: int, keys: int) -> Any:
    """``rows`` events over ``keys`` keys, ~120 bytes of JSON body each, materialised."""
    from pyspark.sql import functions as F

    df = spark.range(rows, numPartitions=4).select(
        F.col("id"),
        F.format_string("key-%d", F.col("id") % keys).alias("key"),
        (F.col("id") / keys).cast("long").alias("seq"),
        F.timestamp_seconds(F.lit(1_714_550_400) + F.col("id")).alias("at"),
        (F.col("id") % 1000 / 10).cast("decimal(8,2)").alias("amount"),
        F.lit("payload-payload-payload").alias("note"),
    )
    df = df.cache()
    df.count()
    return df


#: Runs per measurement; the fastest counts (other load on a shared machine only slows runs).
REPEAT = 1


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(REPEAT):
        started = time.perf_counter()
        result = action()
        best = min(best, time.perf_counter() - started)
    return best, result


def new_options(url: str, **changes: Any) -> SinkOptions:
    topic = f"bench-{uuid.uuid4().hex[:10]}"
    options = SinkOptions.create(
        url=url,
        topic=topic,
        key_col="key",
        order_col="seq",
        id_cols=("id",),
        create_topic_queues=8,
        **changes,
    )
    check_service(options)
    return options


def unordered_write(df: Any, options: SinkOptions) -> WriteSummary:
    """The partition writer without repartition/sort (ids from ``id``, so no grouping)."""
    encoder = RowEncoder(df.schema.jsonValue(), "key", options.id_cols, None, None)
    job = PartitionJob(options.replace(order_col=None), encoder)
    return WriteSummary.total(df.rdd.mapPartitionsWithIndex(job).collect())


def count_rows(_: int, rows: Iterable[Any]) -> Iterator[int]:
    yield sum(1 for _ in rows)


def main() -> None:
    parser = arg_parser(__doc__, "100k rows instead of 1M, best of 3")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--url", default=None, help="use this server instead of starting one")
    parser.add_argument(
        "--repeat", type=int, help="runs per measurement, fastest counts (default: 3 quick, 1)"
    )
    args = parser.parse_args()
    global REPEAT  # noqa: PLW0603 (a script-wide setting, set once here)
    REPEAT = args.repeat or (3 if args.quick else 1)
    rows = args.rows or (100_000 if args.quick else 1_000_000)
    facts = machine_facts()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("spark-sink-bench")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    df = dataset(spark, rows, args.keys)
    results: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(servers("cproxy-spark-", None))[0].url
        # Warm up Python workers and the JVM so the first measurement is not penalised.
        warm = dataset(spark, 10_000, 100)
        write_with_options(warm, new_options(url), service_checked=True)
        warm.unpersist()
        # Spark side only: rows reaching Python with and without repartition+sort.
        plain_s, _ = timed(lambda: df.rdd.mapPartitionsWithIndex(count_rows).sum())
        sorted_s, _ = timed(
            lambda: prepare(df, "key", "seq").rdd.mapPartitionsWithIndex(count_rows).sum()
        )
        unordered_s, unordered = timed(
            lambda: unordered_write(df, new_options(url, batch_size=args.batch_size))
        )
        # A fresh topic per run, so every run really stores every row.
        topics: list[SinkOptions] = []

        def ordered_run() -> WriteSummary:
            topics.append(new_options(url, batch_size=args.batch_size))
            return write_with_options(df, topics[-1], service_checked=True)

        ordered_s, ordered = timed(ordered_run)
        rewrite_s, rewrite = timed(lambda: write_with_options(df, topics[-1], service_checked=True))
    spark.stop()
    if ordered.stored != rows or unordered.stored != rows or rewrite.duplicates != rows:
        raise RuntimeError(f"rows lost or stored twice: {ordered} {unordered} {rewrite}")
    results.update(
        machine=facts,
        rows=rows,
        keys=args.keys,
        best_of=REPEAT,
        spark_only_unordered_s=plain_s,
        spark_only_ordered_s=sorted_s,
        ordered_rows_per_s=rows / ordered_s,
        unordered_rows_per_s=rows / unordered_s,
        rewrite_rows_per_s=rows / rewrite_s,
        ordering_overhead_pct=100 * (ordered_s - unordered_s) / unordered_s,
    )
    text = "\n".join(
        [
            f"## Spark sink: {rows:,} rows over {args.keys:,} keys, batch_size "
            f"{args.batch_size}, local[2], best of {REPEAT}",
            "",
            f"- ordered write   {ordered_s:7.1f} s  {rows / ordered_s:10,.0f} rows/s",
            f"- unordered write {unordered_s:7.1f} s  {rows / unordered_s:10,.0f} rows/s",
            f"- rewrite (dups)  {rewrite_s:7.1f} s  {rows / rewrite_s:10,.0f} rows/s",
            f"- ordering overhead: {results['ordering_overhead_pct']:+.1f}% (Spark side "
            f"alone: {plain_s:.1f} s unordered vs {sorted_s:.1f} s ordered)",
        ]
    )
    finish(results, args, "spark_sink", text)


if __name__ == "__main__":
    main()
