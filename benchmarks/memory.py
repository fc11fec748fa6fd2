"""Server memory: resident set (psutil) versus buffered messages, versus distinct keys, and
over time during a stall with a small ``max_buffered``.

1. *Populate*: the topics are appended straight into a SQLite data dir with the store API
   (1M messages through HTTP would take minutes); ~100 B bodies, key ``k{i % keys}``,
   8 queues.
2. *Buffered sweep* and *keys sweep*: per point a fresh ``cproxy serve`` on that data dir;
   RSS idle, then a group (order_by key) with ``max_buffered = N``, RSS again once
   ``buffered == N``; the difference / N is the cost per buffered message. *anon* (RSS -
   shared: without SQLite's mmap and libraries) is the heap. Keys-sweep points up to
   ``--drain-max`` keys are then drained over HTTP and RSS read again.
3. *Stall over time*: a fresh server; an open-loop producer sends ``--rate`` msgs/s over
   1,000 keys for ``--seconds``; 4 pullers ack all but the 1 % stalled keys (never-ack /
   always-fail as in ``isolation``); the group has ``max_buffered = --stall-buffer``. Every
   0.5 s: RSS, anon, the group's stats and its persisted progress (read-only connection).

    python -m benchmarks.memory --quick           # < 1 minute
    python -m benchmarks.memory --json mem.json   # full (about 9 minutes)
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks.harness.load import (
    STALL_GROUP_CONFIG,
    client,
    consume,
    create_topic,
    delete_group,
    group_stats,
    open_loop_produce,
    policy_for,
    put_group,
    run_loop,
    wait_stats,
)
from benchmarks.harness.probe import rss
from benchmarks.harness.report import arg_parser, finish, machine_facts, progress, table
from benchmarks.harness.server import ServerProcess, running, this_tree
from cproxy.model import NewMessage
from cproxy.placement import queue_for_key
from cproxy.store.sqlite import SqliteStore

QUEUES = 8
SAMPLED = ("buffered", "waiting", "in_flight", "retrying", "parked_keys")


async def populate(data_dir: Path, topics: dict[str, tuple[int, int]]) -> dict[str, float]:
    """Append ``topics`` (name -> (messages, keys)) with the store API; seconds per topic."""
    store = SqliteStore(data_dir)
    await store.open()
    timings: dict[str, float] = {}
    try:
        now_ms = int(time.time() * 1000)
        for name, (messages, keys) in topics.items():
            t0 = time.perf_counter()
            await store.create_topic(name, QUEUES)
            qids = [queue_for_key(f"k{k}", QUEUES) for k in range(keys)]
            pad = "x" * 70
            for start in range(0, messages, 1000):
                batch = [
                    NewMessage(
                        key=f"k{i % keys}",
                        body_json=orjson.dumps({"k": i % keys, "s": i // keys, "p": pad}),
                        qid=qids[i % keys],
                    )
                    for i in range(start, min(messages, start + 1000))
                ]
                await store.append(name, batch, now_ms, 0)
            timings[name] = round(time.perf_counter() - t0, 1)
    finally:
        await store.close()
    return timings


async def hold_and_drain(
    server: ServerProcess, topic: str, buffered: int, drain: bool
) -> dict[str, Any]:
    point: dict[str, Any] = {}
    async with client(server.url) as admin:
        await asyncio.sleep(0.3)
        point["idle"] = rss(server.pid)
        group = f"mem-{topic}-{buffered}"
        t0 = time.perf_counter()
        await put_group(admin, group, topic, "key", max_buffered=buffered)
        try:
            s = await wait_stats(
                admin, group, lambda s: s["buffered"] >= buffered, "buffered", 600, 0.1
            )
            point["fill_seconds"] = round(time.perf_counter() - t0, 2)
            await asyncio.sleep(0.5)  # let allocations settle
            point["held"] = rss(server.pid)
            point["stats"] = {k: s[k] for k in ("buffered", "ready", "waiting")}
            if drain:
                queues = (await group_stats(admin, group))["queues"]
                total = sum(q["next_offset"] - q["committed_offset"] for q in queues)
                t0 = time.perf_counter()
                await consume(server.url, group, total, 4, 500)
                point["drain_seconds"] = round(time.perf_counter() - t0, 2)
                await asyncio.sleep(0.5)
                s = await group_stats(admin, group)
                point["drained"] = rss(server.pid)
                point["drained_stats"] = {k: s[k] for k in SAMPLED}
        finally:
            # Groups persist: the next point's server must not start this one too.
            await delete_group(admin, group)
    return point


def measure_point(data: Path, topic: str, buffered: int, keys: int, drain: bool) -> dict[str, Any]:
    """A fresh server on ``data``: RSS idle, with ``buffered`` messages held, after drain."""
    with running(data.parent, data.name, this_tree()) as server:
        point = run_loop(lambda: hold_and_drain(server, topic, buffered, drain))
    point |= {"topic": topic, "buffered": buffered, "keys": keys}
    idle, held = point["idle"], point["held"]
    point["bytes_per_msg_rss"] = round((held["rss_mib"] - idle["rss_mib"]) * 2**20 / buffered)
    point["bytes_per_msg_anon"] = round((held["anon_mib"] - idle["anon_mib"]) * 2**20 / buffered)
    progress(
        f"{topic}: {buffered:,} buffered over {keys:,} keys: anon {idle['anon_mib']} -> "
        f"{held['anon_mib']} MiB ({point['bytes_per_msg_anon']} B/msg)"
    )
    return point


def progress_bytes(db: Path, group: str) -> tuple[int, int]:
    """(bytes of persisted finished ranges, number of ranges) of ``group``."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        rows = conn.execute("SELECT finished FROM progress WHERE grp = ?", (group,)).fetchall()
    finally:
        conn.close()
    return sum(len(r[0]) for r in rows), sum(len(orjson.loads(r[0])) for r in rows)


