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
    #: ref -> (response number, run) of each delivery that came in a same-key run
    runs: dict[Ref, set[tuple[int, int]]] = field(default_factory=lambda: defaultdict(set))


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
    max_per_key: int = 1,
) -> None:
    """Pull until ``stop`` is set; fail at ``fail_rate`` while attempts remain, else ack.

    With ``max_per_key`` > 1 same-key runs are handled in order: after a fail, the rest of
    the run gets no result (the server takes it back).

    Pulls through the SDK's ``AsyncClient`` with no retries, so any failed call fails the test.
    ``value_of`` gets each message in its JSON shape.
    """
    rng = random.Random(seed)
    responses = itertools.count()
    results: list[QueueResult] = []
    sent: list[tuple[Ref, bool]] = []
    async with AsyncClient(url, timeout_ms=30_000, retry=NO_RETRY) as client:
        while True:
            if stop.is_set() and not results:
                return
            t_send = time.monotonic()
            answer = await client.pull(
                group,
                max_messages=max_messages,
                wait_ms=200,
                results=results,
                max_per_key=max_per_key,
            )
            response = next(responses)
            t_recv = time.monotonic()
            unknown = set(answer.results.unknown)
            for ref, is_ack in sent:
                if is_ack and ref not in unknown:
                    log.acked_at[ref] = t_send
            results, sent = [], []
            seen_values: set[str] = set()
            grouped: dict[tuple[str, int], tuple[list[int], list[tuple[int, str | None]]]] = {}
            failed_runs: set[int] = set()
            for i, m in enumerate(answer.messages):
                ref = m.ref
                value = value_of(m.to_dict())
                log.values[ref] = value
                log.deliveries[ref].append((t_recv, m.attempt))
                run = i if m.run is None else m.run
                if run != i:
                    log.runs[ref].add((response, run))
                    log.runs[answer.messages[run].ref].add((response, run))
                if run in failed_runs:
                    continue  # handled in order: nothing after a fail in the same run
                if value is not None and run == i:
                    if value in seen_values:
                        log.batches_with_repeated_values += 1
                    seen_values.add(value)
                acks, fails = grouped.setdefault((m.topic, m.qid), ([], []))
                if m.attempt < max_attempts and rng.random() < fail_rate:
                    fails.append((m.offset, "random failure"))
                    sent.append((ref, False))
                    failed_runs.add(run)
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
            same_run = log.runs[(topic, qid, prev)] & log.runs[(topic, qid, nxt)]
            if acked is None or (first < acked and not same_run):
                problems.append(f"{value}: offset {nxt} delivered before {prev} was acked")
    return problems
