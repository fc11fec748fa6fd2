"""Latency under load: send -> delivery p50 / p99 / p99.9 with an open-loop producer at 25, 50
and 90 % of cproxy's peak, for cproxy, the floor and Redis Streams at the same rates.

- *cproxy*: ``cproxy serve`` (SQLite), a topic of 8 queues, a group with ``order_by: key``;
- *floor*: a bare uvicorn ASGI app with an in-memory FIFO (``harness/floor.py``) driven by
  the same Python client code: the least a Python HTTP service takes on this machine;
- *redis*: Redis Streams, a stream per partition (murmur2 of the key, as cproxy places it),
  redis-py with hiredis, XREADGROUP with XACKs riding on the next read.

Every system gets the same load from this process: 1,000 keys, ~100-byte JSON bodies that
carry their send time, produce batches of 20 sent on schedule (never waiting for answers), 4
pullers (at most 100 messages per pull, long polls of 5 s; Redis: each puller reads 2 streams,
blocking up to 1 s, within redis-py's socket timeout). Latency = the moment a puller has
parsed the answer - the send time. The peak is cproxy's closed-loop rate on the same setup
(4 producers); the rates are 25/50/90 % of ``min(peak, --peak-cap)`` (default 40,000: at
most 20k msgs/s at 50 %). Rounds run every rate and system in rotating order; the report
gives medians per point.

With ``--ab REF`` a second cproxy server, from git REF (*cproxy B*), takes the same points,
interleaved with the others. Under the table, each cproxy server's p99 is divided by the
floor's p99 of the same round (median, min and max over the rounds).

    python -m benchmarks.latency --quick                  # 2 s per point, 1 round
    python -m benchmarks.latency --seconds 10 --rounds 3 --json latency.json
    python -m benchmarks.latency --ab 267452d --systems cproxy,floor
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from benchmarks.harness.load import (
    OpenLoopResult,
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
from benchmarks.harness.probe import Probe
from benchmarks.harness.report import (
    arg_parser,
    finish,
    load_average,
    machine_facts,
    median,
    percentiles,
    progress,
    table,
)
from benchmarks.harness.server import missing, peer_process
from benchmarks.harness.server import servers as servers_under_test
from consumer_sdk import AsyncClient
from cproxy.placement import queue_for_key

KEYS, BATCH, PULLERS, QUEUES, BODY_BYTES, WAIT_MS = 1_000, 20, 4, 8, 100, 5_000
FRACTIONS = (0.25, 0.5, 0.9)


async def peak(url: str, admin: AsyncClient, messages: int, tag: str) -> float:
    """cproxy's closed-loop msgs/s on the latency setup (first produce -> last delivery)."""
    topic = f"peak-{tag}"
    await create_topic(admin, topic, QUEUES)
    await put_group(admin, topic, topic, "key")
    t0 = time.perf_counter()
    consumer = asyncio.create_task(consume(url, topic, messages, PULLERS, 100, wait_ms=WAIT_MS))
    batches = make_batches(messages, BATCH, KEYS, BODY_BYTES)
    await produce(url, topic, batches, 4, key_stride(BATCH, KEYS))
    seconds = (await consumer).done_at - t0
    await delete_group(admin, topic)
    return messages / seconds


def _point(
    rate: float, sent: OpenLoopResult, delivered: int, latencies: list[float], p: Probe
) -> dict[str, Any]:
    return {
        "target_rate": round(rate),
        "achieved_rate": round(sent.messages / sent.seconds),
        "messages": sent.messages,
        "delivered": delivered,
        "late_batches": sent.late_batches,
        "send_to_delivery_ms": percentiles(latencies, 2),
        "server_cpu_us_per_msg": round(p.server_cpu / max(delivered, 1) * 1e6, 1),
        "load_1m": load_average(),
    }


async def http_run(
    url: str, pid: int, admin: AsyncClient | None, rate: float, seconds: float, tag: str
) -> dict[str, Any]:
    """One point against cproxy (``admin`` makes its topic and group) or the floor (None)."""
    topic = f"lat-{tag}"
    if admin is not None:
        await create_topic(admin, topic, QUEUES)
        await put_group(admin, topic, topic, "key")
    expected = max(1, round(seconds * rate / BATCH)) * BATCH
    with Probe(pid) as p:
        consumer = asyncio.create_task(
            consume(url, topic, expected, PULLERS, 100, wait_ms=WAIT_MS, record_latency=True,
                    time_limit_s=seconds * 3 + 30)
        )  # fmt: skip
        await asyncio.sleep(0.5)  # the pullers are parked in their long polls
        sent = await open_loop_produce(url, topic, rate, BATCH, seconds, KEYS, BODY_BYTES)
        stats = await consumer
    if admin is not None:
        await delete_group(admin, topic)
    return _point(rate, sent, stats.delivered, stats.latencies_send_ms, p)


