"""Server memory: resident set (psutil) versus buffered messages, versus distinct keys, and
over time during a stall with a small ``max_buffered``.

1. *Populate*: the topics below are appended straight into a SQLite data dir with the store
   API (no HTTP: 1M messages would take minutes through produce calls). Bodies are ~100 B
   JSON; message i has key ``k{i % keys}``; 8 queues.
2. *Buffered sweep* and *keys sweep*: for every point a fresh ``cproxy serve`` is started on
   that data dir; RSS is read idle, then a group (order_by key) with ``max_buffered = N`` is
   created and RSS is read again once its stats say ``buffered == N``. The difference over the
   idle baseline of the same process, divided by N, is the cost per buffered message. RSS
   counts file-backed pages too (SQLite's mmap of the database and the shared libraries), so
   *anon* (RSS - shared) is reported as the heap. For the keys sweep the group is then drained
   over HTTP (when ``keys <= --drain-max``) and RSS read again: chains of finished keys must be
   forgotten.
3. *Stall over time*: a fresh server and data dir; an open-loop producer sends ``--rate``
   msgs/s over 1,000 keys for ``--seconds``; 4 pullers ack every key except the 1 % stalled
   ones (never-ack: held, ack_timeout 600 s; always-fail: failed, backoff 200 ms, 1000
   attempts); the group has ``max_buffered = --stall-buffer``. Every 0.5 s: RSS, anon, the
   group's ``buffered``/``waiting``/``parked_keys`` and the size of the group's persisted
   progress rows (read from the database with a separate read-only connection).

    .venv/bin/python -m benchmarks.memory --quick          # < 1 minute
    .venv/bin/python -m benchmarks.memory --json mem.json  # full (about 8 minutes)
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import machine_facts, markdown_table
from benchmarks._load import (
    ServerProcess,
    consume,
    create_topic,
    delete_group,
    git_commit,
    group_stats,
    load_average,
    open_loop_produce,
    put_group,
    rss,
    run_loop,
)
from benchmarks.isolation import policy_for
from cproxy.model import NewMessage
from cproxy.partitioner import partition_for_key
from cproxy.store.sqlite import SqliteStore

QUEUES = 8


# -- populate ------------------------------------------------------------------------------------
async def populate(data_dir: Path, topics: dict[str, tuple[int, int]]) -> dict[str, float]:
    """Append ``topics`` (name -> (messages, keys)) with the store API; returns seconds each."""
    store = SqliteStore(data_dir)
    await store.open()
    timings: dict[str, float] = {}
    try:
        now_ms = int(time.time() * 1000)
        for name, (messages, keys) in topics.items():
            t0 = time.perf_counter()
            await store.create_topic(name, QUEUES)
            qids = [partition_for_key(f"k{k}", QUEUES) for k in range(keys)]
            pad = "x" * 70
            for start in range(0, messages, 1000):
                batch = [
                    NewMessage(
                        qids[i % keys],
                        f"k{i % keys}",
                        orjson.dumps({"k": i % keys, "s": i // keys, "p": pad}),
                    )
                    for i in range(start, min(messages, start + 1000))
                ]
                await store.append(name, batch, now_ms, 0)
            timings[name] = round(time.perf_counter() - t0, 1)
    finally:
        await store.close()
    return timings


async def wait_buffered(
    admin: httpx.AsyncClient, group: str, n: int, timeout_s: float = 600
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        s = await group_stats(admin, group)
        if s["buffered"] >= n:
            return s
        if time.monotonic() > deadline:
            raise RuntimeError(f"group {group} buffered only {s['buffered']} of {n}")
        await asyncio.sleep(0.1)


def measure_point(
    data_dir: Path,
    topic: str,
    buffered: int,
    keys: int,
    drain: bool,
) -> dict[str, Any]:
    """Fresh server on ``data_dir``: RSS idle, with ``buffered`` messages held, after drain."""
    server = ServerProcess(data_dir)
    try:
        server.start()
        point: dict[str, Any] = {"topic": topic, "buffered": buffered, "keys": keys}

        async def hold_and_drain(admin: httpx.AsyncClient, group: str, t0: float) -> None:
            s = await wait_buffered(admin, group, buffered)
            point["fill_seconds"] = round(time.perf_counter() - t0, 2)
            await asyncio.sleep(0.5)
            point["held"] = rss(server.pid)
            point["stats"] = {k: s[k] for k in ("buffered", "ready", "waiting")}
            if drain:
                total = sum(
                    q["next_offset"] - q["committed_offset"]
                    for q in (await group_stats(admin, group))["queues"]
                )
                t0 = time.perf_counter()
                await consume(server.url, group, total, 4, 500, wait_ms=1000)
                point["drain_seconds"] = round(time.perf_counter() - t0, 2)
                await asyncio.sleep(0.5)
                s = await group_stats(admin, group)
                point["drained"] = rss(server.pid)
                point["drained_stats"] = {
                    k: s[k] for k in ("buffered", "waiting", "in_flight", "parked_keys")
                }

        async def go() -> None:
            async with httpx.AsyncClient(base_url=server.url, timeout=120) as admin:
                await asyncio.sleep(0.3)
                point["idle"] = rss(server.pid)
                group = f"mem-{topic}-{buffered}"
                t0 = time.perf_counter()
                await put_group(admin, group, topic, "key", max_buffered=buffered)
                try:
                    await hold_and_drain(admin, group, t0)
                finally:
                    # Groups persist: the next point's server must not start this one too.
                    await delete_group(admin, group)

        run_loop(go)
    finally:
        server.stop()
    idle, held = point["idle"], point["held"]
    point["bytes_per_msg_rss"] = round((held["rss_mib"] - idle["rss_mib"]) * 2**20 / buffered)
    point["bytes_per_msg_anon"] = round((held["anon_mib"] - idle["anon_mib"]) * 2**20 / buffered)
    print(
        f"{topic}: {buffered:,} buffered over {keys:,} keys: RSS {idle['rss_mib']} -> "
        f"{held['rss_mib']} MiB, anon {idle['anon_mib']} -> {held['anon_mib']} MiB "
        f"({point['bytes_per_msg_anon']} B/msg anon) load {load_average()}",
        file=sys.stderr,
        flush=True,
    )
    return point


# -- stall over time -----------------------------------------------------------------------------
def progress_bytes(db: Path, group: str) -> tuple[int, int]:
    """(bytes of persisted finished ranges, number of ranges) for ``group``."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        rows = conn.execute("SELECT finished FROM progress WHERE grp = ?", (group,)).fetchall()
    finally:
        conn.close()
    size = sum(len(r[0]) for r in rows)
    ranges = sum(len(orjson.loads(r[0])) for r in rows)
    return size, ranges


