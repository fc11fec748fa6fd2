"""Long polls at scale: N concurrent long-polling pulls on one group and a trickle of produces.

Per cell (a fresh topic of 8 queues and a fresh group, ``order_by`` key):

1. N pullers connect (raw HTTP/1.1 keep-alive connections on one event loop, not N SDK
   clients: the load generator must stay cheap) and each long-polls
   ``POST /v1/groups/{g}/pull`` with ``max_messages`` 1 and ``wait_ms`` (default 20 s),
   acking what it got on its next pull;
2. *idle*: nothing is produced for ``--idle-s``; the server's CPU share (of one core) is
   measured, and its RSS (with the N waiting pulls) against the RSS before they connected;
3. *trickle*: one message per produce call at ``--rate`` msgs/s (open loop, each a new key)
   for ``--trickle-s``; the server's CPU share is measured again, and each message's
   produce-to-delivery time (the producer's send time, carried in the body, to the moment a
   puller has parsed the answer that carries it; one process, one clock);
4. every produced message must be delivered; errors (non-200 answers, connection errors)
   are counted, never retried silently.

Cells: N in ``--pullers`` (default 1000 and 5000). ``--ab REF`` runs a server from REF too
(B), rounds interleaved, and reports medians and ratios B/A. The client raises its open-file
limit to the hard limit (the servers inherit it): N connections need N descriptors.

    python -m benchmarks.longpoll --quick                 # 500 pullers, short phases
    python -m benchmarks.longpoll --ab 6c6c186            # 1000 and 5000 pullers, A and B
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

from benchmarks.harness.ab import Side, ab_report, rounds, sides
from benchmarks.harness.load import create_topic, delete_group, put_group, run_loop
from benchmarks.harness.probe import Probe, rss
from benchmarks.harness.report import (
    arg_parser,
    finish,
    machine_facts,
    median,
    percentile,
    progress,
    table,
)
from benchmarks.harness.server import servers

QUEUES = 8
#: Connections opened at once while ramping up (uvicorn's listen backlog is 2048).
CONNECT_CHUNK = 250
#: How long produce calls may take to answer, and then messages to be delivered, after the
#: trickle (s each); what is still missing then counts as errors (an overloaded server).
DRAIN_TIMEOUT_S = 30.0


@dataclass
class Tally:
    """What the pullers saw, shared by all of them (one event loop: no locks)."""

    latencies_ms: list[float] = field(default_factory=list)
    #: Stored -> delivered (the message's ``produced_at_ms`` to the answer, wall clock).
    store_ms: list[float] = field(default_factory=list)
    errors: int = 0
    requests: int = 0
    started: int = 0
    error_samples: list[str] = field(default_factory=list)
    #: Set whenever a puller starts or gets a message.
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``done()`` holds (re-checked on every change) or ``timeout_s`` passed."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while not done():
                    self.changed.clear()
                    await self.changed.wait()
        return done()

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(what)


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def puller(
    host: str, port: int, group: str, wait_ms: int, tally: Tally, first_wait_ms: int | None = None
) -> None:
    """Long-poll forever over one keep-alive connection; acks ride on the next pull. The
    first pull waits ``first_wait_ms`` (default ``wait_ms``), the rest ``wait_ms``."""
    request = (
        f"POST /v1/groups/{group}/pull HTTP/1.1\r\nHost: {host}\r\n"
        "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    ).encode()
    first = True
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError as exc:
            tally.error(f"connect: {exc}")
            await asyncio.sleep(0.5)
            continue
        acks: list[dict[str, Any]] = []
        try:
            while True:
                wait = first_wait_ms if first and first_wait_ms is not None else wait_ms
                body = orjson.dumps({"max_messages": 1, "wait_ms": wait, "results": acks})
                writer.write(request % len(body) + body)
                tally.requests += 1
                if first:
                    tally.started += 1
                    tally.changed.set()
                    first = False
                status, data = await _answer(reader)
                now_ms = time.monotonic() * 1000
                wall_ms = time.time() * 1000
                acks = []
                if status != 200:
                    tally.error(f"status {status}: {data[:200]!r}")
                    await asyncio.sleep(0.1)
                    continue
                for m in orjson.loads(data)["messages"]:
                    tally.latencies_ms.append(now_ms - m["body"]["t"])
                    tally.store_ms.append(wall_ms - m["produced_at_ms"])
                    acks.append({"topic": m["topic"], "qid": m["qid"], "acks": [m["offset"]]})
                tally.changed.set()
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            tally.error(f"connection: {exc!r}")
            await asyncio.sleep(0.1)
        finally:
            writer.close()


class Producer:
    """Produce calls over a few raw keep-alive connections (cheaper than an SDK client:
    the load generator shares the machine with the server)."""

    def __init__(self, host: str, port: int, topic: str, connections: int = 8) -> None:
        self.host, self.port, self.connections = host, port, connections
        self.head = (
            f"POST /v1/topics/{topic}/messages HTTP/1.1\r\nHost: {host}\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        ).encode()
        self.free: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
            asyncio.Queue()
        )

    async def open(self) -> None:
        for _ in range(self.connections):
            self.free.put_nowait(await asyncio.open_connection(self.host, self.port))

    def close(self) -> None:
        while not self.free.empty():
            self.free.get_nowait()[1].close()

    async def send(self, body: bytes) -> None:
        """One produce call; raises on a non-200 answer or a broken connection."""
        reader, writer = await self.free.get()
        try:
            writer.write(self.head % len(body) + body)
            status, data = await _answer(reader)
        except BaseException:
            writer.close()
            self.free.put_nowait(await asyncio.open_connection(self.host, self.port))
            raise
        self.free.put_nowait((reader, writer))
        if status != 200:
            raise RuntimeError(f"produce answered {status}: {data[:200]!r}")


async def trickle(
    producer: Producer, rate: float, seconds: float, produce_ms: list[float]
) -> tuple[int, int]:
    """Produce one message per call at ``rate`` per second (open loop); returns (sent,
    failed). Each message gets a new key and carries its send time (ms, monotonic); each
    call's round trip (ms) goes to ``produce_ms``."""
    sent = failed = 0
    started = time.monotonic()
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int) -> None:
        nonlocal failed
        t = time.monotonic() * 1000
        body = orjson.dumps({"messages": [{"key": f"k{i}", "body": {"t": t}}]})
        try:
            await producer.send(body)
            produce_ms.append(time.monotonic() * 1000 - t)
        except Exception as exc:  # counted: the report shows errors
            failed += 1
            progress(f"produce failed: {exc!r}")

    total = int(rate * seconds)
    for i in range(total):
        delay = started + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        sent += 1
    if tasks:
        _, late = await asyncio.wait(tasks, timeout=DRAIN_TIMEOUT_S)
        for task in late:
            task.cancel()
        failed += len(late)
        if late:
            progress(f"{len(late)} produce calls unanswered {DRAIN_TIMEOUT_S:g} s after trickle")
    return sent, failed


