"""Load generators, all HTTP through ``consumer_sdk.AsyncClient`` (one client per task):
:func:`produce` (closed loop, per-key order kept across producers), :func:`open_loop_produce`
(a fixed rate that never waits on replies) and :func:`consume` (pullers; acks ride on the next
pull). Message ``i`` has key ``k{i % keys}`` and body ``{"k": i % keys, "s": i // keys, "p":
padding}`` (plus ``"t"``, the send time in ns, open loop only): ``s`` shows per-key order.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from consumer_sdk import AsyncClient, QueueResult, ResourceNotFound, new_message_id

T = TypeVar("T")
Batch = list[dict[str, Any]]
#: Per call; generous, since a loaded 2-core machine can take seconds per call.
TIMEOUT_MS = 120_000


def run_loop(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` on uvloop with the collector's full passes off: they stopped the load
    generator for 40-60 ms every ~2 s at 27k msgs/s, which showed as the server's p99."""
    gc.collect()
    gc.freeze()  # what exists now (modules, ...) is never scanned
    young, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, 1_000_000_000)
    try:
        try:
            import uvloop
        except ImportError:
            return asyncio.run(main())
        return uvloop.run(main())
    finally:
        gc.set_threshold(young, middle, old)
        gc.unfreeze()
        gc.collect()


def client(url: str) -> AsyncClient:
    return AsyncClient(url, timeout_ms=TIMEOUT_MS)


def as_urls(url: str | Sequence[str]) -> list[str]:
    """One server's URL, or the proxies of one cluster."""
    return [url] if isinstance(url, str) else list(url)


# -- admin ---------------------------------------------------------------------------------------
async def create_topic(c: AsyncClient, topic: str, queues: int) -> None:
    await c.create_topic(topic, queues)


async def put_group(
    c: AsyncClient, group: str, topic: str, order_by: str = "key", **config: Any
) -> dict[str, Any]:
    """Create the group on ``topic``; returns the effective config."""
    return await c.put_group(group, {"topics": {topic: {"order_by": order_by}}, **config})


async def delete_group(c: AsyncClient, group: str) -> None:
    with contextlib.suppress(ResourceNotFound):
        await c.delete_group(group)


async def wait_stats(
    c: AsyncClient,
    group: str,
    done: Callable[[dict[str, Any]], bool],
    what: str,
    timeout_s: float = 120.0,
    every_s: float = 0.05,
) -> dict[str, Any]:
    """Poll the group's stats until ``done(stats)``; RuntimeError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        s: dict[str, Any] = (await c.get_group(group))["stats"]
        if done(s):
            return s
        if time.monotonic() > deadline:
            raise RuntimeError(f"group {group} not {what} after {timeout_s} s: {s}")
        await asyncio.sleep(every_s)


# -- messages ------------------------------------------------------------------------------------
def pad_for(body_bytes: int) -> str:
    """Padding so the encoded body is about ``body_bytes`` (the rest is ~30 bytes)."""
    return "x" * max(0, body_bytes - 30)


def message(i: int, keys: int, pad: str, ids: str = "") -> dict[str, Any]:
    """Message ``i``; ``ids``: with an id the server dedups by, "random" (32 hex digits,
    random-looking like a UUID4) or "ordered" (a UUIDv7 from ``new_message_id``)."""
    m: dict[str, Any] = {"key": f"k{i % keys}", "body": {"k": i % keys, "s": i // keys, "p": pad}}
    if ids == "random":
        m["id"] = hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).hexdigest()
    elif ids == "ordered":
        m["id"] = new_message_id()
    elif ids:
        raise ValueError(f"ids must be '', 'random' or 'ordered', not {ids!r}")
    return m


def make_batches(total: int, batch: int, keys: int, body_bytes: int, ids: str = "") -> list[Batch]:
    """Messages ``0 .. total - 1`` in produce calls of ``batch``, built before timing;
    ``ids``: each with a message id of that kind (``message``)."""
    pad = pad_for(body_bytes)
    return [
        [message(i, keys, pad, ids) for i in range(start, min(total, start + batch))]
        for start in range(0, total, batch)
    ]


def key_stride(batch: int, keys: int) -> int:
    """Batches closer than this share no key (message i has key i % keys)."""
    return max(1, keys // batch)


# -- producing -----------------------------------------------------------------------------------
async def produce(
    url: str | Sequence[str], topic: str, batches: Sequence[Batch], producers: int, stride: int
) -> float:
    """Closed loop: send every batch through ``producers`` clients; returns elapsed seconds.
    Several URLs (proxies of one cluster): producer ``i`` sends to ``urls[i % len(urls)]``.

    Per-key order across concurrent producers: batch ``b`` is sent only once every batch up
    to ``b - stride`` is stored (batches less than ``stride`` apart share no key).
    """
    urls = as_urls(url)
    it = iter(enumerate(batches))
    stored = [False] * len(batches)
    watermark = 0  # every batch below this one is stored
    changed = asyncio.Condition()

    async def worker(url: str) -> None:
        nonlocal watermark
        async with client(url) as c:
            for b, batch in it:
                if b - stride >= watermark:
                    async with changed:
                        while b - stride >= watermark:
                            await changed.wait()
                await c.produce(topic, batch)
                stored[b] = True
                if b == watermark:
                    while watermark < len(stored) and stored[watermark]:
                        watermark += 1
                    async with changed:
                        changed.notify_all()

    started = time.perf_counter()
    await asyncio.gather(*(worker(urls[i % len(urls)]) for i in range(producers)))
    return time.perf_counter() - started


@dataclass
class OpenLoopResult:
    messages: int
    seconds: float
    late_batches: int  # batches sent more than one interval after their slot


async def open_loop_produce(
    url: str | Sequence[str],
    topic: str,
    rate: float,
    batch: int,
    seconds: float,
    keys: int,
    body_bytes: int = 100,
    max_outstanding: int = 64,
    other: Callable[[Batch], Awaitable[None]] | None = None,
) -> OpenLoopResult:
    """Send ``rate`` msgs/s in batches of ``batch`` for ``seconds``, never waiting on replies
    (beyond per-key order and ``max_outstanding`` calls); bodies carry the send time. Several
    URLs: batch ``b`` goes to ``urls[b % len(urls)]``; ``other``: another system's client."""
    pad = pad_for(body_bytes)
    n_batches = max(1, round(seconds * rate / batch))
    stride = key_stride(batch, keys)
    tasks: list[asyncio.Task[None]] = []
    outstanding = asyncio.Semaphore(max_outstanding)
    late = 0
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(client(u)) for u in as_urls(url)]

        async def send(b: int) -> None:
            if b >= stride:
                await tasks[b - stride]
            async with outstanding:
                now = time.time_ns()
                messages = [message(i, keys, pad) for i in range(b * batch, (b + 1) * batch)]
                for m in messages:
                    m["body"]["t"] = now
                if other is not None:
                    await other(messages)
                else:
                    await clients[b % len(clients)].produce(topic, messages)

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
    return OpenLoopResult(n_batches * batch, elapsed, late)


