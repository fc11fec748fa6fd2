"""An instrumented HTTP consumer for delivery-guarantee tests.

Every delivery and every *applied* ack is logged with monotonic timestamps, so the checks
can prove order: when message n+1 of a chain was received, the ack that finished message n
had already been sent (the server applies results before choosing messages).
"""

from __future__ import annotations

import itertools
import random
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel

from consumer_sdk import NO_RETRY, AsyncClient, QueueResult

Ref = tuple[str, int, int]


@dataclass
class Log:
    deliveries: dict[Ref, list[tuple[float, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    acked_at: dict[Ref, float] = field(default_factory=dict)
    values: dict[Ref, str | None] = field(default_factory=dict)
    batches_with_repeated_values: int = 0


async def consume(
    url: str,
    group: str,
    log: Log,
    value_of: Callable[[dict[str, Any]], str | None],
    stop: anyio.Event,
    fail_rate: float = 0.0,
    max_attempts: int = 1_000_000,
    seed: int = 0,
    max_messages: int = 20,
) -> None:
    """Pull until ``stop`` is set; fail at ``fail_rate`` while attempts remain, else ack.

    Pulls through the SDK's ``AsyncClient`` with no retries, so any failed call fails the test.
    ``value_of`` gets each message in its JSON shape.
    """
    rng = random.Random(seed)
    results: list[QueueResult] = []
    sent: list[tuple[Ref, bool]] = []
    async with AsyncClient(url, timeout_ms=30_000, retry=NO_RETRY) as client:
        while True:
            if stop.is_set() and not results:
                return
            t_send = time.monotonic()
            answer = await client.pull(
                group, max_messages=max_messages, wait_ms=200, results=results
            )
            t_recv = time.monotonic()
            unknown = set(answer.results.unknown)
            for ref, is_ack in sent:
                if is_ack and ref not in unknown:
                    log.acked_at[ref] = t_send
            results, sent = [], []
            seen_values: set[str] = set()
            grouped: dict[tuple[str, int], tuple[list[int], list[tuple[int, str | None]]]] = {}
            for m in answer.messages:
                ref = m.ref
                value = value_of(m.to_dict())
                log.values[ref] = value
                log.deliveries[ref].append((t_recv, m.attempt))
                if value is not None:
                    if value in seen_values:
                        log.batches_with_repeated_values += 1
                    seen_values.add(value)
                acks, fails = grouped.setdefault((m.topic, m.qid), ([], []))
                if m.attempt < max_attempts and rng.random() < fail_rate:
                    fails.append((m.offset, "random failure"))
                    sent.append((ref, False))
                else:
                    acks.append(m.offset)
                    sent.append((ref, True))
            results = [
                QueueResult(t, q, acks=tuple(acks), fails=tuple(fails))
                for (t, q), (acks, fails) in grouped.items()
            ]
            await anyio.lowlevel.checkpoint()


def order_violations(log: Log) -> list[str]:
    """Per (value, queue): every delivery of message n+1 after the applied ack of n."""
    chains: dict[tuple[str, int, str], list[int]] = defaultdict(list)
    for (topic, qid, offset), value in log.values.items():
        if value is not None:
            chains[(topic, qid, value)].append(offset)
    problems = []
    for (topic, qid, value), offs in chains.items():
        offs.sort()
        for prev, nxt in itertools.pairwise(offs):
            acked = log.acked_at.get((topic, qid, prev))
            first = min(t for t, _ in log.deliveries[(topic, qid, nxt)])
            if acked is None or first < acked:
                problems.append(f"{value}: offset {nxt} delivered before {prev} was acked")
    return problems