async def run_cell(side: Side, pullers: int, tag: str, args: Any) -> dict[str, Any]:
    topic = group = f"lp-{pullers}-{tag}"
    await create_topic(side.admin, topic, QUEUES)
    await put_group(side.admin, group, topic)
    host, port = "127.0.0.1", int(side.url.rsplit(":", 1)[1])
    tally = Tally()
    produce_ms: list[float] = []
    rss_before = rss(side.pid)
    tasks: list[asyncio.Task[None]] = []
    out: dict[str, Any] = {"pullers": pullers}
    try:
        t0 = time.monotonic()
        for start in range(0, pullers, CONNECT_CHUNK):
            for _ in range(min(CONNECT_CHUNK, pullers - start)):
                # Spread: the first waits are uniform in [wait_ms / 10, wait_ms], so expiries
                # spread over time as in a steady population of consumers; without it all
                # N pulls, started together, expire together (a re-poll storm every wait_ms).
                first = round(random.uniform(args.wait_ms / 10, args.wait_ms))
                first_wait = first if args.spread else None
                tasks.append(
                    asyncio.create_task(puller(host, port, group, args.wait_ms, tally, first_wait))
                )
            await tally.until(lambda: tally.started >= len(tasks), 30)
        if tally.started < pullers:
            raise RuntimeError(f"only {tally.started} of {pullers} pullers started")
        out["connect_s"] = round(time.monotonic() - t0, 2)
        await asyncio.sleep(1.0)  # let the last requests reach the server and wait there
        requests_before = tally.requests
        with Probe(side.pid) as idle:
            await asyncio.sleep(args.idle_s)
        out["idle_core_share"] = idle.server_cpu / idle.wall
        out["idle_requests_per_s"] = (tally.requests - requests_before) / idle.wall
        out["idle_client_core_share"] = idle.client_cpu / idle.wall
        rss_idle = rss(side.pid)
        out["rss_mib"] = rss_idle["rss_mib"]
        out["rss_growth_mib"] = round(rss_idle["rss_mib"] - rss_before["rss_mib"], 1)
        producer = Producer(host, port, topic)
        await producer.open()
        with Probe(side.pid) as busy:
            sent, failed = await trickle(producer, args.rate, args.trickle_s, produce_ms)
        producer.close()
        out["trickle_core_share"] = busy.server_cpu / busy.wall
        out["trickle_client_core_share"] = busy.client_cpu / busy.wall
        await tally.until(lambda: len(tally.latencies_ms) >= sent - failed, DRAIN_TIMEOUT_S)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await delete_group(side.admin, group)
    lat = sorted(tally.latencies_ms)
    out |= {
        "produced": sent,
        "produce_errors": failed,
        "delivered": len(lat),
        "undelivered": sent - failed - len(lat),
        "pull_errors": tally.errors,
        "error_samples": tally.error_samples,
        "p50_ms": percentile(lat, 50) if lat else float("nan"),
        "p99_ms": percentile(lat, 99) if lat else float("nan"),
        "max_ms": lat[-1] if lat else float("nan"),
        "store_p50_ms": percentile(sorted(tally.store_ms), 50),
        "store_p99_ms": percentile(sorted(tally.store_ms), 99),
        "store_max_ms": max(tally.store_ms, default=float("nan")),
        "produce_p50_ms": percentile(sorted(produce_ms), 50),
        "produce_p99_ms": percentile(sorted(produce_ms), 99),
        "idle_cpu_pct": round(100 * out["idle_core_share"], 2),
        "trickle_cpu_pct": round(100 * out["trickle_core_share"], 1),
        "errors": failed + tally.errors + max(0, sent - failed - len(lat)),
    }
    return out