async def stall_run(root: Path, args: argparse.Namespace, stall: str) -> dict[str, Any]:
    data = root / f"stall-{stall}"
    server = ServerProcess(data)
    samples: list[dict[str, Any]] = []
    group, topic = "stall-g", "stall"
    try:
        server.start()
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as admin:
            await create_topic(admin, topic, QUEUES)
            await put_group(
                admin,
                group,
                topic,
                "key",
                max_buffered=args.stall_buffer,
                ack_timeout_ms=600_000,
                max_attempts=1000,
                retry_backoff_ms=[200],
            )
            stop = asyncio.Event()
            t0 = time.perf_counter()

            async def sampler() -> None:
                while not stop.is_set():
                    s = await group_stats(admin, group)
                    size, ranges = progress_bytes(data / "cproxy.db", group)
                    samples.append(
                        {
                            "t": round(time.perf_counter() - t0, 2),
                            **rss(server.pid),
                            **{
                                k: s[k]
                                for k in (
                                    "buffered",
                                    "waiting",
                                    "in_flight",
                                    "retrying",
                                    "parked_keys",
                                )
                            },
                            "lag": sum(q["lag"] for q in s["queues"]),
                            "progress_bytes": size,
                            "progress_ranges": ranges,
                        }
                    )
                    await asyncio.sleep(0.5)

            sampling = asyncio.create_task(sampler())
            expected = round(args.seconds * args.rate)
            healthy = round(expected * 0.99)
            consumer = asyncio.create_task(
                consume(
                    server.url,
                    group,
                    healthy,
                    4,
                    100,
                    wait_ms=1000,
                    policy=policy_for(stall, 100),
                    time_limit_s=args.seconds + 15,
                )
            )
            sent = await open_loop_produce(server.url, topic, args.rate, 20, args.seconds, 1000)
            stats = await consumer
            await asyncio.sleep(1.5)  # one more commit interval
            stop.set()
            await sampling
    finally:
        server.stop()
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
    ts = [s["t"] for s in samples]
    ys = [s[field] for s in samples]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    den = sum((t - mt) ** 2 for t in ts)
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / den if den else 0.0


