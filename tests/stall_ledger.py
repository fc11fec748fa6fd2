"""Support for tests/test_stall_restart.py: a steady producer and pullers that keep a ledger
of what was stored, delivered and acked, so a run can check across a server restart that
nothing acked is replayed and nothing is lost.

Message ``i`` has key ``k{i % keys}`` and body ``{"k": i % keys, "s": i // keys, "p": pad}``
(as in :mod:`.load`). A key *stalls* when ``stalled(key index)`` is true: its messages are
held (never acked: they stay in flight until ``ack_timeout_ms``) or failed on every delivery;
every other message is acked on the next pull.

An ack counts as *acked* only once the server confirmed it: the answer to the pull (or ack
call) that carried it did not list it as ``unknown``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from benchmarks.harness.load import client, pad_for
from consumer_sdk import QueueResult

#: (qid, offset) of a message on the run's single topic.
Ref = tuple[int, int]
StallAction = Literal["hold", "fail"]


@dataclass
class ProducedLog:
    """Every message the server confirmed as stored, with its key index."""

    stalled: Callable[[int], bool]
    keys: dict[Ref, int] = field(default_factory=dict)
    healthy: int = 0
    late_batches: int = 0  # batches sent more than one interval after their slot

    def add(self, ref: Ref, key: int) -> None:
        self.keys[ref] = key
        if not self.stalled(key):
            self.healthy += 1

    def healthy_refs(self) -> set[Ref]:
        return {ref for ref, k in self.keys.items() if not self.stalled(k)}


async def steady_produce(
    url: str,
    topic: str,
    rate: float,
    keys: int,
    log: ProducedLog,
    stop: asyncio.Event,
    batch: int = 50,
    body_bytes: int = 100,
) -> None:
    """Produce ``rate`` msgs/s in batches of ``batch`` from one sender (so per-key order is the
    send order) until ``stop``; a batch whose slot has passed is sent at once (and counted in
    ``log.late_batches`` if more than one interval late)."""
    pad = pad_for(body_bytes)
    interval = batch / rate
    i = 0
    async with client(url) as c:
        t0 = time.perf_counter()
        b = 0
        while not stop.is_set():
            delay = t0 + b * interval - time.perf_counter()
            if delay > 0:
                # Wake on stop as well, so the producer ends within one interval.
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                    break
                except TimeoutError:
                    pass
            elif delay < -interval:
                log.late_batches += 1
            ks = [(i + j) % keys for j in range(batch)]
            messages = [
                {"key": f"k{k}", "body": {"k": k, "s": (i + j) // keys, "p": pad}}
                for j, k in enumerate(ks)
            ]
            results = await c.produce(topic, messages)
            for k, r in zip(ks, results, strict=True):
                log.add((r.qid, r.offset), k)
            i += batch
            b += 1


@dataclass
class GroupLedger:
    """What one group's pullers saw during one server lifetime."""

    stalled: Callable[[int], bool]
    action: StallAction
    delivered: set[Ref] = field(default_factory=set)  # every ref delivered at least once
    acked: set[Ref] = field(default_factory=set)  # acks the server confirmed
    #: Acks sent (the server applies them when the pull carrying them arrives, while their
    #: confirmation waits for that pull's answer, up to ``wait_ms`` later).
    ack_sent: set[Ref] = field(default_factory=set)
    deliveries: int = 0
    stalled_deliveries: int = 0
    healthy_acked: int = 0
    unknown_acks: int = 0  # acks the server reported as not in flight
    order_violations: int = 0  # a key's sequence number went backwards
    last_seq: dict[int, int] = field(default_factory=dict)

    def acked_all(self, refs: set[Ref]) -> Callable[[], bool]:
        """A test for :func:`wait_true`: every message of ``refs`` is acked."""
        return lambda: refs <= self.acked

    def confirm(self, sent: list[Ref], unknown: set[Ref]) -> None:
        for ref in sent:
            if ref in unknown:
                self.unknown_acks += 1
            elif ref not in self.acked:
                self.acked.add(ref)
                self.healthy_acked += 1


async def pull_loop(
    url: str,
    group: str,
    ledger: GroupLedger,
    stop: asyncio.Event,
    max_messages: int = 100,
    wait_ms: int = 500,
) -> None:
    """Pull until ``stop``; ack healthy messages on the next pull, hold or fail stalled ones
    (``ledger.action``); the last acks are sent with an ack call before returning."""
    results: list[QueueResult] = []
    sent: list[Ref] = []
    async with client(url) as c:
        while not stop.is_set():
            pulled = await c.pull(
                group, max_messages=max_messages, wait_ms=wait_ms, results=results
            )
            ledger.confirm(sent, {(q, o) for _, q, o in pulled.results.unknown})
            results, sent = [], []
            acks: dict[tuple[str, int], list[tuple[int, int]]] = {}
            fails: dict[tuple[str, int], list[tuple[int, int]]] = {}
            for m in pulled.messages:
                k, seq = m.body["k"], m.body["s"]
                ledger.deliveries += 1
                ledger.delivered.add((m.qid, m.offset))
                if ledger.last_seq.get(k, -1) > seq:
                    ledger.order_violations += 1
                ledger.last_seq[k] = seq
                if not ledger.stalled(k):
                    acks.setdefault((m.topic, m.qid), []).append((m.offset, m.attempt))
                    sent.append((m.qid, m.offset))
                    ledger.ack_sent.add((m.qid, m.offset))
                    continue
                ledger.stalled_deliveries += 1
                if ledger.action == "fail":
                    fails.setdefault((m.topic, m.qid), []).append((m.offset, m.attempt))
            for (t, q), pairs in acks.items():
                offsets = tuple(o for o, _ in pairs)
                results.append(QueueResult(t, q, acks=offsets, attempts=tuple(pairs)))
            for (t, q), pairs in fails.items():
                failed = tuple((o, "stalled") for o, _ in pairs)
                results.append(QueueResult(t, q, fails=failed, attempts=tuple(pairs)))
        if results:  # the last results have no next pull to ride on
            answer = await c.ack(group, results)
            ledger.confirm(sent, {(q, o) for _, q, o in answer.unknown})


def raise_failed(tasks: Sequence[asyncio.Task[None]]) -> None:
    """Raise the error of a producer or puller that died (they only end when told to)."""
    for task in tasks:
        if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
            raise exc


async def wait_true(
    what: str, done: Callable[[], bool], tasks: Sequence[asyncio.Task[None]], timeout_s: float
) -> None:
    """Poll ``done()`` every 50 ms while ``tasks`` run; their error, or RuntimeError naming
    ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not done():
        raise_failed(tasks)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not reached after {timeout_s} s")
        await asyncio.sleep(0.05)
