"""The client side of :mod:`benchmarks.peers`: one producer or consumer per process, for
cproxy (its SDK, or plain pullers), Redis Streams and NATS JetStream.

Every child builds its messages (or connects) first, waits at the run's barrier, works until
the parent sets ``stop`` (producers: until their share is sent), and reports its CPU seconds
since the barrier. Consumers publish first deliveries (all, and of healthy keys) and the time
of the latest in shared arrays, one slot per consumer: nothing crosses processes per message.
Producer ``p`` sends the messages with ``i % producers == p`` in order, so per-key order is
the send order. The redis and nats clients are imported where used (no ``bench`` extra
needed to import this module).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing.synchronize
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.sharedctypes import SynchronizedArray
from typing import Any

import orjson

from benchmarks.harness.load import run_loop
from consumer_sdk import AsyncClient, AsyncConsumer, AsyncProducer, Message, QueueResult
from cproxy.placement import queue_for_key

GROUP = "g"
TOPIC = "bench"


@dataclass(frozen=True)
class Workload:
    """The peers workload; every system gets the same messages."""

    messages: int = 200_000
    keys: int = 10_000
    partitions: int = 8
    batch: int = 100
    producers: int = 4
    consumers: int = 4
    body_bytes: int = 200
    stall_every: int = 100

    def stalled(self, k: int) -> bool:
        return k % self.stall_every == 0

    @property
    def healthy(self) -> int:
        """Messages of keys that never stall."""
        return sum(1 for i in range(self.messages) if not self.stalled(i % self.keys))

    def partition(self, k: int) -> int:
        """Kafka's murmur2 placement of key ``k{k}``, as cproxy places it."""
        return queue_for_key(f"k{k}", self.partitions)

    def body(self, i: int, pad: str) -> bytes:
        return orjson.dumps({"k": i % self.keys, "s": i // self.keys, "p": pad})

    def pad(self) -> str:
        return "x" * max(0, self.body_bytes - len(self.body(self.messages, "")))

    def share(self, producer: int) -> list[int]:
        return list(range(producer, self.messages, self.producers))

    def owned(self, consumer: int) -> list[int]:
        """Partitions that consumer ``consumer`` reads (one ordered reader per partition)."""
        return [p for p in range(self.partitions) if p % self.consumers == consumer]


@dataclass(frozen=True)
class ChildSpec:
    system: str  # redis | nats | cproxy-pull | cproxy-sdk
    role: str  # producer | consumer
    index: int
    address: str  # URL (cproxy, nats) or host:port (redis)
    workload: Workload
    stall: bool


@dataclass
class Shared:
    """What the parent and the children of one run share."""

    barrier: multiprocessing.synchronize.Barrier
    stop: Any  # multiprocessing RawValue("b"): 1 = stop now
    all_count: SynchronizedArray[int]
    healthy_count: SynchronizedArray[int]
    all_at: SynchronizedArray[float]
    healthy_at: SynchronizedArray[float]
    reports: Any  # multiprocessing Queue of (role, index, cpu seconds, order violations)


class Tally:
    """One consumer's view: counts first deliveries into its slots of the shared arrays."""

    def __init__(self, spec: ChildSpec, shared: Shared) -> None:
        self.wl, self.stall, self.slot, self.shared = spec.workload, spec.stall, spec.index, shared
        self.last_seq: dict[int, int] = {}
        self.violations = 0
        self.all = self.healthy = 0

    def see(self, k: int, s: int, first: bool = True) -> bool:
        """Record one delivery; False when the consumer must hold it (a stall run's stalled
        key), True when it is to be acked."""
        if self.last_seq.get(k, -1) > s:
            self.violations += 1
        self.last_seq[k] = s
        now = time.monotonic()
        bad = self.wl.stalled(k)
        if first:
            self.all += 1
            self.shared.all_count[self.slot] = self.all
            self.shared.all_at[self.slot] = now
            if not bad:
                self.healthy += 1
                self.shared.healthy_count[self.slot] = self.healthy
                self.shared.healthy_at[self.slot] = now
        return not (bad and self.stall)

    def see_json(self, data: bytes) -> bool:
        body = orjson.loads(data)
        return self.see(body["k"], body["s"])


def child_main(spec: ChildSpec, shared: Shared) -> None:
    """Process entry point."""
    logging.basicConfig(level=logging.ERROR)
    run_loop(lambda: _child(spec, shared))


async def _child(spec: ChildSpec, shared: Shared) -> None:
    wl, stop, cpu = spec.workload, asyncio.Event(), [0.0]

    async def ready() -> None:
        """Connected: wait at the barrier, then start the CPU clock (and the stop watcher)."""
        await asyncio.to_thread(shared.barrier.wait)
        cpu[0] = time.process_time()
        if spec.role == "consumer":
            watchers.append(asyncio.create_task(_watch(shared, stop)))

    watchers: list[asyncio.Task[None]] = []
    tally = Tally(spec, shared)
    if spec.role == "producer":
        pad = wl.pad()
        messages = [(i, wl.partition(i % wl.keys), wl.body(i, pad)) for i in wl.share(spec.index)]
        batches = [messages[b : b + wl.batch] for b in range(0, len(messages), wl.batch)]
        produce = {"redis": produce_redis, "nats": produce_nats, "cproxy-sdk": produce_cproxy_sdk}
        await produce.get(spec.system, produce_cproxy)(spec, batches, ready)
    else:
        consume = {"redis": consume_redis, "nats": consume_nats, "cproxy-sdk": consume_cproxy_sdk,
                   "cproxy-pull": consume_cproxy_pull}  # fmt: skip
        await consume[spec.system](spec, tally, stop, ready)
        await asyncio.gather(*watchers)
    shared.reports.put((spec.role, spec.index, time.process_time() - cpu[0], tally.violations))


async def _watch(shared: Shared, stop: asyncio.Event) -> None:
    # A flag, not a multiprocessing Event: setting an Event waits for every process that
    # sleeps on it, and hangs for good when one of them died.
    while True:
        if shared.stop.value:
            stop.set()
            return
        await asyncio.sleep(0.02)


Batches = list[list[tuple[int, int, bytes]]]  # (message index, partition, body JSON)
Ready = Callable[[], Awaitable[None]]  # awaited once connected: the run starts after it


async def _until_stopped(stop: asyncio.Event, *loops: Any) -> None:
    """Run ``loops`` (one per partition) until ``stop``; a loop that blocked stays parked."""
    tasks = [asyncio.create_task(loop) for loop in loops]
    await stop.wait()
    for t in tasks:
        t.cancel()
    for outcome in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(outcome, Exception):
            raise outcome


# -- cproxy --------------------------------------------------------------------------------------
async def produce_cproxy(spec: ChildSpec, batches: Batches, ready: Ready) -> None:
    """Plain produce calls of pre-encoded messages."""
    keys = spec.workload.keys
    encoded = [
        [b'{"key":"k%d","body":%s}' % (i % keys, body) for i, _, body in batch] for batch in batches
    ]
    async with AsyncClient(spec.address, timeout_ms=120_000) as client:
        await client.list_topics()  # opens the connection
        await ready()
        for batch in encoded:
            await client.produce_encoded(TOPIC, batch)


async def produce_cproxy_sdk(spec: ChildSpec, batches: Batches, ready: Ready) -> None:
    """``AsyncProducer.send_batch`` of each batch (the SDK encodes the bodies)."""
    keys = spec.workload.keys
    messages = [
        [{"key": f"k{i % keys}", "body": orjson.loads(body)} for i, _, body in batch]
        for batch in batches
    ]
    async with AsyncProducer(spec.address, timeout_ms=120_000) as producer:
        await ready()
        for batch in messages:
            await producer.send_batch(TOPIC, batch)


async def consume_cproxy_pull(spec: ChildSpec, tally: Tally, stop: asyncio.Event,
                              ready: Ready) -> None:  # fmt: skip
    """A plain puller: ``max_messages`` = batch, acks ride on the next pull."""

    async def loop() -> None:
        results: list[QueueResult] = []
        while True:
            pulled = await client.pull(
                GROUP, max_messages=spec.workload.batch, wait_ms=1000, results=results
            )
            acks: dict[tuple[str, int], list[int]] = {}
            for m in pulled.messages:
                if tally.see(m.body["k"], m.body["s"], m.attempt == 1):
                    acks.setdefault((m.topic, m.qid), []).append(m.offset)
            results = [QueueResult(t, q, acks=tuple(o)) for (t, q), o in acks.items()]

    async with AsyncClient(spec.address, timeout_ms=120_000) as client:
        await client.list_topics()
        await ready()
        await _until_stopped(stop, loop())


class _Stalled(Exception):
    """Raised by the SDK handler for a stalled key: the message is failed, and retried."""


async def consume_cproxy_sdk(spec: ChildSpec, tally: Tally, stop: asyncio.Event,
                             ready: Ready) -> None:  # fmt: skip
    async def handle(msg: Message) -> None:
        if not tally.see(msg.body["k"], msg.body["s"], msg.attempt == 1):
            raise _Stalled

    await ready()  # the consumer connects when started, and starts pulling at once
    async with AsyncConsumer(spec.address, group=GROUP, topics=[TOPIC], handler=handle,
                             max_messages=spec.workload.batch, handle_signals=False):  # fmt: skip
        await stop.wait()


# -- Redis Streams -------------------------------------------------------------------------------
def _redis(address: str) -> Any:
    import redis.asyncio

    host, port = address.rsplit(":", 1)
    return redis.asyncio.Redis(host=host, port=int(port), max_connections=64)


async def produce_redis(spec: ChildSpec, batches: Batches, ready: Ready) -> None:
    """XADD of each batch in one pipeline (no transaction): one round trip per batch."""
    async with _redis(spec.address) as r:
        await r.ping()
        await ready()
        for batch in batches:
            pipe = r.pipeline(transaction=False)
            for i, p, body in batch:
                pipe.xadd(f"p{p}", {"key": f"k{i % spec.workload.keys}", "body": body})
            await pipe.execute()


async def consume_redis(spec: ChildSpec, tally: Tally, stop: asyncio.Event, ready: Ready) -> None:
    """One XREADGROUP loop per owned stream; its XACKs ride in the pipeline of the next read."""

    async def loop(stream: str) -> None:
        done: list[bytes] = []
        while True:
            pipe = r.pipeline(transaction=False)
            if done:
                pipe.xack(stream, GROUP, *done)
            pipe.xreadgroup(GROUP, "c", {stream: ">"}, count=spec.workload.batch, block=1000)
            answer = (await pipe.execute())[-1]
            done = []
            for _, entries in answer or ():
                for entry_id, fields in entries:
                    if not tally.see_json(fields[b"body"]):
                        if done:
                            await r.xack(stream, GROUP, *done)
                        await asyncio.Event().wait()  # blocked for good on this partition
                    done.append(entry_id)

    async with _redis(spec.address) as r:
        await r.ping()
        await ready()
        await _until_stopped(stop, *(loop(f"p{p}") for p in spec.workload.owned(spec.index)))


def setup_redis(address: str, wl: Workload) -> None:
    import redis

    host, port = address.rsplit(":", 1)
    with redis.Redis(host=host, port=int(port)) as r:
        for p in range(wl.partitions):
            r.xgroup_create(f"p{p}", GROUP, id="0", mkstream=True)


# -- NATS JetStream ------------------------------------------------------------------------------
async def produce_nats(spec: ChildSpec, batches: Batches, ready: Ready) -> None:
    """Each batch as asynchronous JetStream publishes, then wait for all their acks."""
    import nats

    nc = await nats.connect(spec.address)
    await ready()
    js = nc.jetstream(publish_async_max_pending=4 * spec.workload.batch)
    try:
        for batch in batches:
            await asyncio.gather(*[await js.publish_async(f"bench.{p}", b) for _, p, b in batch])
    finally:
        await nc.close()


async def consume_nats(spec: ChildSpec, tally: Tally, stop: asyncio.Event, ready: Ready) -> None:
    """One pull consumer (ack policy *all*) per owned stream: fetch a batch, handle it in
    order, ack its last message."""
    import nats
    import nats.errors

    async def loop(p: int) -> None:
        sub = await nc.jetstream().pull_subscribe_bind(GROUP, stream=f"P{p}")
        while True:
            try:
                msgs = await sub.fetch(spec.workload.batch, timeout=1.0)
            except nats.errors.TimeoutError:
                continue
            last = None
            for m in msgs:
                if not tally.see_json(m.data):
                    if last is not None:
                        await last.ack()
                    await asyncio.Event().wait()  # blocked for good on this partition
                last = m
            if last is not None:
                await last.ack()

    nc = await nats.connect(spec.address)
    await ready()
    try:
        await _until_stopped(stop, *(loop(p) for p in spec.workload.owned(spec.index)))
    finally:
        await nc.close()


async def setup_nats(url: str, wl: Workload) -> None:
    """A file-backed stream per partition, each with one durable pull consumer."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, StorageType

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for p in range(wl.partitions):
            await js.add_stream(name=f"P{p}", subjects=[f"bench.{p}"], storage=StorageType.FILE)
            config = ConsumerConfig(
                durable_name=GROUP, ack_policy=AckPolicy.ALL, max_ack_pending=wl.messages
            )
            await js.add_consumer(f"P{p}", config)
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
