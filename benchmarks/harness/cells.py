"""End-to-end cells (matrix, scaling): on a fresh topic and group (``order_by: key``),
4 closed-loop producers and N pullers run at the same time; the rate is messages / (first
produce -> last message delivered). ``batch`` is both the produce batch and the pull
``max_messages``; acks ride on the next pull."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.harness.ab import Side
from benchmarks.harness.load import (
    consume,
    create_topic,
    delete_group,
    key_stride,
    make_batches,
    produce,
    put_group,
)
from benchmarks.harness.probe import Probe
from benchmarks.harness.report import load_average

QUEUES = 8
BODY_BYTES = 100
PRODUCERS = 4


@dataclass(frozen=True)
class Cell:
    sweep: str
    keys: int
    batch: int
    pullers: int
    queues: int = QUEUES
    body_bytes: int = BODY_BYTES
    messages: int = 0

    @property
    def name(self) -> str:
        name = f"k{self.keys}-b{self.batch}-p{self.pullers}"
        if self.queues != QUEUES:
            name += f"-q{self.queues}"
        if self.body_bytes != BODY_BYTES:
            name += f"-s{self.body_bytes}"
        return name


async def run_cell(side: Side, cell: Cell, tag: str) -> dict[str, Any]:
    """One measurement of ``cell`` against ``side``'s server; the group is deleted after."""
    topic, group = f"m-{cell.name}-{tag}", f"m-{cell.name}-{tag}-g"
    n = cell.messages
    await create_topic(side.admin, topic, cell.queues)
    await put_group(side.admin, group, topic, "key")
    batches = make_batches(n, cell.batch, cell.keys, cell.body_bytes)
    try:
        with Probe(side.pid) as p:
            t0 = time.perf_counter()
            consumer = asyncio.create_task(
                consume(side.url, group, n, cell.pullers, cell.batch, wait_ms=1000)
            )
            produce_s = await produce(
                side.url, topic, batches, PRODUCERS, key_stride(cell.batch, cell.keys)
            )
            stats = await consumer
            elapsed = stats.healthy_done_at - t0
    finally:
        await delete_group(side.admin, group)
    return {
        "cell": asdict(cell),
        "messages": n,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(n / elapsed),
        "mb_per_s": round(n * cell.body_bytes / elapsed / 1e6, 2),
        "produce_only_msgs_per_s": round(n / produce_s),
        "server_cpu_us_per_msg": round(p.server_cpu / n * 1e6, 1),
        "msgs_per_server_cpu_s": round(n / max(p.server_cpu, 1e-9)),
        # Over the measured span: the pullers' last long polls after it cost ~no CPU.
        "server_core_share": round(p.server_cpu / elapsed, 2),
        "client_core_share": round(p.client_cpu / elapsed, 2),
        "pulls": stats.pulls,
        "empty_pulls": stats.empty_pulls,
        "order_violations": stats.order_violations,
        "load_1m": load_average(),
    }


def describe(r: dict[str, Any]) -> str:
    """One progress line for a cell result."""
    return (
        f"{r['msgs_per_s']:7,} msgs/s {r['mb_per_s']:6.1f} MB/s "
        f"{r['server_cpu_us_per_msg']:6.1f} µs/msg server ({r['server_core_share']:.0%} core) "
        f"load {r['load_1m']}"
    )


AB_METRICS = (("e2e msgs/s", "msgs_per_s"), ("msgs per server CPU-s", "msgs_per_server_cpu_s"))