# -- report --------------------------------------------------------------------------------------
def report(out: dict[str, Any]) -> str:
    def point_row(p: dict[str, Any]) -> tuple[Any, ...]:
        return (
            f"{p['buffered']:,}",
            f"{p['keys']:,}",
            p["idle"]["rss_mib"],
            p["held"]["rss_mib"],
            p["idle"]["anon_mib"],
            p["held"]["anon_mib"],
            p["bytes_per_msg_rss"],
            p["bytes_per_msg_anon"],
            p["fill_seconds"],
            (
                f"{p['drained']['rss_mib']} / {p['drained']['anon_mib']}"
                f" ({p['drained_stats']['buffered']} buffered)"
                if "drained" in p
                else "-"
            ),
        )

    headers = [
        "buffered",
        "distinct keys",
        "RSS idle MiB",
        "RSS held MiB",
        "anon idle MiB",
        "anon held MiB",
        "B/msg RSS",
        "B/msg anon",
        "fill s",
        "after drain RSS / anon MiB",
    ]
    text = [
        f"## Server memory (commit {out['commit']})",
        "",
        "### Versus buffered messages (1,000 keys)",
        "",
        markdown_table(headers, [point_row(p) for p in out["buffered_sweep"]]),
        "",
        "### Versus distinct keys",
        "",
        markdown_table(headers, [point_row(p) for p in out["keys_sweep"]]),
    ]
    for run in out["stall"]:
        samples = run["samples"]
        step = max(1, len(samples) // 12)
        picked = samples[::step]
        if picked[-1] is not samples[-1]:
            picked.append(samples[-1])
        text += [
            "",
            f"### Stall over time: {run['stall']}, max_buffered {run['max_buffered']}, "
            f"{run['rate']:,} msgs/s for {run['seconds']} s",
            "",
            f"Max `buffered` seen: **{run['max_buffered_seen']}** (bound {run['max_buffered']}"
            f"{', EXCEEDS the bound' if run['max_buffered_seen'] > run['max_buffered'] else ''});"
            f" anon RSS slope over the second half: {run['anon_slope_mib_per_min']} MiB/min"
            f" (RSS {run['rss_slope_mib_per_min']} MiB/min); healthy delivered "
            f"{run['healthy_delivered']:,} of {run['healthy_expected']:,}.",
            "",
            markdown_table(
                [
                    "t s",
                    "RSS MiB",
                    "anon MiB",
                    "buffered",
                    "waiting",
                    "in flight",
                    "retrying",
                    "parked keys",
                    "lag",
                    "progress ranges",
                    "progress bytes",
                ],
                [
                    (
                        s["t"],
                        s["rss_mib"],
                        s["anon_mib"],
                        s["buffered"],
                        s["waiting"],
                        s["in_flight"],
                        s["retrying"],
                        s["parked_keys"],
                        f"{s['lag']:,}",
                        f"{s['progress_ranges']:,}",
                        f"{s['progress_bytes']:,}",
                    )
                    for s in picked
                ],
            ),
        ]
    return "\n".join(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sweeps, one 15 s stall")
    parser.add_argument("--rate", type=int, help="stall phase msgs/s (1500; 1000 quick)")
    parser.add_argument("--seconds", type=float, help="stall phase length (120; 15 quick)")
    parser.add_argument("--stall-buffer", type=int, default=100, help="max_buffered in stalls")
    parser.add_argument("--stalls", help="comma-separated stall runs (none,never-ack,always-fail)")
    parser.add_argument("--only-stall", action="store_true", help="skip the sweeps")
    parser.add_argument("--drain-max", type=int, help="drain keys-sweep points up to N keys")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)
    if args.quick:
        buffered_points = [10_000, 50_000]
        key_points = [(1_000, 20_000), (20_000, 20_000)]
        stalls = ["never-ack"]
        args.seconds = args.seconds or 15.0
        args.rate = args.rate or 1000
        args.drain_max = args.drain_max if args.drain_max is not None else 20_000
    else:
        buffered_points = [10_000, 50_000, 100_000, 200_000, 500_000]
        key_points = [
            (1_000, 100_000),
            (10_000, 100_000),
            (100_000, 100_000),
            (1_000, 1_000_000),
            (1_000_000, 1_000_000),
        ]
        stalls = ["none", "never-ack", "always-fail"]
        args.seconds = args.seconds or 120.0
        args.rate = args.rate or 1500
        args.drain_max = args.drain_max if args.drain_max is not None else 100_000
    if args.stalls:
        stalls = args.stalls.split(",")
    if args.only_stall:
        buffered_points, key_points = [], []
    facts = machine_facts()
    out: dict[str, Any] = {"load_1m_at_start": load_average()}
    root = Path(tempfile.mkdtemp(prefix="cproxy-mem-"))
    started = time.perf_counter()
    try:
        data = root / "data"
        data.mkdir()
        topics = {"buf": (max(buffered_points), 1_000)} if buffered_points else {}
        for keys, n in key_points:
            topics.setdefault(f"keys-{keys}-{n}", (n, keys))
        out["populate_seconds"] = run_loop(lambda: populate(data, topics))
        print(f"populated {topics} in {out['populate_seconds']}", file=sys.stderr)
        out["buffered_sweep"] = [
            measure_point(data, "buf", n, 1_000, drain=False) for n in buffered_points
        ]
        out["keys_sweep"] = [
            measure_point(data, f"keys-{k}-{n}", n, k, drain=k <= args.drain_max and n <= 100_000)
            for k, n in key_points
        ]
        out["stall"] = []
        for stall in stalls:
            out["stall"].append(run_loop(functools.partial(stall_run, root, args, stall)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["load_1m_at_end"] = load_average()
    out["commit"] = git_commit()
    out["machine"] = facts
    out["command"] = " ".join(["python -m benchmarks.memory", *(argv or sys.argv[1:])])
    out["total_seconds"] = round(time.perf_counter() - started, 1)
    print(report(out))
    print(
        f"\n(total {out['total_seconds']} s, load {out['load_1m_at_start']} -> "
        f"{out['load_1m_at_end']}, {facts.get('cpu')}, {facts.get('logical_cores')} cores)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
