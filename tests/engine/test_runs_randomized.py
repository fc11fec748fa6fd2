"""Issue 28's randomized run: same-key runs, random fails and stale tail acks keep per-value
order and fencing, for every ``order_by`` mode (docs/guarantees.md, fenced deliveries).

One topic of 2 queues, 3,000 messages on 20 hot keys, 8 pullers with ``max_per_key: 16``,
5 % fails, every result fenced, and half of the pullers also acking the tail of a run after
the run's message k failed (a consumer that finished them before it saw the fail), some of
those acks arriving late. Seeded, so a failure replays exactly.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

import pytest

from cproxy.engine.records import Result
from cproxy.engine.snapshots import Handout
from cproxy.model import MessageRef
from tests.engine.harness import Harness

MESSAGES = 3000
KEYS = 20
PULLERS = 8


@dataclass
class Puller:
    sends_stale_tails: bool
    answers: list[list[Handout]] = field(default_factory=list)


@dataclass
class Late:
    due_step: int
    delivery: Handout
    handout: int


def _runs(answer: list[Handout]) -> list[list[Handout]]:
    runs: dict[int, list[Handout]] = {}
    for d in answer:
        runs.setdefault(d.run, []).append(d)
    return list(runs.values())


@pytest.mark.parametrize("order_by", ["key", "qid", "$.k"])
def test_runs_with_fails_and_stale_tail_acks_keep_order_and_fencing(order_by: str) -> None:
    rng = random.Random(28)
    h = Harness(
        queues=2,
        topics={"t": {"order_by": order_by}},
        max_attempts=5,
        retry_backoff_ms=[0],
        ack_timeout_ms=600_000,
        max_buffered=10_000,
    )
    value_of: dict[MessageRef, tuple[int, str]] = {}
    for n in range(MESSAGES):
        key = f"k{rng.randrange(KEYS)}"
        m = h.produce(key, {"k": key, "n": n}, qid=rng.randrange(2))
        value_of[m.ref] = (m.qid, str(m.qid) if order_by == "qid" else key)
    # Offsets of each (queue, order value) still unfinished, in order.
    unfinished: dict[tuple[int, str], list[int]] = {}
    for ref, qv in sorted(value_of.items()):
        unfinished.setdefault(qv, []).append(ref[2])
    finished: set[MessageRef] = set()
    latest: dict[MessageRef, int] = {}  # ref -> the test's id of its latest hand-out
    numbers: dict[MessageRef, list[int]] = {}
    handouts = 0
    violations = {"order": 0, "same_number": 0, "stale_applied": 0}
    pullers = [Puller(sends_stale_tails=i % 2 == 0) for i in range(PULLERS)]
    late: list[Late] = []

    def finish(ref: MessageRef) -> None:
        finished.add(ref)
        unfinished[value_of[ref]].remove(ref[2])

    def send(d: Handout, handout: int, fail: bool) -> None:
        ref = d.message.ref
        stale = latest[ref] != handout  # handed out again since: this result is stale
        offset = d.message.offset
        result = Result(
            "t",
            d.message.qid,
            acks=[] if fail else [offset],
            fails=[(offset, "boom")] if fail else [],
            attempts={offset: d.attempt},
        )
        outcome = h.engine.apply_results([result], h.now)
        if outcome.applied:
            if stale:
                violations["stale_applied"] += 1
            if not fail:
                finish(ref)
            else:
                for dead in h.engine.take_commit().dead_letters:
                    finish(dead.message.ref)

    ids: dict[tuple[MessageRef, int], int] = {}
    step = 0
    while len(finished) < MESSAGES and step < 200_000:
        step += 1
        h.advance(1)
        for item in [x for x in late if x.due_step <= step]:
            late.remove(item)
            send(item.delivery, item.handout, fail=False)
        puller = rng.choice(pullers)
        if not puller.answers or (len(puller.answers) < 3 and rng.random() < 0.5):
            h.fetch()
            answer = h.engine.pull(rng.randint(1, 32), None, h.now, max_per_key=16)
            for position, d in enumerate(answer):
                ref = d.message.ref
                qv = value_of[ref]
                earlier = unfinished[qv][: unfinished[qv].index(ref[2])]
                same_run = {x.message.offset for x in answer[d.run : position]}
                if any(o not in same_run for o in earlier):
                    violations["order"] += 1
                if numbers.get(ref) and d.attempt <= numbers[ref][-1]:
                    violations["same_number"] += 1
                numbers.setdefault(ref, []).append(d.attempt)
                handouts += 1
                latest[ref] = handouts
                ids[(ref, d.attempt)] = handouts
            if answer:
                puller.answers.append(answer)
            continue
        answer = puller.answers.pop(rng.randrange(len(puller.answers)))
        for run in _runs(answer):
            failed_at = next((i for i in range(len(run)) if rng.random() < 0.05), None)
            for i, d in enumerate(run):
                handout = ids[(d.message.ref, d.attempt)]
                if failed_at is None or i < failed_at:
                    send(d, handout, fail=False)
                elif i == failed_at:
                    send(d, handout, fail=True)
                elif puller.sends_stale_tails:
                    # Finished before the consumer saw the fail: acked now or a bit later.
                    late.append(Late(step + rng.randrange(0, 40), d, handout))
    assert violations == {"order": 0, "same_number": 0, "stale_applied": 0}
    assert len(finished) == MESSAGES
    assert all(a < b for ns in numbers.values() for a, b in itertools.pairwise(ns))
    # The run was hard enough to mean something: tails were sent back and redelivered.
    assert handouts > MESSAGES + 100