def describe(r: dict[str, Any]) -> str:
    return (
        f"errors {r['errors']} p50 {r['p50_ms']:.1f} p99 {r['p99_ms']:.1f} "
        f"max {r['max_ms']:.0f} ms; store->deliver p50 {r['store_p50_ms']:.1f} "
        f"p99 {r['store_p99_ms']:.1f} max {r['store_max_ms']:.0f} ms "
        f"(produce p50 {r['produce_p50_ms']:.1f} "
        f"p99 {r['produce_p99_ms']:.1f}); cpu idle {r['idle_cpu_pct']:.1f}% "
        f"trickle {r['trickle_cpu_pct']:.0f}%; rss {r['rss_mib']} MiB"
    )


METRICS = [
    ("errors", "errors"),
    ("p50 ms", "p50_ms"),
    ("p99 ms", "p99_ms"),
    ("max ms", "max_ms"),
    ("store->deliver p99 ms", "store_p99_ms"),
    ("idle CPU %", "idle_cpu_pct"),
    ("trickle CPU %", "trickle_cpu_pct"),
    ("RSS MiB", "rss_mib"),
]


def cell_table(results: dict[str, list[dict[str, Any]]], names: list[str]) -> str:
    def m(name: str, key: str, fmt: str) -> str:
        return format(median([r[key] for r in results[name]]), fmt)

    return table(
        [
            ("pullers", lambda n: n),
            ("runs", lambda n: len(results[n])),
            ("errors", lambda n: m(n, "errors", ".0f")),
            ("delivered", lambda n: m(n, "delivered", ".0f")),
            ("p50 ms", lambda n: m(n, "p50_ms", ".1f")),
            ("p99 ms", lambda n: m(n, "p99_ms", ".1f")),
            ("max ms", lambda n: m(n, "max_ms", ".0f")),
            (
                "store→deliver p50/p99/max ms",
                lambda n: " / ".join(
                    m(n, k, f)
                    for k, f in (
                        ("store_p50_ms", ".1f"),
                        ("store_p99_ms", ".1f"),
                        ("store_max_ms", ".0f"),
                    )
                ),
            ),
            (
                "produce call p50/p99 ms",
                lambda n: m(n, "produce_p50_ms", ".1f") + " / " + m(n, "produce_p99_ms", ".1f"),
            ),
            ("server CPU idle", lambda n: m(n, "idle_cpu_pct", ".1f") + "%"),
            ("idle pulls/s", lambda n: m(n, "idle_requests_per_s", ".0f")),
            ("server CPU trickle", lambda n: m(n, "trickle_cpu_pct", ".0f") + "%"),
            ("RSS MiB", lambda n: m(n, "rss_mib", ".0f")),
            ("RSS growth MiB", lambda n: m(n, "rss_growth_mib", ".0f")),
            (
                "client CPU trickle",
                lambda n: (
                    f"{100 * median([r['trickle_client_core_share'] for r in results[n]]):.0f}%"
                ),
            ),
        ],
        names,
    )


