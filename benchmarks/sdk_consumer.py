"""SDK consumers against the bare client core, on the same data, in the same run.

Produces ``--messages`` messages over ``--keys`` keys into one topic, then each contender
drains it in its own group (every group sees every message) with a trivial handler:

- ``client-core``: the smallest correct consumer: an ``AsyncClient.pull`` loop that acks on
  the next pull (the baseline; what the consumers add on top is their overhead);
- ``sdk-async``: ``AsyncConsumer`` with an ``async def`` handler;
- ``sdk-sync``: ``Consumer`` with a plain function on its thread pool.

Each round runs every contender once, in rotating order, on a fresh group. Reported: median
msgs/s, the median of per-round ratios to the baseline (contenders of one round ran back to
back, so their ratio suffers least from drift in load; target >= 0.8), and client CPU per
message (process time: the SDK's own overhead shows even on a busy machine).
``--client-only`` answers pulls in-process (canned), so only the client's own work is timed.

    python -m benchmarks.sdk_consumer --quick                    # 5,000 messages, 3 rounds
    python -m benchmarks.sdk_consumer --messages 20000 --rounds 7
    python -m benchmarks.sdk_consumer --client-only --messages 100000
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import httpx
import orjson

from benchmarks.harness.report import arg_parser, finish, machine_facts, median, progress, table
from benchmarks.harness.server import servers
from consumer_sdk import (
    AsyncClient,
    AsyncConsumer,
    Client,
    Consumer,
    Message,
    Producer,
    QueueResult,
)

TOPIC = "bench"


def produce(url: str, messages: int, keys: int, queues: int) -> None:
    with Producer(url, timeout_ms=60_000) as producer:
        producer.create_topic(TOPIC, queues)
        for start in range(0, messages, 1000):
            batch = [
                {"key": f"k{n % keys}", "body": {"n": n, "pad": "x" * 64}}
                for n in range(start, min(start + 1000, messages))
            ]
            producer.send_batch(TOPIC, batch)


async def run_core(url: str, group: str, total: int, batch: int, transport: Any) -> float:
    seen = 0
    async with AsyncClient(url, timeout_ms=60_000, transport=transport) as c:
        results: list[QueueResult] = []
        started = time.perf_counter()
        while seen < total:
            pulled = await c.pull(group, max_messages=batch, wait_ms=1000, results=results)
            acks: dict[tuple[str, int], list[int]] = defaultdict(list)
            for m in pulled.messages:
                seen += 1  # the trivial handler
                acks[(m.topic, m.qid)].append(m.offset)
            results = [QueueResult(t, q, acks=tuple(o)) for (t, q), o in acks.items()]
        elapsed = time.perf_counter() - started
        await c.ack(group, results)
    return elapsed


async def run_sdk_async(url: str, group: str, total: int, batch: int, transport: Any) -> float:
    seen = 0
    finished = asyncio.Event()

    async def handle(msg: Message) -> None:
        nonlocal seen
        seen += 1
        if seen == total:
            finished.set()

    consumer = AsyncConsumer(
        url,
        group=group,
        handler=handle,
        max_messages=batch,
        wait_ms=1000,
        handle_signals=False,
        transport=transport,
    )
    await consumer.start()
    started = time.perf_counter()
    await finished.wait()
    elapsed = time.perf_counter() - started
    await consumer.stop()
    return elapsed


def run_sdk_sync(url: str, group: str, total: int, batch: int, transport: Any) -> float:
    lock, finished, seen = threading.Lock(), threading.Event(), 0

    def handle(msg: Message) -> None:
        nonlocal seen
        with lock:
            seen += 1
            if seen == total:
                finished.set()

    consumer = Consumer(
        url,
        group=group,
        handler=handle,
        max_messages=batch,
        wait_ms=1000,
        handle_signals=False,
        transport=transport,
    )
    consumer.start()
    started = time.perf_counter()
    finished.wait()
    elapsed = time.perf_counter() - started
    consumer.stop()
    return elapsed


def canned_transport(batch: int) -> httpx.MockTransport:
    """An in-process stand-in for the server (sync and async) that answer every pull with
    ``batch`` ready messages: what is left to measure is the client's own cost."""
    messages = [
        {
            "topic": TOPIC,
            "qid": i % 8,
            "offset": i,
            "key": f"k{i}",
            "headers": {},
            "attempt": 1,
            "body": {"n": i, "pad": "x" * 64},
            "produced_at_ms": 1,
        }
        for i in range(batch)
    ]
    pull = orjson.dumps({"messages": messages, "results": {"applied": batch, "unknown": []}})
    other = orjson.dumps({"applied": 0, "unknown": [], "ack_timeout_ms": 30_000})

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=pull if request.url.path.endswith("/pull") else other)

    return httpx.MockTransport(handle)


