"""Workload helpers shared by matrix.py, isolation.py, memory.py and scaling.py.

Builds on ``_common`` (server subprocess, machine facts, tables) and ``e2e`` (group stats,
CPU probe, RSS). What is added here: message sets over any number of keys and any body size,
a closed-loop producer that keeps per-key order across concurrent producers, pullers with a
per-key *policy* (ack, fail or hold = never ack) that count healthy and stalled deliveries
separately, an open-loop producer for latency, and small statistics helpers.

Message ``i`` of a set has key ``k{i % keys}`` and body ``{"k": i % keys, "s": i // keys,
"t": send time ns (open loop only), "p": padding}``: ``s`` increases by one per key, so a
puller can check per-key order.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx
import orjson

from benchmarks._common import ServerProcess
from benchmarks.e2e import Probe, group_stats, rss

__all__ = [
    "JSON",
    "Action",
    "ConsumerStats",
    "Probe",
    "ServerProcess",
    "consume",
    "create_topic",
    "delete_group",
    "fmt_ratio",
    "git_commit",
    "group_stats",
    "key_stride",
    "load_average",
    "make_batches",
    "median",
    "open_loop_produce",
    "produce",
    "put_group",
    "rss",
    "run_loop",
]

JSON = {"content-type": "application/json"}
T = TypeVar("T")
Action = Literal["ack", "ack_other", "fail", "hold"]


# -- environment ---------------------------------------------------------------------------------
def git_commit() -> str:
    """Short commit of the working tree measured (plus ``+dirty`` if cproxy/ has changes)."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "cproxy"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty(cproxy/)" if dirty else "")


def run_with_server(
    prefix: str, run: Callable[[ServerProcess], Coroutine[Any, Any, dict[str, Any]]]
) -> dict[str, Any]:
    """Start a server on a temp data dir, run ``run(server)``, always stop and clean up.

    On any failure the server's log is printed first, since that is where the cause is.
    """
    root = Path(tempfile.mkdtemp(prefix=prefix))
    server = ServerProcess(root / "data")
    try:
        server.start()
        return run_loop(lambda: run(server))
    except BaseException:
        print(server.log(), file=sys.stderr)
        raise
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def load_average() -> float:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else float("nan")


