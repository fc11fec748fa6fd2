"""Ride events end to end: Spark computes per-ride results, cproxy delivers them in order.

1. Generate ride events (call, pickup, pay) for many riders, deliberately shuffled.
2. Spark aggregates per ride (wait time, trip time, fare) and attaches the totals to
   every event of the ride.
3. ``spark_sink.write_dataframe`` writes one message per event, keyed by ride, ordered by
   event time; running it twice stores nothing new (deterministic ids).
4. A tiny httpx loop consumes the topic with ``order_by: key`` and checks that every ride
   arrives as call -> pickup -> pay.

Run against a local server (``cproxy serve`` in another terminal; ``--url`` defaults to
``$CPROXY_URL``, else http://127.0.0.1:9713)::

    python examples/spark_rides.py

or let the example start a throwaway server itself::

    python examples/spark_rides.py --start-server

It writes to its own topic ``spark-rides`` (not the README tour's ``rides``, whose messages
would fail the order check), so it runs on the same server as the other examples. Run it
again with the same arguments and it stores nothing new; other ``--riders`` or ``--seed``
values compute other events for the same ride ids, so give them their own ``--topic``.

Spark executors run ``PYSPARK_PYTHON``; this script sets it to its own interpreter (unless
already set) so the executors can import ``spark_sink`` (see docs/spark.md).
"""

# An example talks to its user: printing is its job.
# ruff: noqa: T201

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

import spark_sink

EVENTS = ("call", "pickup", "pay")


def ride_events(spark: Any, riders: int, rides_per_rider: int, seed: int) -> Any:
    """One row per event, shuffled: (rider_id, ride_id, event, event_time, fare_cents)."""
    from pyspark.sql import functions as F

    rides = spark.range(riders * rides_per_rider).select(
        (F.col("id") % riders).alias("rider"),
        F.col("id").alias("ride"),
        # Rides start within one day; pickup 1-10 min after the call, drop-off 5-45 min later.
        (F.lit(1_714_550_400) + (F.rand(seed) * 86_400).cast("long")).alias("t_call"),
        (60 + F.rand(seed + 1) * 540).cast("long").alias("wait_s"),
        (300 + F.rand(seed + 2) * 2_400).cast("long").alias("trip_s"),
    )
    events = rides.select(
        F.format_string("rider-%d", "rider").alias("rider_id"),
        F.format_string("ride-%d", "ride").alias("ride_id"),
        F.explode(
            F.array(
                F.struct(F.lit("call").alias("event"), F.col("t_call").alias("t")),
                F.struct(
                    F.lit("pickup").alias("event"), (F.col("t_call") + F.col("wait_s")).alias("t")
                ),
                F.struct(
                    F.lit("pay").alias("event"),
                    (F.col("t_call") + F.col("wait_s") + F.col("trip_s")).alias("t"),
                ),
            )
        ).alias("e"),
        "trip_s",
    ).select(
        "rider_id",
        "ride_id",
        F.col("e.event").alias("event"),
        F.timestamp_seconds(F.col("e.t")).alias("event_time"),
        F.when(
            F.col("e.event") == "pay", ((250 + F.col("trip_s") * 2) / 100).cast("decimal(10,2)")
        ).alias("fare"),
    )
    # A real job would read these from storage in no particular order.
    return events.orderBy(F.rand(seed + 3))


def per_ride_results(events: Any) -> Any:
    """Attach per-ride aggregates to each event: what downstream consumers want to see."""
    from pyspark.sql import functions as F

    per_ride = events.groupBy("ride_id").agg(
        F.min("event_time").alias("called_at"),
        (
            F.max(F.when(F.col("event") == "pickup", F.col("event_time")).cast("long"))
            - F.min("event_time").cast("long")
        ).alias("wait_s"),
        (F.max("event_time").cast("long") - F.min("event_time").cast("long")).alias("ride_s"),
        F.sum("fare").alias("ride_fare"),
    )
    return events.join(per_ride, "ride_id").select(
        "ride_id",
        "rider_id",
        "event",
        "event_time",
        "fare",
        F.struct("called_at", "wait_s", "ride_s", "ride_fare").alias("ride"),
    )


def consume_in_order(url: str, topic: str, expected: int, timeout_s: float = 120.0) -> None:
    """Pull with ``order_by: key`` and check each ride arrives as call -> pickup -> pay."""
    group = f"rides-demo-{int(time.time())}"
    with httpx.Client(base_url=url, timeout=40.0) as client:
        client.put(
            f"/v1/groups/{group}", json={"topics": {topic: {"order_by": "key"}}}
        ).raise_for_status()
        seen: dict[str, list[str]] = {}
        received = 0
        acks: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while received < expected and time.monotonic() < deadline:
            reply = (
                client.post(
                    f"/v1/groups/{group}/pull",
                    json={"max_messages": 500, "wait_ms": 1000, "results": acks},
                )
                .raise_for_status()
                .json()
            )
            by_queue: dict[int, list[int]] = {}
            for message in reply["messages"]:
                seen.setdefault(message["key"], []).append(message["body"]["event"])
                by_queue.setdefault(message["qid"], []).append(message["offset"])
                if received < 3:
                    print("  ", message["key"], message["body"])
                received += 1
            acks = [{"topic": topic, "qid": q, "acks": o} for q, o in by_queue.items()]
        client.post(f"/v1/groups/{group}/ack", json={"results": acks})
        client.delete(f"/v1/groups/{group}")
    bad = [ride for ride, events in seen.items() if tuple(events) != EVENTS]
    print(f"consumed {received} messages for {len(seen)} rides; out of order: {len(bad)}")
    if received != expected or bad:
        raise SystemExit(f"FAILED: expected {expected} messages in order, rides wrong: {bad[:5]}")
    print("every ride arrived as call -> pickup -> pay")


@contextmanager
def local_server(start: bool, url: str) -> Iterator[str]:
    """Yield the server URL, starting ``cproxy serve`` in a temp dir when asked."""
    if not start:
        yield url
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    data_dir = tempfile.mkdtemp(prefix="cproxy-rides-")
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
        print(f"started cproxy at {local} (data in {data_dir})")
        yield local
    finally:
        process.terminate()
        process.wait(30)
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("CPROXY_URL", "http://127.0.0.1:9713"))
    parser.add_argument("--topic", default="spark-rides")
    parser.add_argument("--riders", type=int, default=500)
    parser.add_argument("--rides-per-rider", type=int, default=4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--start-server",
        action="store_true",
        help="start a throwaway `cproxy serve` instead of using --url",
    )
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("spark-rides")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    with local_server(args.start_server, args.url) as url:
        results = per_ride_results(
            ride_events(spark, args.riders, args.rides_per_rider, args.seed)
        ).cache()
        total = results.count()
        print(f"computed {total} ride events; writing to {url} topic {args.topic!r}")
        started = time.monotonic()
        summary = spark_sink.write_dataframe(
            results,
            url,
            args.topic,
            key_col="ride_id",
            order_col="event_time",
            create_topic_queues=8,
            headers={"source": "spark_rides"},
        )
        print(f"write: {summary} in {time.monotonic() - started:.1f}s")
        again = spark_sink.write_dataframe(
            results, url, args.topic, key_col="ride_id", order_col="event_time"
        )
        print(f"same write again: stored {again.stored}, duplicates {again.duplicates}")
        consume_in_order(url, args.topic, expected=summary.stored + summary.duplicates)
    spark.stop()


if __name__ == "__main__":
    main()