async def redis_run(
    address: str, pid: int, rate: float, seconds: float, tag: str
) -> dict[str, Any]:
    import redis.asyncio

    host, port = address.rsplit(":", 1)
    r = redis.asyncio.Redis(host=host, port=int(port), max_connections=64)
    streams = [f"{tag}-p{q}" for q in range(QUEUES)]
    for s in streams:
        await r.xgroup_create(s, "g", id="0", mkstream=True)
    expected = max(1, round(seconds * rate / BATCH)) * BATCH
    latencies: list[float] = []
    done = asyncio.Event()

    async def puller(mine: list[str]) -> None:
        acks: dict[str, list[bytes]] = {}
        while not done.is_set():
            pipe = r.pipeline(transaction=False)
            for s, ids in acks.items():
                pipe.xack(s, "g", *ids)
            pipe.xreadgroup("g", "c", dict.fromkeys(mine, ">"), count=100, block=1000)
            answer = (await pipe.execute())[-1]
            now, acks = time.time_ns(), {}
            for stream, entries in answer or ():
                for entry_id, fields in entries:
                    latencies.append((now - orjson.loads(fields[b"body"])["t"]) / 1e6)
                    acks.setdefault(stream.decode(), []).append(entry_id)
            if len(latencies) >= expected:
                done.set()

    async def send(batch: list[dict[str, Any]]) -> None:
        pipe = r.pipeline(transaction=False)
        for m in batch:
            stream = streams[queue_for_key(m["key"], QUEUES)]
            pipe.xadd(stream, {"key": m["key"], "body": orjson.dumps(m["body"])})
        await pipe.execute()

    async with r:
        with Probe(pid) as p:
            pullers = [asyncio.create_task(puller(streams[i::PULLERS])) for i in range(PULLERS)]
            await asyncio.sleep(0.5)
            # At most 56 calls outstanding: with the pullers', within the pool's 64 connections.
            sent = await open_loop_produce([], "", rate, BATCH, seconds, KEYS, BODY_BYTES, 56, send)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), seconds * 2 + 30)
            done.set()
            await asyncio.gather(*pullers)
        await r.delete(*streams)
    return _point(rate, sent, len(latencies), latencies, p)


async def run(
    args: Any, servers: dict[str, tuple[str, int]], admins: dict[str, AsyncClient]
) -> dict[str, Any]:
    """``admins``: a client per cproxy server (by system name), which makes its topics."""
    url = servers["cproxy"][0]
    top = await peak(url, admins["cproxy"], args.peak_messages, "0")
    progress(f"cproxy peak {top:,.0f} msgs/s (closed loop); load {load_average()}")
    rates = [f * min(top, args.peak_cap) for f in FRACTIONS]
    names = list(servers)
    points: dict[str, dict[str, list[dict[str, Any]]]] = {n: {} for n in names}
    for rnd in range(args.rounds):
        for i, rate in enumerate(rates):
            shift = (rnd + i) % len(names)
            for name in names[shift:] + names[:shift]:
                address, pid = servers[name]
                tag = f"r{rnd}-{i}"
                if name == "redis":
                    r = await redis_run(address, pid, rate, args.seconds, tag)
                else:
                    r = await http_run(address, pid, admins.get(name), rate, args.seconds, tag)
                points[name].setdefault(f"{FRACTIONS[i]:.0%}", []).append(r)
                q = r["send_to_delivery_ms"]
                progress(
                    f"round {rnd + 1} {FRACTIONS[i]:4.0%} {name:7s} {r['achieved_rate']:7,} msgs/s"
                    f" p50 {q['p50']} p99 {q['p99']} p99.9 {q['p999']} ms server "
                    f"{r['server_cpu_us_per_msg']} µs/msg load {r['load_1m']}"
                )
    return {"peak_msgs_per_s": round(top), "points": points}


