"""Spark sink: the ordered write's rows/s against Spark's own limits, in the same rounds.

On ``local[2]`` against a real ``cproxy serve`` (a subprocess, SQLite store), per
size (default 200k rows over 10k keys, ~170-byte messages), session start-up and a warm-up
write excluded; each run in rotating order per round, medians and each rate's ratio to
Parquet's in the same round:

- ``sink``: ``write_dataframe`` with key and order columns (repartition by key + sort +
  ordered batches, the Arrow path) into a fresh topic per run, so dedup never short-cuts it;
- ``parquet``: the same DataFrame with the same repartition and sort written to Parquet;
- ``to python``: the same repartitioned and sorted rows reaching a Python worker through
  Arrow and counted there: what feeding the sink costs Spark, nothing sent.

Needs pyspark, pyarrow, pandas and Java 17.

    python -m benchmarks.spark_sink --quick                 # 50k rows, 1 round
    python -m benchmarks.spark_sink --rounds 3 --json spark.json
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.harness.report import (
    arg_parser,
    finish,
    load_average,
    machine_facts,
    median,
    progress,
    table,
)
from benchmarks.harness.server import servers
from spark_sink import SinkOptions, prepare
from spark_sink.producer import check_service
from spark_sink.writer import write_with_options


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


def new_options(url: str, **changes: Any) -> SinkOptions:
    """Options for the benchmark's writes into a fresh topic (created here)."""
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


def count_batches(batches: Iterable[Any]) -> Iterator[Any]:
    """In the Python worker: the rows Spark fed it through Arrow, counted."""
    import pyarrow as pa

    yield pa.RecordBatch.from_pylist([{"rows": sum(b.num_rows for b in batches)}])


def to_python(df: Any) -> int:
    counted = prepare(df, "key", "seq").mapInArrow(count_batches, "rows long").collect()
    return int(sum(r["rows"] for r in counted))


def measurements(
    df: Any, url: str, args: Any, scratch: Path
) -> dict[str, Callable[[], tuple[int, int]]]:
    """Name -> a run returning (rows handled, rows expected)."""
    rows = df.count()

    def sink() -> tuple[int, int]:
        options = new_options(url, batch_size=args.batch_size)
        return write_with_options(df, options, service_checked=True).stored, rows

    def parquet() -> tuple[int, int]:
        target = scratch / uuid.uuid4().hex
        prepare(df, "key", "seq").write.parquet(str(target))
        shutil.rmtree(target, ignore_errors=True)
        return rows, rows

    return {"sink": sink, "parquet": parquet, "to python": lambda: (to_python(df), rows)}


def run_size(spark: Any, url: str, args: Any, size: int, scratch: Path) -> list[dict[str, Any]]:
    df = dataset(spark, size, args.keys)
    runs = measurements(df, url, args, scratch)
    names = list(runs)
    rates: dict[str, list[float]] = {n: [] for n in names}
    to_parquet: dict[str, list[float]] = {n: [] for n in names}
    for rnd in range(args.rounds):
        shift = rnd % len(names)
        this_round: dict[str, float] = {}
        for name in [*names[shift:], *names[:shift]]:
            started = time.perf_counter()
            handled, expected = runs[name]()
            seconds = time.perf_counter() - started
            if handled != expected:
                raise RuntimeError(f"{name}: {handled} rows handled, expected {expected}")
            this_round[name] = size / seconds
            progress(
                f"{size:,} rows round {rnd + 1} {name:22s} {size / seconds:10,.0f} rows/s "
                f"({seconds:.1f} s, load {load_average()})"
            )
        for name in names:
            rates[name].append(this_round[name])
            to_parquet[name].append(this_round[name] / this_round["parquet"])
    df.unpersist()
    return [
        {
            "rows": size,
            "measurement": name,
            "rows_per_s": median(rates[name]),
            "min": min(rates[name]),
            "max": max(rates[name]),
            "of_parquet": median(to_parquet[name]),
            "runs": rates[name],
        }
        for name in names
    ]


def main() -> None:
    parser = arg_parser(__doc__, "50k rows, 1 round")
    parser.add_argument("--sizes", default=None, help="rows per size (default 200000)")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --quick)")
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    sizes = [int(s) for s in (args.sizes or ("50000" if args.quick else "200000")).split(",")]
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
    results: list[dict[str, Any]] = []
    scratch = Path(tempfile.mkdtemp(prefix="cproxy-spark-parquet-"))
    try:
        with servers("cproxy-spark-") as (server,):
            url = server.url
            # Warm up the JVM, the Python workers and both write paths (not measured).
            warm = dataset(spark, 10_000, 100)
            write_with_options(warm, new_options(url), service_checked=True)
            warm.write.parquet(str(scratch / "warm"))
            warm.unpersist()
            for size in sizes:
                results += run_size(spark, url, args, size, scratch)
    finally:
        spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    out = {"machine": facts, "keys": args.keys, "rounds": args.rounds, "results": results}
    text = "\n".join(
        [
            f"## Spark sink: local[2], {args.keys:,} keys, batch_size {args.batch_size}, "
            f"medians of {args.rounds} round(s)",
            "",
            table(
                [
                    ("rows", lambda r: f"{r['rows']:,}"),
                    ("measurement", lambda r: r["measurement"]),
                    ("rows/s", lambda r: f"{r['rows_per_s']:,.0f}"),
                    ("min - max", lambda r: f"{r['min']:,.0f} - {r['max']:,.0f}"),
                    ("of parquet (same round)", lambda r: f"{r['of_parquet']:.2f}"),
                ],
                results,
            ),
        ]
    )
    finish(out, args, "spark_sink", text)


if __name__ == "__main__":
    main()
