"""Serial chains through the SDK: how much time is lost per hop between an ack and the next
delivery of the same chain (Confluent Parallel Consumer's benchmark, replayed).

A backlog is produced first, then each contender drains it in its own fresh group:

- ``chain``: ``--messages`` (10,000) messages on one queue, ``order_by: qid``: a single chain,
  so every message waits for the previous one's ack. Handlers sleep a seeded random 0-5 ms.
  Ideal: wall time = the sum of handler times (target: wall <= 1.3x handler time).
- ``keys``: as many distinct keys as messages, ``order_by: key``, ``concurrency`` 16 (8
  queues): nothing waits on anything. Ideal: wall = handler time / concurrency (target
  <= 1.5x).

Contenders: ``Consumer`` (thread pool) and ``AsyncConsumer`` (``async def`` handler), each
with ``max_per_key`` 1 and 32, in rotating order per round. Wall time runs from the
consumer's start (group prepared) to the last first delivery's handler finishing. Handler
time is measured around each handler's sleep (``time.sleep`` overshoots its argument a little;
the nominal sum of the seeded sleeps is reported too). The handler checks order (per chain:
offsets rise one by one; per key: trivially) and counts first deliveries only.

    python -m benchmarks.serial_chain --quick          # 1,000 messages, 2 rounds
    python -m benchmarks.serial_chain                  # 10,000 messages, 3 rounds
    python -m benchmarks.serial_chain --only chain --rounds 5
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.harness.probe import Probe
from benchmarks.harness.report import (
    arg_parser,
    finish,
    load_average,
    machine_facts,
    median,
    progress,
    table,
)
from benchmarks.harness.server import servers
from consumer_sdk import AsyncConsumer, Client, Consumer, Message, Producer

SCENARIOS = {"chain": ("qid", 1, 8), "keys": ("key", 8, 16)}  # order_by, queues, concurrency
MAX_SLEEP_MS = 5.0


def sleeps_ms(n: int, seed: int) -> list[float]:
    """The handler's sleep per message: seeded uniform 0-5 ms (mean 2.5 ms)."""
    rng = random.Random(seed)
    return [round(rng.uniform(0, MAX_SLEEP_MS), 3) for _ in range(n)]


def produce(url: str, topic: str, queues: int, sleeps: list[float]) -> None:
    """Message ``i`` has key ``k{i}`` (distinct) and body ``{"i": i, "ms": sleep}``."""
    with Producer(url, timeout_ms=60_000) as producer:
        producer.create_topic(topic, queues)
        for start in range(0, len(sleeps), 1000):
            batch = [
                {"key": f"k{i}", "body": {"i": i, "ms": sleeps[i]}}
                for i in range(start, min(start + 1000, len(sleeps)))
            ]
            producer.send_batch(topic, batch)


@dataclass
class Tally:
    """What the handlers saw; thread-safe (sync handlers run on a pool)."""

    total: int
    serial: bool
    lock: threading.Lock = field(default_factory=threading.Lock)
    seen: set[int] = field(default_factory=set)
    handler_s: float = 0.0
    last_i: int = -1
    order_violations: int = 0
    redeliveries: int = 0
    done_at: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)

    def record(self, msg: Message, spent_s: float) -> None:
        i = msg.body["i"]
        with self.lock:
            if msg.attempt > 1 or i in self.seen:
                self.redeliveries += 1
                return
            if self.serial and i != self.last_i + 1:
                self.order_violations += 1
            self.last_i = i
            self.seen.add(i)
            self.handler_s += spent_s
            if len(self.seen) == self.total:
                self.done_at = time.perf_counter()
                self.done.set()


#: Extra consumer options from ``--set NAME=INT`` (e.g. ``ack_linger_ms=0``), for experiments.
OPTIONS: dict[str, int] = {}


def run_sync(url: str, group: str, tally: Tally, concurrency: int, mpk: int) -> float:
    def handle(msg: Message) -> None:
        t = time.perf_counter()
        time.sleep(msg.body["ms"] / 1000)
        tally.record(msg, time.perf_counter() - t)

    consumer = Consumer(
        url,
        group=group,
        handler=handle,
        concurrency=concurrency,
        max_per_key=mpk,
        handle_signals=False,
        **OPTIONS,  # type: ignore[arg-type]
    )
    consumer.start()
    started = time.perf_counter()
    try:
        if not tally.done.wait(600):
            raise RuntimeError(f"{group}: {len(tally.seen)} of {tally.total} after 600 s")
    finally:
        consumer.stop()
    return tally.done_at - started


async def run_async(url: str, group: str, tally: Tally, concurrency: int, mpk: int) -> float:
    async def handle(msg: Message) -> None:
        t = time.perf_counter()
        await asyncio.sleep(msg.body["ms"] / 1000)
        tally.record(msg, time.perf_counter() - t)

    consumer = AsyncConsumer(
        url,
        group=group,
        handler=handle,
        concurrency=concurrency,
        max_per_key=mpk,
        handle_signals=False,
        **OPTIONS,  # type: ignore[arg-type]
    )
    await consumer.start()
    started = time.perf_counter()
    try:
        deadline = time.monotonic() + 600
        while not tally.done.is_set():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{group}: {len(tally.seen)} of {tally.total} after 600 s")
            await asyncio.sleep(0.005)
    finally:
        await consumer.stop()
    return tally.done_at - started


Runner = Callable[[str, str, Tally, int, int], float]
KINDS: dict[str, Runner] = {
    "Consumer": run_sync,
    "AsyncConsumer": lambda url, g, t, c, m: asyncio.run(run_async(url, g, t, c, m)),
}