# -- stalls --------------------------------------------------------------------------------------
#: Stall runs: nothing times out during a run, failures retry for the whole run.
STALL_GROUP_CONFIG: dict[str, Any] = {
    "ack_timeout_ms": 600_000,
    "max_attempts": 1000,
    "retry_backoff_ms": [200],
    "max_buffered": 10_000,
}


# -- consuming -----------------------------------------------------------------------------------
@dataclass
class ConsumerStats:
    """What a set of pullers saw."""

    total: int
    started: float = field(default_factory=time.perf_counter)
    delivered: int = 0  # first deliveries
    done_at: float = 0.0
    redeliveries: int = 0  # messages delivered again (attempt > 1)
    order_violations: int = 0
    pulls: int = 0
    empty_pulls: int = 0
    latencies_send_ms: list[float] = field(default_factory=list)
    last_seq: dict[int, int] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)


async def _puller(url: str, group: str, stats: ConsumerStats, max_messages: int, wait_ms: int,
                  record_latency: bool, stop: asyncio.Event,
                  polling: set[asyncio.Task[Any]]) -> None:  # fmt: skip
    results: list[QueueResult] = []
    me = asyncio.current_task()
    assert me is not None  # a puller always runs as a task of consume()
    async with client(url) as c:
        while not stop.is_set():
            polling.add(me)
            pulled = await c.pull(
                group, max_messages=max_messages, wait_ms=wait_ms, results=results
            )
            polling.discard(me)
            now, now_ns = time.perf_counter(), time.time_ns()
            stats.pulls += 1
            stats.empty_pulls += not pulled.messages
            acks: dict[tuple[str, int], list[int]] = {}
            for m in pulled.messages:
                k, seq = m.body["k"], m.body["s"]
                stats.order_violations += stats.last_seq.get(k, -1) > seq
                stats.last_seq[k] = seq
                acks.setdefault((m.topic, m.qid), []).append(m.offset)
                if m.attempt > 1:
                    stats.redeliveries += 1
                    continue
                stats.delivered += 1
                if record_latency and "t" in m.body:
                    stats.latencies_send_ms.append((now_ns - m.body["t"]) / 1e6)
            results = [QueueResult(t, q, acks=tuple(o)) for (t, q), o in acks.items()]
            if stats.delivered >= stats.total and not stats.done.is_set():
                stats.done_at = now
                stats.done.set()
        if results:  # the last acks have no next pull to ride on
            await c.ack(group, results)


async def consume(
    url: str | Sequence[str],
    group: str,
    total: int,
    pullers: int,
    max_messages: int,
    *,
    wait_ms: int = 1000,
    time_limit_s: float | None = None,
    record_latency: bool = False,
    stop_parked: bool = False,
) -> ConsumerStats:
    """Pull (acking on the next pull) until ``total`` messages were delivered once (or the
    time limit), then stop the pullers and send their last acks. Several URLs (proxies of
    one cluster): puller ``i`` pulls from ``urls[i % len(urls)]``.

    A puller parked in a long poll at the end waits it out (up to ``wait_ms``), which gives
    the server a rest before whatever runs next; latency points rely on it. With
    ``stop_parked`` it is cancelled there instead: its last acks rode on that poll, and
    cproxy ends a long poll whose client has gone, so it hands such a poll nothing. The
    throughput runs use that (their figures did not move beyond noise)."""
    urls = as_urls(url)
    stats = ConsumerStats(total)
    stop = asyncio.Event()
    #: The pullers waiting for a pull's answer (``stop_parked``).
    polling: set[asyncio.Task[Any]] = set()
    args = (group, stats, max_messages, wait_ms, record_latency, stop, polling)
    tasks = [asyncio.create_task(_puller(urls[i % len(urls)], *args)) for i in range(pullers)]
    stats.started = time.perf_counter()
    waiter = asyncio.create_task(stats.done.wait())
    try:
        done, _ = await asyncio.wait(
            [waiter, *tasks], timeout=time_limit_s, return_when=asyncio.FIRST_COMPLETED
        )
        for t in done:
            if t is not waiter and (exc := t.exception()) is not None:
                raise exc
    finally:
        waiter.cancel()
        stop.set()
        if stop_parked:
            for task in polling:
                task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [e for e in outcomes if isinstance(e, Exception)]
    if errors:
        raise errors[0]
    return stats
