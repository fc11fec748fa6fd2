"""SDK consumer throughput versus a raw HTTP puller, on the same data, in the same run.

Starts ``cproxy serve`` in a subprocess (or uses ``--url``), produces ``--messages`` messages
over ``--keys`` keys into one topic, then lets each contender drain the topic in its own
consumer group (every group sees every message), with a trivial handler:

- ``raw``: an asyncio + httpx loop that pulls ``--batch`` messages and acks them on the next
  pull (the smallest correct client);
- ``sdk-async``: ``AsyncConsumer`` with an ``async def`` handler;
- ``sdk-sync``: ``Consumer`` with a plain function on its thread pool.

Each round runs every contender once, in a rotating order, on its own fresh group. Reported:
the median throughput per contender, the median of the per-round SDK/raw ratios (contenders of
one round ran back to back, so their ratio suffers least from drift in machine load; target
>= 0.8), and the client's CPU time per message (process time, so the SDK's own overhead shows
even on a busy machine).

    .venv/bin/python benchmarks/sdk_consumer.py --messages 20000 --rounds 7
    .venv/bin/python benchmarks/sdk_consumer.py --client-only --messages 100000

``--client-only`` replaces the server by canned in-process answers, so only the client's own
work is timed: the SDK's overhead per message, free of server speed and machine load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson

from consumer_sdk import AsyncConsumer, Client, Consumer, Message, Producer

TOPIC = "bench"


@contextmanager
def server(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as data:
        cmd = [
            sys.executable,
            "-m",
            "cproxy.cli",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            data,
            "--log-level",
            "warning",
        ]
        proc = subprocess.Popen(cmd)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"{base}/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("server did not start")
                time.sleep(0.05)
            yield base
        finally:
            proc.terminate()
            proc.wait(30)


def produce(url: str, messages: int, keys: int, queues: int) -> None:
    with Producer(url, timeout_ms=60_000) as producer:
        producer.create_topic(TOPIC, queues)
        for start in range(0, messages, 1000):
            batch = [
                {"key": f"k{n % keys}", "body": {"n": n, "pad": "x" * 64}}
                for n in range(start, min(start + 1000, messages))
            ]
            producer.send_batch(TOPIC, batch)


def make_group(url: str, name: str, order_by: str) -> None:
    with Client(url) as client:
        client.put_group(name, {"topics": {TOPIC: {"order_by": order_by}}})


async def run_raw(url: str, group: str, total: int, batch: int, transport: Any = None) -> float:
    headers = {"content-type": "application/json"}
    seen = 0
    async with httpx.AsyncClient(base_url=url, timeout=60, transport=transport) as http:
        results: list[dict[str, Any]] = []
        started = time.perf_counter()
        while seen < total:
            body = {"max_messages": batch, "wait_ms": 1000, "results": results}
            response = await http.post(
                f"/v1/groups/{group}/pull", content=orjson.dumps(body), headers=headers
            )
            messages = orjson.loads(response.content)["messages"]
            acks: dict[tuple[str, int], list[int]] = defaultdict(list)
            for m in messages:
                seen += 1  # the trivial handler
                acks[(m["topic"], m["qid"])].append(m["offset"])
            results = [{"topic": t, "qid": q, "acks": offs} for (t, q), offs in acks.items()]
        elapsed = time.perf_counter() - started
        await http.post(
            f"/v1/groups/{group}/ack", content=orjson.dumps({"results": results}), headers=headers
        )
    return elapsed


async def run_sdk_async(
    url: str, group: str, total: int, batch: int, transport: Any = None
) -> float:
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


def run_sdk_sync(url: str, group: str, total: int, batch: int, transport: Any = None) -> float:
    lock = threading.Lock()
    finished = threading.Event()
    seen = 0

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
    """An in-process stand-in for the server that answers every pull with ``batch`` ready
    messages: what is left to measure is the client's own cost per message."""
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="use a running server instead of starting one")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--order-by", default="key")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--client-only",
        action="store_true",
        help="no server: answer pulls in-process, to measure the client's own overhead",
    )
    args = parser.parse_args()
    n, batch = args.messages, args.batch
    transport = canned_transport(batch) if args.client_only else None

    contenders: dict[str, Callable[[str, str], float]] = {
        "raw": lambda url, g: asyncio.run(run_raw(url, g, n, batch, transport)),
        "sdk-async": lambda url, g: asyncio.run(run_sdk_async(url, g, n, batch, transport)),
        "sdk-sync": lambda url, g: run_sdk_sync(url, g, n, batch, transport),
    }
    names = list(contenders)
    rates: dict[str, list[float]] = defaultdict(list)
    cpu_us: dict[str, list[float]] = defaultdict(list)
    with contextlib.nullcontext("http://canned") if args.client_only else server(args.url) as url:
        if not args.client_only:
            produce(url, args.messages, args.keys, args.queues)
        for rnd in range(args.rounds):
            for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
                group = f"{name}-{rnd}-{os.getpid()}"
                if not args.client_only:
                    make_group(url, group, args.order_by)
                cpu = time.process_time()
                elapsed = contenders[name](url, group)
                cpu_us[name].append((time.process_time() - cpu) / args.messages * 1e6)
                rates[name].append(args.messages / elapsed)
                print(
                    f"round {rnd + 1} {name:9s} {rates[name][-1]:8.0f} msg/s "
                    f"{cpu_us[name][-1]:6.1f} us CPU/msg",
                    flush=True,
                )
    print(
        f"\n{args.messages} messages, {args.keys} keys, {args.queues} queues, "
        f"batch {args.batch}, order_by {args.order_by}, {args.rounds} rounds (medians)"
    )
    for name in names:
        ratio = statistics.median(a / b for a, b in zip(rates[name], rates["raw"], strict=True))
        print(
            f"{name:9s} {statistics.median(rates[name]):8.0f} msg/s   "
            f"ratio to raw {ratio:5.2f}   client CPU {statistics.median(cpu_us[name]):6.1f} us/msg"
        )


if __name__ == "__main__":
    main()