def point_table(points: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """One row per (share of peak, system): medians over the rounds."""
    rows = [(f, n, rs) for n, by in points.items() for f, rs in by.items()]
    rows.sort(key=lambda row: (int(row[0].rstrip("%")), list(points).index(row[1])))

    def med(rs: list[dict[str, Any]], key: str, point: str = "") -> float:
        return median([float(r[key][point] if point else r[key]) for r in rs])

    def q(point: str) -> Callable[[Any], str]:
        return lambda row: f"{med(row[2], 'send_to_delivery_ms', point):.1f}"

    return table(
        [
            ("share of peak", lambda row: row[0]),
            ("system", lambda row: row[1]),
            ("msgs/s sent", lambda row: f"{med(row[2], 'achieved_rate'):,.0f}"),
            ("delivered", lambda row: f"{med(row[2], 'delivered'):,.0f}"),
            ("p50 ms", q("p50")),
            ("**p99 ms**", q("p99")),
            ("p99.9 ms", q("p999")),
            ("max ms", q("max")),
            ("server CPU µs/msg", lambda row: f"{med(row[2], 'server_cpu_us_per_msg'):.1f}"),
            ("runs", lambda row: len(row[2])),
        ],
        rows,
    )


def floor_ratios(points: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """Each cproxy server's p99 over the floor's p99 of the same round, per share of peak."""
    rows = []
    for name in (n for n in points if n.startswith("cproxy")):
        for share, runs in points[name].items():
            floor_runs = points["floor"][share]
            ratios = [
                r["send_to_delivery_ms"]["p99"] / max(f["send_to_delivery_ms"]["p99"], 1e-9)
                for r, f in zip(runs, floor_runs, strict=True)
            ]
            rows.append((share, name, median(ratios), min(ratios), max(ratios)))
    return table(
        [
            ("share of peak", lambda row: row[0]),
            ("system", lambda row: row[1]),
            ("**p99 / floor's p99**, median", lambda row: f"{row[2]:.2f}"),
            ("min", lambda row: f"{row[3]:.2f}"),
            ("max", lambda row: f"{row[4]:.2f}"),
        ],
        rows,
    )


def main() -> None:
    parser = arg_parser(__doc__, "2 s per point, 1 round, a 20,000-message peak", ab=True)
    parser.add_argument("--seconds", type=float, help="per point (default 10; 2 quick)")
    parser.add_argument("--rounds", type=int, help="default 3 (1 quick)")
    parser.add_argument("--peak-cap", type=float, default=40_000, help="msgs/s (40,000)")
    parser.add_argument("--systems", default="cproxy,floor,redis", help="subset, comma-separated")
    args = parser.parse_args()
    args.seconds = args.seconds or (2.0 if args.quick else 10.0)
    args.rounds = args.rounds or (1 if args.quick else 3)
    # Long enough to be a sustained rate: over half a second the peak reads high.
    args.peak_messages = 20_000 if args.quick else 150_000
    wanted = args.systems.split(",")
    skipped = {"redis": why} if "redis" in wanted and (why := missing("redis")) else {}
    facts = machine_facts()
    root = Path(tempfile.mkdtemp(prefix="cproxy-latency-"))
    try:
        with contextlib.ExitStack() as stack:
            cproxies = stack.enter_context(servers_under_test("cproxy-latency-", args.ab))
            names = {"A": "cproxy", "B": "cproxy B"}
            systems = {names[s.source.label]: (s.url, s.pid) for s in cproxies}
            for name in ("floor", "redis"):
                if name in wanted and name not in skipped:
                    systems[name] = stack.enter_context(peer_process(name, root / name))

            async def go() -> dict[str, Any]:
                async with contextlib.AsyncExitStack() as clients:
                    admins = {
                        names[s.source.label]: await clients.enter_async_context(client(s.url))
                        for s in cproxies
                    }
                    return await run(args, systems, admins)

            out = run_loop(go)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    commits = {names[s.source.label]: s.source.commit for s in cproxies}
    out |= {"machine": facts, "commit": commits["cproxy"], "commits": commits, "skipped": skipped}
    against = f", cproxy B {commits['cproxy B']}" if "cproxy B" in commits else ""
    text = [
        f"## Latency under load (cproxy {out['commit']}{against}; peak "
        f"{out['peak_msgs_per_s']:,} msgs/s closed loop; {args.seconds:g} s per point; "
        f"medians of {args.rounds} round(s))",
        "",
        point_table(out["points"]),
        *(f"\n- skipped {name}: {why}" for name, why in skipped.items()),
    ]
    if "floor" in out["points"]:
        text += ["", floor_ratios(out["points"])]
    finish(out, args, "latency", "\n".join(text))


if __name__ == "__main__":
    main()
