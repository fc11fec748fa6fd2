"""Spark sink throughput (issue 13): the ordered write against Spark's own limits, same run.

On ``local[2]`` against a real ``cproxy serve`` (started here in a temp dir unless ``--url``
is given), per size (default 200k and 1M rows over 10k keys, ~170-byte messages), with the
session start-up and a warm-up write excluded:

- ``sink``: ``write_dataframe`` with key and order columns (repartition by key + sort +
  ordered batches; the Arrow input path), into a fresh topic per run so dedup never
  short-cuts the work;
- ``sink, row path``: the same ordered write through the row path (``PartitionJob`` over
  ``rdd`` rows, what a schema the Arrow path does not take uses);
- ``parquet``: the same DataFrame written to Parquet (``df.write.parquet``): Spark's own
  limit on this machine;
- ``to python``: the repartitioned and sorted rows reaching a Python worker through Arrow
  and being counted there: what feeding the sink costs Spark.

``--before`` adds ``sink, as c416505``: the same write with the message ids of the sink
before id scheme 2 (``id_scheme=1``: no key digest before the row digest), which is all
that changed in the sink since; an A/B in the same run, on the same server.
``--extras`` adds the unordered write and the rewrite (every message a duplicate).

Every measurement runs once per round, in rotating order; the report gives medians and
each rate's ratio to Parquet's in the same round. Needs pyspark, pyarrow, pandas and Java 17.

    python -m benchmarks.spark_sink --quick       # 100k rows, 1 round
    python -m benchmarks.spark_sink --rounds 3 --json spark.json   # 200k and 1M rows
    python -m benchmarks.spark_sink --client-only    # the sink's own CPU per row, both paths
"""

from __future__ import annotations

import contextlib
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


def row_path_write(df: Any, options: SinkOptions, ordered: bool = True) -> WriteSummary:
    """The partition writer over ``rdd`` rows, after ``prepare`` unless not ``ordered``."""
    order_col = options.order_col if ordered else None
    encoder = RowEncoder(df.schema.jsonValue(), "key", options.id_cols, None, order_col)
    job = PartitionJob(options.replace(order_col=order_col), encoder)
    source = prepare(df, "key", "seq") if ordered else df
    return WriteSummary.total(source.rdd.mapPartitionsWithIndex(job).collect())


def count_batches(batches: Iterable[Any]) -> Iterator[Any]:
    import pyarrow as pa

    rows = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pylist([{"rows": rows}])


def to_python(df: Any) -> int:
    """Rows reaching Python through Arrow after repartition + sort (what the sink reads)."""
    counted = prepare(df, "key", "seq").mapInArrow(count_batches, "rows long").collect()
    return int(sum(r["rows"] for r in counted))


def measurements(
    df: Any, url: str, args: Any, scratch: Path
) -> dict[str, Callable[[], tuple[int, int]]]:
    """Name -> a run returning (rows handled, rows expected)."""
    rows = df.count()
    state: dict[str, SinkOptions] = {}

    def sink() -> tuple[int, int]:
        state["last"] = new_options(url, batch_size=args.batch_size)
        return write_with_options(df, state["last"], service_checked=True).stored, rows

    def sink_rows() -> tuple[int, int]:
        return row_path_write(df, new_options(url, batch_size=args.batch_size)).stored, rows

    def parquet() -> tuple[int, int]:
        target = scratch / uuid.uuid4().hex
        df.write.parquet(str(target))
        shutil.rmtree(target, ignore_errors=True)
        return rows, rows

    def sink_before() -> tuple[int, int]:
        options = new_options(url, batch_size=args.batch_size, id_scheme=1)
        return write_with_options(df, options, service_checked=True).stored, rows

    runs: dict[str, Callable[[], tuple[int, int]]] = {
        "sink": sink,
        **({"sink, as c416505": sink_before} if args.before else {}),
        "sink, row path": sink_rows,
        "parquet": parquet,
        "to python": lambda: (to_python(df), rows),
    }
    if args.extras:

        def unordered() -> tuple[int, int]:
            options = new_options(url, batch_size=args.batch_size)
            return row_path_write(df, options, ordered=False).stored, rows

        def rewrite() -> tuple[int, int]:
            if "last" not in state:
                sink()
            return write_with_options(df, state["last"], service_checked=True).duplicates, rows

        runs |= {"unordered (row path)": unordered, "rewrite (duplicates)": rewrite}
    return runs


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