def run_loop(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` on uvloop when installed (the client must not be the bottleneck)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    return uvloop.run(main())


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def fmt_ratio(value: float) -> str:
    return "n/a" if value != value else f"{value:.2f}"  # NaN check


# -- messages ------------------------------------------------------------------------------------
def body_pad(body_bytes: int) -> str:
    """Padding so that the encoded body is about ``body_bytes`` (the rest is ~30 bytes)."""
    return "x" * max(0, body_bytes - 30)


def make_batches(total: int, batch: int, keys: int, body_bytes: int, first: int = 0) -> list[bytes]:
    """Pre-encoded produce request bodies for messages ``first .. first + total - 1``."""
    pad = body_pad(body_bytes)
    out: list[bytes] = []
    for start in range(first, first + total, batch):
        end = min(first + total, start + batch)
        messages = [
            {"key": f"k{i % keys}", "body": {"k": i % keys, "s": i // keys, "p": pad}}
            for i in range(start, end)
        ]
        out.append(orjson.dumps({"messages": messages}))
    return out


def key_stride(batch: int, keys: int) -> int:
    """Batches closer than this share no key (message i has key i % keys)."""
    return max(1, keys // batch)


async def create_topic(client: httpx.AsyncClient, topic: str, queues: int) -> None:
    r = await client.post("/v1/topics", json={"name": topic, "queues": queues})
    r.raise_for_status()


async def put_group(
    client: httpx.AsyncClient, group: str, topic: str, order_by: str = "key", **config: Any
) -> dict[str, Any]:
    r = await client.put(
        f"/v1/groups/{group}", json={"topics": {topic: {"order_by": order_by}}, **config}
    )
    r.raise_for_status()
    effective: dict[str, Any] = r.json()
    return effective


async def delete_group(client: httpx.AsyncClient, group: str) -> None:
    r = await client.delete(f"/v1/groups/{group}")
    if r.status_code not in (200, 404):
        r.raise_for_status()


# -- producing -----------------------------------------------------------------------------------
async def produce(
    url: str, topic: str, batches: Sequence[bytes], producers: int, stride: int
) -> float:
    """Closed loop: send every batch through ``producers`` clients; returns elapsed seconds.

    Per-key order across concurrent producers: batch ``b`` is sent only once every batch up to
    ``b - stride`` is stored (batches less than ``stride`` apart share no key).
    """
    it = iter(enumerate(batches))
    stored = [False] * len(batches)
    watermark = 0  # every batch below this one is stored
    changed = asyncio.Condition()

    async def worker() -> None:
        nonlocal watermark
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            for b, body in it:
                if b - stride >= watermark:
                    async with changed:
                        while b - stride >= watermark:
                            await changed.wait()
                r = await client.post(f"/v1/topics/{topic}/messages", content=body, headers=JSON)
                if r.status_code != 200:
                    raise RuntimeError(f"produce {r.status_code}: {r.text[:300]}")
                stored[b] = True
                if b == watermark:
                    while watermark < len(stored) and stored[watermark]:
                        watermark += 1
                    async with changed:
                        changed.notify_all()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(producers)))
    return time.perf_counter() - started


@dataclass
class OpenLoopResult:
    messages: int
    seconds: float
    late_batches: int
    call_ms: list[float]


async def open_loop_produce(
    url: str,
    topic: str,
    rate: float,
    batch: int,
    seconds: float,
    keys: int,
    body_bytes: int = 100,
    max_outstanding: int = 64,
) -> OpenLoopResult:
    """Send ``rate`` msgs/s in batches of ``batch`` for ``seconds``, never waiting on replies
    (beyond per-key order and ``max_outstanding`` calls); the body carries the send time."""
    pad = body_pad(body_bytes)
    n_batches = max(1, round(seconds * rate / batch))
    stride = key_stride(batch, keys)
    tasks: list[asyncio.Task[None]] = []
    outstanding = asyncio.Semaphore(max_outstanding)
    call_ms: list[float] = []
    late = 0
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def send(b: int) -> None:
            if b >= stride:
                await tasks[b - stride]
            async with outstanding:
                now = time.time_ns()
                messages = [
                    {
                        "key": f"k{i % keys}",
                        "body": {"k": i % keys, "s": i // keys, "t": now, "p": pad},
                    }
                    for i in range(b * batch, (b + 1) * batch)
                ]
                t = time.perf_counter()
                r = await client.post(
                    f"/v1/topics/{topic}/messages",
                    content=orjson.dumps({"messages": messages}),
                    headers=JSON,
                )
                call_ms.append((time.perf_counter() - t) * 1000)
                r.raise_for_status()

        interval = batch / rate
        t0 = time.perf_counter()
        for b in range(n_batches):
            delay = t0 + b * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -interval:
                late += 1
            tasks.append(asyncio.create_task(send(b)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - t0
    return OpenLoopResult(n_batches * batch, elapsed, late, call_ms)


# -- consuming -----------------------------------------------------------------------------------
@dataclass
class ConsumerStats:
    """What a set of pullers saw. *Healthy* = messages whose key the policy acks."""

    healthy_total: int
    started: float = field(default_factory=time.perf_counter)
    healthy_delivered: int = 0  # first deliveries of healthy messages
    healthy_done_at: float = 0.0
    stalled_deliveries: int = 0  # every delivery of a held or failed message
    redeliveries: int = 0  # healthy messages delivered again (attempt > 1)
    order_violations: int = 0
    pulls: int = 0
    empty_pulls: int = 0
    latencies_store_ms: list[float] = field(default_factory=list)
    latencies_send_ms: list[float] = field(default_factory=list)
    last_seq: dict[int, int] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # healthy first deliveries over time: (seconds since start, cumulative count)
    timeline: list[tuple[float, int]] = field(default_factory=list)

    @property
    def healthy_seconds(self) -> float:
        end = self.healthy_done_at or time.perf_counter()
        return end - self.started

    @property
    def healthy_rate(self) -> float:
        return self.healthy_delivered / max(self.healthy_seconds, 1e-9)


async def _puller(
    url: str,
    group: str,
    stats: ConsumerStats,
    policy: Callable[[int], Action] | None,
    max_messages: int,
    wait_ms: int,
    record_latency: bool,
    stop: asyncio.Event,
) -> None:
    results: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        while not stop.is_set():
            body = {"max_messages": max_messages, "wait_ms": wait_ms, "results": results}
            r = await client.post(
                f"/v1/groups/{group}/pull", content=orjson.dumps(body), headers=JSON
            )
            if r.status_code != 200:
                raise RuntimeError(f"pull {r.status_code}: {r.text[:300]}")
            messages = orjson.loads(r.content)["messages"]
            now = time.perf_counter()
            now_ns = time.time_ns()
            stats.pulls += 1
            if not messages:
                stats.empty_pulls += 1
                results = []
                continue
            acks: dict[tuple[str, int], list[int]] = defaultdict(list)
            fails: dict[tuple[str, int], list[int]] = defaultdict(list)
            for m in messages:
                b = m["body"]
                k, seq = b["k"], b["s"]
                if stats.last_seq.get(k, -1) > seq:
                    stats.order_violations += 1
                stats.last_seq[k] = seq
                action: Action = "ack" if policy is None else policy(k)
                ref = (m["topic"], m["qid"])
                if action == "ack_other":
                    acks[ref].append(m["offset"])  # acked, but not one of the counted keys
                elif action == "ack":
                    acks[ref].append(m["offset"])
                    if m["attempt"] == 1:
                        stats.healthy_delivered += 1
                    else:
                        stats.redeliveries += 1
                    if record_latency:
                        stats.latencies_store_ms.append(now_ns / 1e6 - m["produced_at_ms"])
                        if "t" in b:
                            stats.latencies_send_ms.append((now_ns - b["t"]) / 1e6)
                else:
                    stats.stalled_deliveries += 1
                    if action == "fail":
                        fails[ref].append(m["offset"])
            stats.timeline.append((now - stats.started, stats.healthy_delivered))
            results = [{"topic": t, "qid": q, "acks": offs} for (t, q), offs in acks.items()]
            results += [{"topic": t, "qid": q, "fails": offs} for (t, q), offs in fails.items()]
            if stats.healthy_delivered >= stats.healthy_total and not stats.done.is_set():
                stats.healthy_done_at = now
                stats.done.set()
        if results:  # flush the last acks
            r = await client.post(
                f"/v1/groups/{group}/ack", content=orjson.dumps({"results": results}), headers=JSON
            )
            r.raise_for_status()


async def consume(
    url: str,
    group: str,
    healthy_total: int,
    pullers: int,
    max_messages: int,
    *,
    wait_ms: int = 1000,
    policy: Callable[[int], Action] | None = None,
    time_limit_s: float | None = None,
    record_latency: bool = False,
    started: Awaitable[None] | None = None,
) -> ConsumerStats:
    """Pull until ``healthy_total`` healthy messages were delivered once (or the time limit).

    ``policy(key index)`` decides per delivery: ``ack`` (healthy, counted), ``ack_other``
    (acked, not counted), ``fail`` (always-fail stall) or ``hold`` (never-ack stall: kept in
    flight, never reported). Acks ride on the
    next pull; the pullers flush them with one ``ack`` call at the end.
    """
    stats = ConsumerStats(healthy_total)
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(
            _puller(url, group, stats, policy, max_messages, wait_ms, record_latency, stop)
        )
        for _ in range(pullers)
    ]
    if started is not None:
        await started
    stats.started = time.perf_counter()
    try:
        waiter = asyncio.create_task(stats.done.wait())
        done, _ = await asyncio.wait(
            [waiter, *tasks], timeout=time_limit_s, return_when=asyncio.FIRST_COMPLETED
        )
        for t in done:
            if t is not waiter and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        waiter.cancel()
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return stats