def main() -> None:
    parser = arg_parser(__doc__, "5,000 messages, 3 rounds")
    parser.add_argument("--messages", type=int, help="default 20,000 (5,000 with --quick)")
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--order-by", default="key")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--client-only", action="store_true", help="canned in-process answers")
    args = parser.parse_args()
    n, batch = args.messages or (5_000 if args.quick else 20_000), args.batch
    transport = canned_transport(batch) if args.client_only else None
    contenders: dict[str, Callable[[str, str], float]] = {
        "client-core": lambda url, g: asyncio.run(run_core(url, g, n, batch, transport)),
        "sdk-async": lambda url, g: asyncio.run(run_sdk_async(url, g, n, batch, transport)),
        "sdk-sync": lambda url, g: run_sdk_sync(url, g, n, batch, transport),
    }
    names = list(contenders)
    rates: dict[str, list[float]] = defaultdict(list)
    cpu_us: dict[str, list[float]] = defaultdict(list)
    facts = machine_facts()
    with contextlib.ExitStack() as stack:
        url = "http://canned"
        if not args.client_only:
            (server,) = stack.enter_context(servers("cproxy-sdk-", None))
            url = server.url
            produce(url, n, args.keys, args.queues)
        for rnd in range(args.rounds):
            for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
                group = f"{name}-{rnd}-{os.getpid()}"
                if not args.client_only:
                    with Client(url) as c:
                        c.put_group(group, {"topics": {TOPIC: {"order_by": args.order_by}}})
                cpu = time.process_time()
                elapsed = contenders[name](url, group)
                cpu_us[name].append((time.process_time() - cpu) / n * 1e6)
                rates[name].append(n / elapsed)
                progress(f"round {rnd + 1} {name:11s} {rates[name][-1]:8.0f} msgs/s")
    rows = [
        {
            "consumer": name,
            "msgs_per_s": median(rates[name]),
            "ratio": median(
                [a / b for a, b in zip(rates[name], rates["client-core"], strict=True)]
            ),
            "client_cpu_us_per_msg": median(cpu_us[name]),
        }
        for name in names
    ]
    out = {"machine": facts, "messages": n, "rounds": args.rounds, "results": rows}
    text = table(
        [
            ("consumer", lambda r: r["consumer"]),
            ("msgs/s", lambda r: f"{r['msgs_per_s']:,.0f}"),
            ("ratio to client-core (target >= 0.8)", lambda r: f"{r['ratio']:.2f}"),
            ("client CPU per msg", lambda r: f"{r['client_cpu_us_per_msg']:.1f} µs"),
        ],
        rows,
    )
    where = "canned answers (client only)" if args.client_only else "a local server"
    header = (
        f"## SDK consumers against the client core ({n:,} messages, {args.keys:,} keys, "
        f"{args.queues} queues, batch {batch}, order_by {args.order_by}, {where}, "
        f"median of {args.rounds} rounds)"
    )
    finish(out, args, "sdk_consumer", f"{header}\n\n{text}")


if __name__ == "__main__":
    main()