async def sample_stall(server: ServerProcess, args: Any, stall: str) -> dict[str, Any]:
    group, topic, samples = "stall-g", "stall", []
    async with client(server.url) as admin:
        await create_topic(admin, topic, QUEUES)
        config = {**STALL_GROUP_CONFIG, "max_buffered": args.stall_buffer}
        await put_group(admin, group, topic, "key", **config)
        stop = asyncio.Event()
        t0 = time.perf_counter()

        async def sampler() -> None:
            while not stop.is_set():
                s = await group_stats(admin, group)
                size, ranges = progress_bytes(server.data_dir / "cproxy.db", group)
                samples.append(
                    {
                        "t": round(time.perf_counter() - t0, 2),
                        **rss(server.pid),
                        **{k: s[k] for k in SAMPLED},
                        "lag": sum(q["lag"] for q in s["queues"]),
                        "progress_bytes": size,
                        "progress_ranges": ranges,
                    }
                )
                await asyncio.sleep(0.5)

        sampling = asyncio.create_task(sampler())
        healthy = round(args.seconds * args.rate * 0.99)
        consumer = asyncio.create_task(
            consume(
                server.url,
                group,
                healthy,
                4,
                100,
                policy=policy_for(stall, 100),
                time_limit_s=args.seconds + 15,
            )
        )
        sent = await open_loop_produce(server.url, topic, args.rate, 20, args.seconds, 1000)
        stats = await consumer
        await asyncio.sleep(1.5)  # one more commit interval
        stop.set()
        await sampling
    half = [s for s in samples if s["t"] >= args.seconds / 2]
    return {
        "stall": stall,
        "max_buffered": args.stall_buffer,
        "rate": args.rate,
        "seconds": args.seconds,
        "produced": sent.messages,
        "healthy_delivered": stats.healthy_delivered,
        "healthy_expected": sum(1 for i in range(sent.messages) if i % 1000 % 100 != 0),
        "max_buffered_seen": max(s["buffered"] for s in samples),
        "anon_slope_mib_per_min": round(slope(half, "anon_mib") * 60, 2),
        "rss_slope_mib_per_min": round(slope(half, "rss_mib") * 60, 2),
        "samples": samples,
    }


def slope(samples: list[dict[str, Any]], field: str) -> float:
    """Least-squares slope of ``field`` over ``t`` (per second)."""
    if len(samples) < 2:
        return float("nan")
    ts, ys = [s["t"] for s in samples], [s[field] for s in samples]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    den = sum((t - mt) ** 2 for t in ts)
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / den if den else 0.0


POINT_COLUMNS = [
    ("buffered", lambda p: p["buffered"]),
    ("distinct keys", lambda p: p["keys"]),
    ("RSS idle MiB", lambda p: p["idle"]["rss_mib"]),
    ("RSS held MiB", lambda p: p["held"]["rss_mib"]),
    ("anon idle MiB", lambda p: p["idle"]["anon_mib"]),
    ("anon held MiB", lambda p: p["held"]["anon_mib"]),
    ("B/msg RSS", lambda p: p["bytes_per_msg_rss"]),
    ("B/msg anon", lambda p: p["bytes_per_msg_anon"]),
    ("fill s", lambda p: p["fill_seconds"]),
    (
        "after drain RSS / anon MiB",
        lambda p: (
            f"{p['drained']['rss_mib']} / {p['drained']['anon_mib']} "
            f"({p['drained_stats']['buffered']} buffered)"
            if "drained" in p
            else "-"
        ),
    ),
]
SAMPLE_COLUMNS = [
    (name, lambda s, k=key: s[k])
    for name, key in (
        ("t s", "t"),
        ("RSS MiB", "rss_mib"),
        ("anon MiB", "anon_mib"),
        *((k.replace("_", " "), k) for k in SAMPLED),
        ("lag", "lag"),
        ("progress ranges", "progress_ranges"),
        ("progress bytes", "progress_bytes"),
    )
]


