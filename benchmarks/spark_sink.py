"""Spark sink: the ordered write's rows/s against Spark's own limits, in the same rounds.

On ``local[2]`` against a real ``cproxy serve`` (a subprocess, SQLite store), per
size (default 200k rows over 10k keys, ~170-byte messages), session start-up and a warm-up
write excluded; each run in rotating order per round, medians and each rate's ratio to
Parquet's in the same round:

- ``sink``: ``write_dataframe`` with key and order columns (repartition by key + sort +
  ordered batches, the Arrow path) into a fresh topic per run, so dedup never short-cuts it;
- ``parquet``: the same DataFrame with the same repartition and sort written to Parquet;
- ``to python``: the same repartitioned and sorted rows reaching a Python worker through
  Arrow and counted there: what feeding the sink costs Spark, nothing sent;
- ``sink, dedup off`` (with ``--without-dedup``): the same write into a second server whose
  dedup is off (``dedup_window_ms = 0``): what the server's dedup of the sink's ids costs.

What bounds each run: CPU seconds per 1,000 rows of Spark's JVM, of its Python workers
(the sink's encoding and HTTP client, or the counting) and of the server, against the 2
cores' capacity over the run's wall time; and for the sink, where its tasks' time went
(``WriteSummary``): waiting for Spark's rows, converting and encoding them, and waiting for
the server's acknowledgements, in µs per row (summed over tasks running side by side).
The warm-up runs each Python path with as many tasks as the measured runs, so no measured
run starts Python workers.

Needs pyspark, pyarrow, pandas and Java 17.

    python -m benchmarks.spark_sink --quick                 # 50k rows, 1 round
    python -m benchmarks.spark_sink --rounds 3 --json spark.json
    python -m benchmarks.spark_sink --rounds 5 --without-dedup
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from benchmarks.harness.probe import cpu_seconds
from benchmarks.harness.report import (
    Column,
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
from spark_sink.options import DEFAULT_BATCH_SIZE
from spark_sink.producer import check_service
from spark_sink.writer import write_with_options

#: A measurement's run: (rows handled, rows expected, the sink's summary or None).
Run = Callable[[], tuple[int, int, WriteSummary | None]]
#: The config of the ``--without-dedup`` server: it stores every message it is sent.
NO_DEDUP_CONFIG = "[server]\ndedup_window_ms = 0\n"


@dataclass
class Cpu:
    """CPU seconds (user + system) of Spark's JVM, of its Python workers (the JVM's
    descendants, which Spark keeps for reuse) and of the servers (summed: a run writes to
    one, the other idles), read before and after a run."""

    jvm: psutil.Process
    servers: list[psutil.Process]

    def read(self) -> dict[str, float]:
        workers = 0.0
        for child in self.jvm.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                workers += cpu_seconds(child)
        return {
            "jvm": cpu_seconds(self.jvm),
            "workers": workers,
            "server": sum(cpu_seconds(server) for server in self.servers),
        }


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


def measurements(df: Any, urls: list[str], args: Any, scratch: Path) -> dict[str, Run]:
    """Name -> a run returning (rows handled, rows expected, the sink's summary or None).
    ``urls``: the server, then the one with dedup off (``--without-dedup``) if any."""
    rows = df.count()

    def sink_into(url: str) -> Run:
        def sink() -> tuple[int, int, WriteSummary | None]:
            options = new_options(url, batch_size=args.batch_size)
            summary = write_with_options(df, options, service_checked=True)
            return summary.stored, rows, summary

        return sink

    def parquet() -> tuple[int, int, WriteSummary | None]:
        target = scratch / uuid.uuid4().hex
        prepare(df, "key", "seq").write.parquet(str(target))
        shutil.rmtree(target, ignore_errors=True)
        return rows, rows, None

    runs = {
        "sink": sink_into(urls[0]),
        "parquet": parquet,
        "to python": lambda: (to_python(df), rows, None),
    }
    if len(urls) > 1:
        runs["sink, dedup off"] = sink_into(urls[1])
    return runs


#: What the report shows per measurement, besides rows/s: CPU ms per 1,000 rows by process,
#: and the sink tasks' time split in µs per row.
CPU_PARTS = ("jvm", "workers", "server")
#: The first columns of both report tables: which run a row is.
LEAD_COLUMNS: tuple[Column, ...] = (
    ("rows", lambda r: f"{r['rows']:,}"),
    ("measurement", lambda r: r["measurement"]),
)
TASK_PARTS = ("input_ms", "encode_ms", "wait_ms")


def run_size(
    spark: Any, urls: list[str], args: Any, size: int, scratch: Path, cpu: Cpu
) -> list[dict[str, Any]]:
    df = dataset(spark, size, args.keys)
    # Unmeasured: the JVM compiles the shuffle and sort at this size for whichever run
    # comes first, which would otherwise always be the first round's first measurement.
    to_python(df)
    runs = measurements(df, urls, args, scratch)
    names = list(runs)
    rates: dict[str, list[float]] = {n: [] for n in names}
    to_parquet: dict[str, list[float]] = {n: [] for n in names}
    #: Per measurement and part: one value per round.
    usage: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    cores = os.cpu_count() or 1
    for rnd in range(args.rounds):
        shift = rnd % len(names)
        this_round: dict[str, float] = {}
        for name in [*names[shift:], *names[:shift]]:
            before = cpu.read()
            started = time.perf_counter()
            handled, expected, summary = runs[name]()
            seconds = time.perf_counter() - started
            after = cpu.read()
            if handled != expected:
                raise RuntimeError(f"{name}: {handled} rows handled, expected {expected}")
            this_round[name] = size / seconds
            parts = {p: (after[p] - before[p]) * 1e6 / size for p in CPU_PARTS}
            parts["busy"] = sum(after[p] - before[p] for p in CPU_PARTS) / (seconds * cores)
            if summary is not None:
                parts.update({p: getattr(summary, p) * 1e3 / size for p in TASK_PARTS})
            for part, value in parts.items():
                usage[name].setdefault(part, []).append(value)
            progress(
                f"{size:,} rows round {rnd + 1} {name:22s} {size / seconds:10,.0f} rows/s "
                f"({seconds:.1f} s, load {load_average()}; "
                + ", ".join(f"{p} {v:.2f}" for p, v in parts.items())
                + ")"
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
            # CPU in µs per row (= ms per 1,000 rows), "busy" the share of all cores used.
            **{part: median(values) for part, values in usage[name].items()},
        }
        for name in names
    ]


def warm_up(spark: Any, urls: list[str], scratch: Path) -> None:
    """Start the JVM's code paths and as many Python workers as the measured runs use (one
    per concurrent task: a measured run that had to start one would pay its start-up)."""
    warm = dataset(spark, 10_000, 100)
    tasks = int(spark.conf.get("spark.sql.shuffle.partitions"))
    for url in urls:
        write_with_options(warm, new_options(url, num_partitions=tasks), service_checked=True)
    prepare(warm, "key", "seq", tasks).mapInArrow(count_batches, "rows long").collect()
    warm.write.parquet(str(scratch / "warm"))
    warm.unpersist()


def main() -> None:
    parser = arg_parser(__doc__, "50k rows, 1 round")
    parser.add_argument("--sizes", default=None, help="rows per size (default 200000)")
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --quick)")
    parser.add_argument(
        "--without-dedup",
        action="store_true",
        help="also write into a second server with dedup off, in the same rounds",
    )
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
        with contextlib.ExitStack() as stack:
            started = [*stack.enter_context(servers("cproxy-spark-"))]
            if args.without_dedup:
                started += stack.enter_context(
                    servers("cproxy-spark-", config_toml=NO_DEDUP_CONFIG)
                )
            urls = [server.url for server in started]
            warm_up(spark, urls, scratch)
            # The gateway's process is spark-submit, which execs the JVM (same pid).
            gateway = spark.sparkContext._gateway
            assert gateway is not None, "no local JVM"
            jvm = psutil.Process(gateway.proc.pid)
            cpu = Cpu(jvm, [psutil.Process(server.pid) for server in started])
            for size in sizes:
                results += run_size(spark, urls, args, size, scratch, cpu)
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
                    *LEAD_COLUMNS,
                    ("rows/s", lambda r: f"{r['rows_per_s']:,.0f}"),
                    ("min - max", lambda r: f"{r['min']:,.0f} - {r['max']:,.0f}"),
                    ("of parquet (same round)", lambda r: f"{r['of_parquet']:.2f}"),
                ],
                results,
            ),
            "",
            "What bounds it: CPU ms per 1,000 rows by process, the share of the "
            f"{os.cpu_count()} cores busy over the run, and the sink tasks' time in µs per row "
            "(summed over tasks side by side; *wait*: for the server's acknowledgements "
            "beyond encoding the next batch)",
            "",
            table(
                [
                    *LEAD_COLUMNS,
                    ("JVM", lambda r: f"{r['jvm']:.1f}"),
                    ("Python workers", lambda r: f"{r['workers']:.1f}"),
                    ("server", lambda r: f"{r['server']:.1f}"),
                    ("cores busy", lambda r: f"{r['busy']:.0%}"),
                    ("task: input", lambda r: _task(r, "input_ms")),
                    ("encode", lambda r: _task(r, "encode_ms")),
                    ("wait", lambda r: _task(r, "wait_ms")),
                ],
                results,
            ),
        ]
    )
    finish(out, args, "spark_sink", text)


def _task(result: dict[str, Any], part: str) -> str:
    return f"{result[part]:.1f}" if part in result else "-"


if __name__ == "__main__":
    main()