def main() -> None:
    parser = arg_parser(__doc__, "1,000 messages, 2 rounds")
    parser.add_argument("--messages", type=int, help="default 10,000 (1,000 with --quick)")
    parser.add_argument("--rounds", type=int, help="default 3 (2 with --quick)")
    parser.add_argument("--seed", type=int, default=10)
    parser.add_argument("--only", choices=sorted(SCENARIOS), help="one scenario only")
    parser.add_argument("--kinds", default=",".join(KINDS), help="consumers to run")
    parser.add_argument("--max-per-key", default="1,32", help="values to compare")
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=INT", help="a consumer option"
    )
    args = parser.parse_args()
    OPTIONS.update({k: int(v) for k, v in (o.split("=", 1) for o in args.set)})
    n = args.messages or (1_000 if args.quick else 10_000)
    rounds = args.rounds or (2 if args.quick else 3)
    sleeps = sleeps_ms(n, args.seed)
    scenarios = [args.only] if args.only else list(SCENARIOS)
    contenders = [
        (kind, int(m)) for kind in args.kinds.split(",") for m in args.max_per_key.split(",")
    ]
    facts = machine_facts()
    runs: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    with servers("cproxy-chain-", None) as (server,):
        for scenario in scenarios:
            order_by, queues, concurrency = SCENARIOS[scenario]
            topic = f"{scenario}-{os.getpid()}"
            produce(server.url, topic, queues, sleeps)
            for rnd in range(rounds):
                shift = rnd % len(contenders)
                for kind, mpk in [*contenders[shift:], *contenders[:shift]]:
                    group = f"{topic}-{kind}-{mpk}-r{rnd}"
                    with Client(server.url) as c:
                        c.put_group(group, {"topics": {topic: {"order_by": order_by}}})
                    tally = Tally(n, serial=scenario == "chain")
                    with Probe(server.pid) as p:
                        wall = KINDS[kind](server.url, group, tally, concurrency, mpk)
                    ideal = tally.handler_s / concurrency if scenario == "keys" else tally.handler_s
                    r = {
                        "wall_s": round(wall, 3),
                        "handler_s": round(tally.handler_s, 3),
                        "ideal_s": round(ideal, 3),
                        "ratio": round(wall / ideal, 3),
                        "lost_ms_per_hop": round((wall - ideal) / n * 1000, 3),
                        "server_cpu_us_per_msg": round(p.server_cpu / n * 1e6),
                        "client_cpu_us_per_msg": round(p.client_cpu / n * 1e6),
                        "order_violations": tally.order_violations,
                        "redeliveries": tally.redeliveries,
                        "load_1m": load_average(),
                    }
                    runs[(scenario, kind, mpk)].append(r)
                    progress(
                        f"round {rnd + 1} {scenario:5s} {kind:13s} max_per_key {mpk:2d}: "
                        f"wall {wall:6.2f} s, ideal {ideal:6.2f} s, ratio {r['ratio']:.2f}, "
                        f"cpu/msg server {r['server_cpu_us_per_msg']} µs "
                        f"client {r['client_cpu_us_per_msg']} µs, "
                        f"load {r['load_1m']}"
                    )
                    with Client(server.url) as c:
                        c.delete_group(group)
    rows = [
        {
            "scenario": scenario,
            "consumer": kind,
            "max_per_key": mpk,
            "wall_s": median([r["wall_s"] for r in rs]),
            "handler_s": median([r["handler_s"] for r in rs]),
            "ideal_s": median([r["ideal_s"] for r in rs]),
            "ratio": median([r["ratio"] for r in rs]),
            "lost_ms_per_hop": median([r["lost_ms_per_hop"] for r in rs]),
            "order_violations": sum(r["order_violations"] for r in rs),
            "runs": len(rs),
        }
        for (scenario, kind, mpk), rs in runs.items()
    ]
    targets = {"chain": 1.3, "keys": 1.5}
    text = table(
        [
            ("scenario", lambda r: r["scenario"]),
            ("consumer", lambda r: r["consumer"]),
            ("max_per_key", lambda r: r["max_per_key"]),
            ("wall s", lambda r: f"{r['wall_s']:.2f}"),
            ("handler time s", lambda r: f"{r['handler_s']:.2f}"),
            ("ideal s", lambda r: f"{r['ideal_s']:.2f}"),
            ("**wall / ideal**", lambda r: f"**{r['ratio']:.2f}**"),
            ("target", lambda r: f"<= {targets[r['scenario']]}"),
            ("met", lambda r: "yes" if r["ratio"] <= targets[r["scenario"]] else "**no**"),
            ("lost per msg", lambda r: f"{r['lost_ms_per_hop']:.2f} ms"),
            ("order violations", lambda r: r["order_violations"]),
            ("runs", lambda r: r["runs"]),
        ],
        rows,
    )
    header = (
        f"## Serial chain and distinct keys through the SDK ({n:,} messages, handler sleeps "
        f"seeded 0-5 ms: nominal sum {sum(sleeps) / 1000:.2f} s; median of {rounds} rounds)\n\n"
        "chain = one queue, `order_by: qid`, concurrency 8, ideal = handler time; keys = "
        f"{n:,} distinct keys, `order_by: key`, 8 queues, concurrency 16, ideal = handler "
        "time / 16."
    )
    out = {"machine": facts, "messages": n, "rounds": rounds, "seed": args.seed, "rows": rows}
    out["runs"] = {"/".join(map(str, k)): v for k, v in runs.items()}
    finish(out, args, "serial_chain", f"{header}\n\n{text}")


if __name__ == "__main__":
    main()