def report(out: dict[str, Any], args: Any) -> str:
    commits = out["commits"]
    names = [str(n) for n in args.pullers]
    text = [
        f"## Long polls: {', '.join(names)} pullers, trickle {args.rate:g} msgs/s "
        f"(A = commit {commits['A']}, {args.repeat} round(s), medians)",
        "",
        f"wait_ms {args.wait_ms} (first pulls spread: {args.spread}), idle {args.idle_s:g} s, "
        f"trickle {args.trickle_s:g} s, "
        f"{QUEUES} queues, one group, max_messages 1, acks on the next pull.",
        "",
    ]
    if "B" in commits:
        text += ["### A/B", "", ab_report(out["cells"], names, METRICS, commits), ""]
    for label, results in out["cells"].items():
        text += [f"### Server {label} ({commits[label]})", "", cell_table(results, names), ""]
    return "\n".join(text)


def raise_open_files() -> int:
    """Raise this process's open-file limit to the hard limit (servers inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


async def run(args: Any, the_servers: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"commits": {s.source.label: s.source.commit for s in the_servers}}
    async with sides(the_servers) as the_sides:
        out["cells"] = await rounds(
            the_sides,
            list(args.pullers),
            args.repeat,
            str,
            lambda side, n, tag: run_cell(side, n, tag, args),
            describe,
        )
    return out


def main() -> None:
    parser = arg_parser(__doc__, "500 pullers, 5 s phases", ab=True)
    parser.add_argument("--pullers", type=int, nargs="+", help="cells (default 1000 5000)")
    parser.add_argument("--rate", type=float, default=100.0, help="trickle msgs/s (100)")
    parser.add_argument("--wait-ms", type=int, default=20_000, help="pull wait_ms (20000)")
    parser.add_argument(
        "--no-spread",
        dest="spread",
        action="store_false",
        help="every puller's first pull waits wait_ms too (all expire together)",
    )
    parser.add_argument("--idle-s", type=float, help="idle phase (20 s; 5 with --quick)")
    parser.add_argument("--trickle-s", type=float, help="trickle phase (20 s; 5 with --quick)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds (1)")
    args = parser.parse_args()
    args.pullers = args.pullers or ([500] if args.quick else [1000, 5000])
    args.idle_s = args.idle_s or (5.0 if args.quick else 20.0)
    args.trickle_s = args.trickle_s or (5.0 if args.quick else 20.0)
    needed = 2 * max(args.pullers) + 200
    limit = raise_open_files()
    if limit < needed:
        raise SystemExit(f"open-file limit {limit} < {needed} needed: raise `ulimit -Hn`")
    facts = machine_facts()
    with servers("cproxy-longpoll-", args.ab) as the_servers:
        out = run_loop(lambda: run(args, the_servers))
    out["machine"] = facts
    finish(out, args, "longpoll", report(out, args))


if __name__ == "__main__":
    main()