def report(out: dict[str, Any]) -> str:
    text = [f"## Server memory (commit {out['commit']})", ""]
    text += [
        "### Versus buffered messages (1,000 keys)",
        "",
        table(POINT_COLUMNS, out["buffered_sweep"]),
    ]
    text += ["", "### Versus distinct keys", "", table(POINT_COLUMNS, out["keys_sweep"])]
    for run in out["stall"]:
        samples = run["samples"]
        picked = samples[:: max(1, len(samples) // 12)]
        if picked[-1] is not samples[-1]:
            picked.append(samples[-1])
        exceeded = run["max_buffered_seen"] > run["max_buffered"]
        text += [
            "",
            f"### Stall over time: {run['stall']}, max_buffered {run['max_buffered']}, "
            f"{run['rate']:,} msgs/s for {run['seconds']} s",
            "",
            f"Max `buffered` seen: **{run['max_buffered_seen']}** (bound {run['max_buffered']}"
            f"{', EXCEEDS the bound' if exceeded else ''}); anon RSS slope over the second "
            f"half: {run['anon_slope_mib_per_min']} MiB/min (RSS {run['rss_slope_mib_per_min']}"
            f" MiB/min); healthy delivered {run['healthy_delivered']:,} of "
            f"{run['healthy_expected']:,}.",
            "",
            table(SAMPLE_COLUMNS, picked),
        ]
    return "\n".join(text)


def main() -> None:
    parser = arg_parser(__doc__, "small sweeps, one 15 s never-ack stall (< 1 minute)")
    parser.add_argument("--rate", type=int, help="stall phase msgs/s (1500; 1000 quick)")
    parser.add_argument("--seconds", type=float, help="stall phase length (120; 15 quick)")
    parser.add_argument("--stall-buffer", type=int, default=100, help="max_buffered in stalls")
    parser.add_argument("--stalls", help="comma-separated stall runs (none,never-ack,always-fail)")
    parser.add_argument("--only-stall", action="store_true", help="skip the sweeps")
    parser.add_argument("--drain-max", type=int, help="drain keys-sweep points up to N keys")
    args = parser.parse_args()
    if args.quick:
        buffered_points = [10_000, 50_000]
        key_points = [(1_000, 20_000), (20_000, 20_000)]
        stalls, seconds, rate, drain_max = ["never-ack"], 15.0, 1000, 20_000
    else:
        buffered_points = [10_000, 50_000, 100_000, 200_000, 500_000]
        key_points = [(1_000, 100_000), (10_000, 100_000), (100_000, 100_000)]
        key_points += [(1_000, 1_000_000), (1_000_000, 1_000_000)]
        stalls, seconds, rate, drain_max = (
            ["none", "never-ack", "always-fail"],
            120.0,
            1500,
            100_000,
        )
    args.seconds, args.rate = args.seconds or seconds, args.rate or rate
    args.drain_max = args.drain_max if args.drain_max is not None else drain_max
    stalls = args.stalls.split(",") if args.stalls else stalls
    if args.only_stall:
        buffered_points, key_points = [], []
    out: dict[str, Any] = {"machine": machine_facts(), "commit": this_tree().commit}
    root = Path(tempfile.mkdtemp(prefix="cproxy-mem-"))
    try:
        data = root / "data"
        topics = {"buf": (max(buffered_points), 1_000)} if buffered_points else {}
        for keys, n in key_points:
            topics.setdefault(f"keys-{keys}-{n}", (n, keys))
        data.mkdir()
        out["populate_seconds"] = run_loop(lambda: populate(data, topics))
        out["buffered_sweep"] = [
            measure_point(data, "buf", n, 1_000, drain=False) for n in buffered_points
        ]
        out["keys_sweep"] = [
            measure_point(data, f"keys-{k}-{n}", n, k, drain=k <= args.drain_max and n <= 100_000)
            for k, n in key_points
        ]
        out["stall"] = []
        for stall in stalls:
            with running(root, f"stall-{stall}", this_tree()) as server:
                out["stall"].append(run_loop(functools.partial(sample_stall, server, args, stall)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    finish(out, args, "memory", report(out))


if __name__ == "__main__":
    main()
