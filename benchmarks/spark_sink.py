"""Spark sink throughput: rows/s into cproxy, and what per-key ordering costs.

Measures on ``local[2]`` against a real ``cproxy serve`` (started here in a temp dir unless
``--url`` is given), each run into a fresh topic so dedup never short-cuts the work:

- ``ordered``: ``write_dataframe`` (repartition by key + sort + ordered batches);
- ``unordered``: the same partition writer on the input partitions as they are;
- ``rewrite``: the ordered write again into the same topic (everything a duplicate);
- ``spark only``: the Spark side alone (prepare or not, then iterate the rows in Python),
  which isolates the shuffle+sort cost from HTTP and the server.

A small warm-up write runs first. On a shared 2-core machine the numbers move with whatever
else runs; compare runs made back to back.

Usage: ``python benchmarks/spark_sink.py [--quick] [--rows N] [--repeat N] [--url URL] [--json]``
(1M rows by default, 100k with ``--quick``; the fastest of ``--repeat`` runs counts).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

# This script is named like the package it measures: run as a file, its own directory would
# come first on sys.path and shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from spark_sink import SinkOptions, WriteSummary, prepare  # noqa: E402
from spark_sink.producer import check_service  # noqa: E402
from spark_sink.rowjson import RowEncoder  # noqa: E402
from spark_sink.writer import PartitionJob, write_with_options  # noqa: E402


@contextmanager
def server(url: str | None) -> Iterator[str]:
    """The given URL, or a fresh ``cproxy serve`` on a free port in a temp dir."""
    if url:
        yield url
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    data_dir = tempfile.mkdtemp(prefix="cproxy-bench-")
    cli = shutil.which("cproxy", path=str(Path(sys.executable).parent)) or "cproxy"
    process = subprocess.Popen(
        [cli, "serve", "--port", str(port), "--data-dir", data_dir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    local = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{local}/healthz", timeout=1.0).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise SystemExit("cproxy serve did not start") from None
                time.sleep(0.2)
        yield local
    finally:
        process.terminate()
        process.wait(60)
        shutil.rmtree(data_dir, ignore_errors=True)


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
    parser = argparse.ArgumentParser(description="Spark sink throughput")
    parser.add_argument("--quick", action="store_true", help="100k rows instead of 1M")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--url", default=None, help="use this server instead of starting one")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="runs per measurement, fastest counts (default: 3 quick, 1 full)",
    )
    args = parser.parse_args()
    global REPEAT  # noqa: PLW0603 (a script-wide setting, set once here)
    REPEAT = args.repeat or (3 if args.quick else 1)
    rows = args.rows or (100_000 if args.quick else 1_000_000)

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
    results: dict[str, float] = {}
    with server(args.url) as url:
        # Warm up Python workers and the JVM so the first measurement is not penalised.
        warm = dataset(spark, 10_000, 100)
        write_with_options(warm, new_options(url), service_checked=True)
        warm.unpersist()
        # Spark side only: rows reaching Python with and without repartition+sort.
        plain_s, _ = timed(lambda: df.rdd.mapPartitionsWithIndex(count_rows).sum())
        sorted_s, _ = timed(
            lambda: prepare(df, "key", "seq").rdd.mapPartitionsWithIndex(count_rows).sum()
        )
        results["spark_only_unordered_s"] = plain_s
        results["spark_only_ordered_s"] = sorted_s

        unordered_s, unordered = timed(
            lambda: unordered_write(df, new_options(url, batch_size=args.batch_size))
        )
        # A fresh topic per run, so every run really stores every row.
        topics: list[SinkOptions] = []

        def ordered_run() -> WriteSummary:
            topics.append(new_options(url, batch_size=args.batch_size))
            return write_with_options(df, topics[-1], service_checked=True)

        ordered_s, ordered = timed(ordered_run)
        ordered_options = topics[-1]
        rewrite_s, rewrite = timed(
            lambda: write_with_options(df, ordered_options, service_checked=True)
        )
    assert ordered.stored == rows and unordered.stored == rows, (ordered, unordered)
    assert rewrite.duplicates == rows, rewrite
    results.update(
        rows=rows,
        ordered_s=ordered_s,
        unordered_s=unordered_s,
        rewrite_s=rewrite_s,
        ordered_rows_per_s=rows / ordered_s,
        unordered_rows_per_s=rows / unordered_s,
        rewrite_rows_per_s=rows / rewrite_s,
        ordering_overhead_pct=100 * (ordered_s - unordered_s) / unordered_s,
    )
    spark.stop()
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"rows: {rows:,} over {args.keys:,} keys, batch_size {args.batch_size}, local[2], "
        f"best of {REPEAT}"
    )
    print(f"  ordered write   {ordered_s:7.1f}s  {rows / ordered_s:10,.0f} rows/s")
    print(f"  unordered write {unordered_s:7.1f}s  {rows / unordered_s:10,.0f} rows/s")
    print(f"  rewrite (dups)  {rewrite_s:7.1f}s  {rows / rewrite_s:10,.0f} rows/s")
    print(
        f"  ordering overhead: {results['ordering_overhead_pct']:+.1f}% "
        f"(spark side alone: {plain_s:.1f}s unordered vs {sorted_s:.1f}s ordered)"
    )


if __name__ == "__main__":
    main()