def client_only(rows: int, keys: int, batch_size: int) -> list[dict[str, Any]]:
    """The sink's own cost per row, without Spark or a server: the same rows as
    :func:`dataset` through the row path (tuples) and the Arrow path (record batches of
    10,000, as Spark sends them), sent to an in-process endpoint that answers at once."""
    import datetime as dt
    from decimal import Decimal

    import httpx
    import orjson
    import pyarrow as pa

    from spark_sink.columns import ArrowRows
    from spark_sink.partition import PartitionWriter

    fields = [("id", "long"), ("key", "string"), ("seq", "long"), ("at", "timestamp")]
    fields += [("amount", "decimal(8,2)"), ("note", "string")]
    schema = {
        "type": "struct",
        "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields],
    }
    ids = sorted(range(rows), key=lambda i: (f"key-{i % keys}", i // keys))  # as prepared
    data = [
        (
            i,
            f"key-{i % keys}",
            i // keys,
            dt.datetime.fromtimestamp(1_714_550_400 + i, dt.UTC),
            Decimal(i % 1000) / 10,
            "payload-payload-payload",
        )
        for i in ids
    ]
    answer = orjson.dumps(
        {"results": [{"qid": 0, "offset": n, "duplicate": False} for n in range(batch_size)]}
    )

    def transport() -> httpx.MockTransport:
        return httpx.MockTransport(lambda request: httpx.Response(200, content=answer))

    options = SinkOptions.create(
        url="http://sink-bench", topic="t", key_col="key", order_col="seq", id_cols=("id",)
    )
    options = options.replace(batch_size=batch_size)
    encoder = RowEncoder(schema, "key", ("id",), None, "seq")
    types = [pa.int64(), pa.string(), pa.int64(), pa.timestamp("us", tz="UTC")]
    types += [pa.decimal128(8, 2), pa.string()]
    table_ = pa.Table.from_arrays(
        [pa.array(column, t) for column, t in zip(zip(*data, strict=True), types, strict=True)],
        names=[n for n, _ in fields],
    )
    batches = table_.to_batches(max_chunksize=10_000)
    out = []
    for name, run in (
        ("row path", lambda w: w.write(data)),
        ("arrow path", lambda w: w.write_converted(ArrowRows(schema, 2).rows(batches))),
    ):
        writer = PartitionWriter(options, encoder, transport=transport())
        wall, cpu = time.perf_counter(), time.process_time()
        run(writer)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        out.append({"path": name, "rows_per_s": rows / wall, "cpu_us_per_row": cpu / rows * 1e6})
        progress(f"client only, {name}: {rows / wall:,.0f} rows/s, {cpu / rows * 1e6:.1f} µs CPU")
    return out


def main() -> None:
    parser = arg_parser(__doc__, "100k rows, 1 round")
    parser.add_argument("--sizes", default=None, help="rows per size (default 200000,1000000)")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --quick)")
    parser.add_argument("--extras", action="store_true", help="also unordered and rewrite")
    parser.add_argument(
        "--before", action="store_true", help="also the sink as at c416505 (A/B in one run)"
    )
    parser.add_argument("--url", default=None, help="use this server instead of starting one")
    parser.add_argument(
        "--client-only", action="store_true", help="the sink's own cost per row (no Spark)"
    )
    args = parser.parse_args()
    if args.client_only:
        size = int((args.sizes or "200000").split(",")[0])
        rows = client_only(size, args.keys, args.batch_size)
        columns = [
            ("path", lambda r: r["path"]),
            ("rows/s (one thread)", lambda r: f"{r['rows_per_s']:,.0f}"),
            ("µs CPU per row", lambda r: f"{r['cpu_us_per_row']:.1f}"),
        ]
        header = f"## Spark sink, client only: {size:,} rows, batch_size {args.batch_size}"
        out = {"machine": machine_facts(), "client_only": rows}
        finish(out, args, "spark_sink", f"{header}\n\n{table(columns, rows)}")
        return
    args.rounds = args.rounds or (1 if args.quick else 3)
    sizes = [
        int(s) for s in (args.sizes or ("100000" if args.quick else "200000,1000000")).split(",")
    ]
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
        with contextlib.ExitStack() as stack:
            url = args.url or stack.enter_context(servers("cproxy-spark-", None))[0].url
            # Warm up the JVM, the Python workers and both write paths (not measured).
            warm = dataset(spark, 10_000, 100)
            write_with_options(warm, new_options(url), service_checked=True)
            row_path_write(warm, new_options(url))
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
