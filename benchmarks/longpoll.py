"""Long polls: N pulls waiting at once on one group, then a trickle of produces.

A fresh topic (8 queues) and group (``order_by: key``). N pullers, raw HTTP/1.1 keep-alive
connections on one event loop (not N SDK clients: with 1,000 httpx clients in one process
the client itself adds seconds), each long-polling ``POST /v1/groups/{g}/pull`` with
``max_messages`` 1 and ``--wait-ms`` (the first waits spread over [wait/10, wait] so that
expiries spread as in a steady population), acking what it got on its next pull:

1. *idle*: nothing is produced for ``--idle-s``: the server's CPU share of one core while
   the N pulls wait (and expire and come back), and its RSS;
2. *trickle*: one message per produce call at ``--rate`` msgs/s (open loop, each a new key)
   for ``--trickle-s``: each message's send -> delivery time (the send time travels in the
   body; one process, one clock) and the server's CPU share;
3. every produced message must be delivered; errors are counted, never retried silently.

The client raises its open-file limit to the hard limit (the server inherits it).

    python -m benchmarks.longpoll --quick                    # 500 pullers, 5 s phases
    python -m benchmarks.longpoll --pullers 5000 --wait-ms 30000 --idle-s 20 --trickle-s 10
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from benchmarks.harness.load import client, create_topic, put_group, run_loop
from benchmarks.harness.probe import Probe, rss
from benchmarks.harness.report import (
    arg_parser,
    finish,
    machine_facts,
    percentiles,
    progress,
    table,
)
from benchmarks.harness.server import servers

#: Connections opened at once while ramping up (uvicorn's listen backlog is 2048).
CONNECT_CHUNK = 250
#: How long answers may take after the trickle before what is missing counts as errors.
DRAIN_TIMEOUT_S = 30.0


@dataclass
class Tally:
    """What the pullers saw, shared by all of them (one event loop: no locks)."""

    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    requests: int = 0
    started: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while not done():
                    self.changed.clear()
                    await self.changed.wait()
        return done()


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return int(head[9:12]), await reader.readexactly(length)


def _request(path: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    ).encode()


async def puller(port: int, group: str, wait_ms: int, first_ms: int, tally: Tally) -> None:
    """Long-poll forever over one keep-alive connection; acks ride on the next pull."""
    request, wait = _request(f"/v1/groups/{group}/pull"), first_ms
    acks: list[dict[str, Any]] = []
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    tally.started += 1
    tally.changed.set()
    try:
        while True:
            body = orjson.dumps({"max_messages": 1, "wait_ms": wait, "results": acks})
            writer.write(request % len(body) + body)
            tally.requests += 1
            status, data = await _answer(reader)
            now_ms, wait, acks = time.monotonic() * 1000, wait_ms, []
            if status != 200:
                tally.errors.append(f"pull answered {status}: {data[:200]!r}")
                continue
            for m in orjson.loads(data)["messages"]:
                tally.latencies_ms.append(now_ms - m["body"]["t"])
                acks.append({"topic": m["topic"], "qid": m["qid"], "acks": [m["offset"]]})
            tally.changed.set()
    except (OSError, asyncio.IncompleteReadError) as exc:
        tally.errors.append(f"connection: {exc!r}")
    finally:
        writer.close()


async def trickle(port: int, topic: str, rate: float, seconds: float) -> tuple[int, int]:
    """One message per call at ``rate`` (open loop) over 8 connections: (sent, failed)."""
    head, failed = _request(f"/v1/topics/{topic}/messages"), 0
    free: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for _ in range(8):
        free.put_nowait(await asyncio.open_connection("127.0.0.1", port))

    async def one(i: int) -> None:
        nonlocal failed
        body = orjson.dumps(
            {"messages": [{"key": f"k{i}", "body": {"t": time.monotonic() * 1000}}]}
        )
        reader, writer = await free.get()
        writer.write(head % len(body) + body)
        status, _ = await _answer(reader)
        free.put_nowait((reader, writer))
        failed += status != 200

    tasks, total, t0 = [], int(rate * seconds), time.monotonic()
    for i in range(total):
        await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
        tasks.append(asyncio.create_task(one(i)))
    _, late = await asyncio.wait(tasks, timeout=DRAIN_TIMEOUT_S)
    while not free.empty():
        free.get_nowait()[1].close()
    return total, failed + len(late)


async def run(args: Any, url: str, pid: int) -> dict[str, Any]:
    out: dict[str, Any] = {"pullers": args.pullers}
    port, tally, tasks = int(url.rsplit(":", 1)[1]), Tally(), []
    async with client(url) as admin:
        await create_topic(admin, "lp", 8)
        await put_group(admin, "lp", "lp")
    rss_before = rss(pid)
    try:
        for start in range(0, args.pullers, CONNECT_CHUNK):
            for _ in range(min(CONNECT_CHUNK, args.pullers - start)):
                first = round(random.uniform(args.wait_ms / 10, args.wait_ms))
                tasks.append(asyncio.create_task(puller(port, "lp", args.wait_ms, first, tally)))
            await tally.until(lambda: tally.started >= len(tasks), 30)
        if tally.started < args.pullers:
            raise RuntimeError(f"only {tally.started} of {args.pullers} pullers connected")
        await asyncio.sleep(1.0)  # the last pulls reach the server and wait there
        requests = tally.requests
        with Probe(pid) as idle:
            await asyncio.sleep(args.idle_s)
        out |= {"idle_cpu_pct": 100 * idle.server_cpu / idle.wall,
                "idle_pulls_per_s": (tally.requests - requests) / idle.wall,
                "rss_mib": rss(pid)["rss_mib"],
                "rss_growth_mib": rss(pid)["rss_mib"] - rss_before["rss_mib"]}  # fmt: skip
        with Probe(pid) as busy:
            sent, failed = await trickle(port, "lp", args.rate, args.trickle_s)
        await tally.until(lambda: len(tally.latencies_ms) >= sent - failed, DRAIN_TIMEOUT_S)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    delivered = len(tally.latencies_ms)
    out |= {"produced": sent, "delivered": delivered, "error_samples": tally.errors[:5],
            "errors": failed + len(tally.errors) + max(0, sent - failed - delivered),
            "trickle_cpu_pct": 100 * busy.server_cpu / busy.wall,
            "send_to_delivery_ms": percentiles(tally.latencies_ms)}  # fmt: skip
    progress(f"{args.pullers} pullers: {out['errors']} errors, {out['send_to_delivery_ms']}")
    return out


def main() -> None:
    parser = arg_parser(__doc__, "500 pullers, 5 s phases")
    parser.add_argument("--pullers", type=int, help="waiting pulls (default 5000; 500 quick)")
    parser.add_argument("--rate", type=float, default=100.0, help="trickle msgs/s (100)")
    parser.add_argument("--wait-ms", type=int, default=30_000, help="pull wait_ms (30000)")
    parser.add_argument("--idle-s", type=float, help="idle phase (20 s; 5 with --quick)")
    parser.add_argument("--trickle-s", type=float, help="trickle phase (10 s; 5 with --quick)")
    args = parser.parse_args()
    args.pullers = args.pullers or (500 if args.quick else 5000)
    args.idle_s = args.idle_s or (5.0 if args.quick else 20.0)
    args.trickle_s = args.trickle_s or (5.0 if args.quick else 10.0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    if soft < 2 * args.pullers + 200:
        raise SystemExit(f"open-file limit {soft} < {2 * args.pullers + 200}: raise ulimit -Hn")
    facts = machine_facts()
    with servers("cproxy-longpoll-") as (server,):
        out = run_loop(lambda: run(args, server.url, server.pid))
    out |= {"machine": facts, "commit": server.source.commit}
    lat = out["send_to_delivery_ms"]
    row = [
        ("waiting pulls", lambda o: o["pullers"]),
        ("errors", lambda o: o["errors"]),
        ("delivered", lambda o: f"{o['delivered']:,}/{o['produced']:,}"),
        (
            "send→deliver p50 / p99 / max ms",
            lambda o: f"{lat['p50']} / {lat['p99']} / {lat['max']}",
        ),
        ("server CPU, idle", lambda o: f"{o['idle_cpu_pct']:.1f} %"),
        ("pulls/s, idle", lambda o: f"{o['idle_pulls_per_s']:.0f}"),
        ("server CPU, trickle", lambda o: f"{o['trickle_cpu_pct']:.1f} %"),
        ("RSS MiB (growth)", lambda o: f"{o['rss_mib']:.0f} ({o['rss_growth_mib']:+.0f})"),
    ]
    header = (
        f"## Long polls (commit {out['commit']}): wait_ms {args.wait_ms}, idle {args.idle_s:g} s, "
        f"trickle {args.rate:g} msgs/s for {args.trickle_s:g} s"
    )
    finish(out, args, "longpoll", f"{header}\n\n{table(row, [out])}")


if __name__ == "__main__":
    main()
