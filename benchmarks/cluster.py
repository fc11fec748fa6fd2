"""Cluster: one proxy on SQLite against one on PostgreSQL, 1, 2 and 3 proxies over one
PostgreSQL, and the hand-over of queues when a proxy joins or leaves under load.

Deployments (started once; ``harness/deploy.py``): ``sqlite-1``, ``pg-1``, ``pg-2``, ``pg-3``.

- **Throughput** (interleaved rounds; medians): a fresh topic of 8 queues and group per round,
  10k keys, 100-byte bodies, batch 100; 4 closed-loop producers and 6 pullers spread over the
  proxies. Server CPU = every proxy plus PostgreSQL and its backends, over the same span.
- **Latency**: open loop at ``--rate`` msgs/s in batches of 10, send -> delivery p50/p99.
- **Hand-over** (``pg-2`` + a joining proxy, ``harness/handover.py``): consumers hold every
  message ``--hold-ms`` before acking; a third proxy joins under load and gets SIGTERM 4 s
  later; per moved queue: releasing -> owned by its new owner; duplicates, missing, order.

    python -m benchmarks.cluster --quick                  # about 2 minutes
    python -m benchmarks.cluster --json cluster.json      # about 6 minutes
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.deploy import Deployment, deployed
from benchmarks.harness.handover import handover_run
from benchmarks.harness.load import (
    client,
    consume,
    create_topic,
    delete_group,
    key_stride,
    make_batches,
    open_loop_produce,
    produce,
    put_group,
    run_loop,
)
from benchmarks.harness.report import (
    arg_parser,
    finish,
    machine_facts,
    markdown_table,
    median,
    percentiles,
    progress,
    ratio,
)

SPECS = [("sqlite-1", 1, False), ("pg-1", 1, True), ("pg-2", 2, True), ("pg-3", 3, True)]
QUEUES = 8
KEYS = 10_000
BATCH = 100
PRODUCERS = 4
PULLERS = 6


async def setup(d: Deployment, topic: str, group: str) -> None:
    async with client(d.urls[0]) as admin:
        await create_topic(admin, topic, QUEUES)
        await put_group(admin, group, topic, "key")
    await asyncio.to_thread(d.wait_owned, topic, QUEUES)


async def throughput(d: Deployment, tag: str, n: int) -> dict[str, Any]:
    topic, group = f"t-{tag}", f"t-{tag}-g"
    await setup(d, topic, group)
    batches = make_batches(n, BATCH, KEYS, 100)
    cpu, pg_cpu = d.cpu(), d.pg_cpu()
    c0, p0 = cpu.seconds(), pg_cpu.seconds()
    t0 = time.perf_counter()
    consumer = asyncio.create_task(
        consume(d.urls, group, n, PULLERS, BATCH, wait_ms=1000, stop_parked=True)
    )
    await produce(d.urls, topic, batches, PRODUCERS, key_stride(BATCH, KEYS))
    stats = await consumer
    elapsed = stats.done_at - t0
    server_cpu = cpu.seconds() - c0
    database_cpu = pg_cpu.seconds() - p0
    async with client(d.urls[0]) as admin:
        await delete_group(admin, group)
    return {
        "msgs_per_s": round(n / elapsed),
        "server_cpu_us_per_msg": round(server_cpu / n * 1e6, 1),
        "msgs_per_server_cpu_s": round(n / max(server_cpu, 1e-9)),
        "server_cores": round(server_cpu / elapsed, 2),
        "database_cpu_us_per_msg": round(database_cpu / n * 1e6, 1),
        "order_violations": stats.order_violations,
        "redeliveries": stats.redeliveries,
        "msgs_per_pull": round(n / max(1, stats.pulls - stats.empty_pulls), 1),
    }


async def latency(d: Deployment, rate: int, seconds: float) -> dict[str, Any]:
    topic, group = "lat", "lat-g"
    await setup(d, topic, group)
    total = max(1, round(seconds * rate / 10)) * 10
    consumer = asyncio.create_task(
        consume(d.urls, group, total, PULLERS, 100, wait_ms=5000, record_latency=True)
    )
    await asyncio.sleep(0.5)  # the pullers are parked in their long polls
    sent = await open_loop_produce(d.urls, topic, rate, 10, seconds, 1000)
    stats = await asyncio.wait_for(consumer, 120)
    return {
        "rate": rate,
        "achieved_rate": round(sent.messages / sent.seconds),
        "send_to_delivery_ms": percentiles(stats.latencies_send_ms, 2),
        "order_violations": stats.order_violations,
    }


async def run(args: Any, deployments: list[Deployment]) -> dict[str, Any]:
    shapes = [(d.name, len(d.proxies), d.pg is not None) for d in deployments]
    out: dict[str, Any] = {"machine": machine_facts(), "deployments": shapes}
    n = 10_000 if args.quick else 30_000
    runs: dict[str, list[dict[str, Any]]] = {d.name: [] for d in deployments}
    for rnd in range(args.repeat if "throughput" in args.phases else 0):
        shift = rnd % len(deployments)
        order = deployments[shift:] + deployments[:shift]
        for d in order if rnd % 2 == 0 else list(reversed(order)):
            r = await throughput(d, f"r{rnd}", n)
            runs[d.name].append(r)
            progress(
                f"round {rnd + 1} {d.name:8s} {r['msgs_per_s']:7,} msgs/s "
                f"{r['server_cpu_us_per_msg']:6.1f} µs CPU/msg ({r['server_cores']} cores; "
                f"database {r['database_cpu_us_per_msg']} µs/msg; "
                f"{r['msgs_per_pull']} msgs per pull)"
            )
    out["throughput"] = runs
    out["latency"] = {}
    for d in deployments if "latency" in args.phases else ():
        out["latency"][d.name] = await latency(d, args.rate, args.latency_seconds)
        progress(f"latency {d.name}: {out['latency'][d.name]}")
    pg2 = next(d for d in deployments if d.name == "pg-2")
    out["handover"] = []
    for rnd in range(args.handovers if "handover" in args.phases else 0):
        r = await handover_run(pg2, f"h{rnd}", args.hold_ms, args.handover_rate)
        out["handover"].append(r)
        progress(
            f"hand-over {rnd + 1}: join {r['join_handover_ms']} leave {r['leave_handover_ms']} "
            f"dups {r['duplicates']} missing {r['missing']} order {r['order_violations']}"
        )
    return out


def report(out: dict[str, Any]) -> str:
    runs = out["throughput"]
    if not all(runs.values()) or not out["latency"]:
        return handover_table(out)

    def med(name: str, key: str) -> float:
        return median([r[key] for r in runs[name]])

    base_rate, base_cpu = med("pg-1", "msgs_per_s"), med("pg-1", "server_cpu_us_per_msg")
    rows = []
    for name in runs:
        lat = out["latency"][name]["send_to_delivery_ms"]
        rows.append(
            [
                name, len(runs[name]), round(med(name, "msgs_per_s")),
                round(ratio(med(name, "msgs_per_s"), med("sqlite-1", "msgs_per_s")), 2),
                med(name, "server_cpu_us_per_msg"), med(name, "database_cpu_us_per_msg"),
                round(ratio(med(name, "server_cpu_us_per_msg"), base_cpu), 2),
                round(med(name, "msgs_per_server_cpu_s")), med(name, "server_cores"),
                lat["p50"], lat["p99"],
                sum(r["order_violations"] for r in runs[name]),
            ]
        )  # fmt: skip
    headers = [
        "deployment", "rounds", "e2e msgs/s", "vs sqlite-1", "server µs CPU/msg",
        "of which PostgreSQL", "CPU/msg vs pg-1", "msgs per server CPU-s", "server cores busy",
        f"p50 ms at {out['latency']['pg-1']['rate']}/s", "p99 ms", "order violations",
    ]  # fmt: skip
    lines = [
        markdown_table(headers, rows),
        "",
        f"pg-1 / sqlite-1 end to end: {ratio(base_rate, med('sqlite-1', 'msgs_per_s')):.2f}",
        "",
    ]
    return "\n".join([*lines, handover_table(out)])


def handover_table(out: dict[str, Any]) -> str:
    headers = [
        "run", "hold ms", "heartbeat ms", "queues moved (join/leave)",
        "join: release->owned p50/max ms", "leave: release->owned p50/max ms",
        "join->all moved s", "SIGTERM->all moved s", "duplicates", "missing", "order violations",
    ]  # fmt: skip
    ho_rows = [
        [i + 1, r["hold_ms"], r["heartbeat_ms"],
         f"{len(r['join_moves'])}/{len(r['leave_moves'])}",
         f"{r['join_handover_ms']['p50']}/{r['join_handover_ms']['max']}",
         f"{r['leave_handover_ms']['p50']}/{r['leave_handover_ms']['max']}",
         r["join_done_s"], r["leave_done_s"], r["duplicates"], r["missing"],
         r["order_violations"]]
        for i, r in enumerate(out["handover"])
    ]  # fmt: skip
    return markdown_table(headers, ho_rows) if ho_rows else ""


def main() -> None:
    parser = arg_parser(__doc__, "10k messages per round, 3 rounds, 1 hand-over run")
    parser.add_argument("--repeat", type=int, default=None, help="throughput rounds (5; quick 3)")
    parser.add_argument("--rate", type=int, default=1000, help="latency phase msgs/s (1000)")
    parser.add_argument("--latency-seconds", type=float, default=None, help="(10; quick 5)")
    parser.add_argument("--hold-ms", type=int, default=300, help="consumer handler time (300)")
    parser.add_argument("--handover-rate", type=int, default=500, help="msgs/s while moving")
    parser.add_argument("--handovers", type=int, default=None, help="hand-over runs (3; quick 1)")
    parser.add_argument(
        "--phases", default="throughput,latency,handover", help="which phases to run (all)"
    )
    args = parser.parse_args()
    args.repeat = args.repeat or (3 if args.quick else 5)
    args.latency_seconds = args.latency_seconds or (5.0 if args.quick else 10.0)
    args.handovers = args.handovers or (1 if args.quick else 3)
    root = Path(tempfile.mkdtemp(prefix="cproxy-cluster-bench-"))
    try:
        with deployed(root, SPECS) as deployments:
            out = run_loop(lambda: run(args, deployments))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    finish(out, args, "cluster", report(out))


if __name__ == "__main__":
    main()
