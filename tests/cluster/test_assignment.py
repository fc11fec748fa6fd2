"""Rendezvous assignment: even, stable, deterministic, small movement on join and leave."""

from __future__ import annotations

import math
import random

import pytest

from cproxy.cluster.assignment import assign, owned_by
from cproxy.model import QueueRef

GRID = [(n, t, m) for n, t in ((4, 1), (16, 1), (64, 2), (256, 4)) for m in (1, 2, 3, 4, 5, 8)]


def queues(n: int, topics: int) -> list[QueueRef]:
    return [(f"topic-{t}", q) for t in range(topics) for q in range(n // topics)]


def nodes(m: int) -> list[str]:
    return [f"proxy-{i}" for i in range(m)]


@pytest.mark.parametrize(("n", "topics", "m"), GRID)
def test_every_queue_has_one_member_and_counts_differ_by_at_most_one(
    n: int, topics: int, m: int
) -> None:
    qs = queues(n, topics)
    a = assign(qs, nodes(m))
    assert set(a) == set(qs)
    counts = [len(owned_by(a, node)) for node in nodes(m)]
    assert sum(counts) == n
    assert max(counts) - min(counts) <= 1, counts


def test_the_answer_depends_only_on_the_sets_not_their_order() -> None:
    qs, ms = queues(64, 2), nodes(5)
    expected = assign(qs, ms)
    rng = random.Random(7)
    for _ in range(5):
        rng.shuffle(qs)
        rng.shuffle(ms)
        assert assign(qs, ms) == expected
    assert assign(qs, []) == {}


@pytest.mark.parametrize(("n", "topics", "m"), GRID)
def test_a_join_moves_few_queues_and_only_to_the_newcomer(n: int, topics: int, m: int) -> None:
    qs = queues(n, topics)
    before, after = assign(qs, nodes(m)), assign(qs, [*nodes(m), "newcomer"])
    moved = [q for q in qs if before[q] != after[q]]
    # The ideal is n/(m+1) (what the newcomer must get); bounded loads add a little.
    assert len(moved) <= 2 * math.ceil(n / (m + 1)) + 1, (len(moved), n / (m + 1))
    assert len(owned_by(after, "newcomer")) >= n // (m + 1)


@pytest.mark.parametrize(("n", "topics", "m"), [g for g in GRID if g[2] > 1])
def test_a_leave_moves_the_leavers_queues_and_few_others(n: int, topics: int, m: int) -> None:
    qs = queues(n, topics)
    before = assign(qs, nodes(m))
    gone = nodes(m)[0]
    after = assign(qs, nodes(m)[1:])
    lost = owned_by(before, gone)
    moved = {q for q in qs if before[q] != after[q]}
    assert lost <= moved
    assert len(moved) <= 2 * len(lost) + math.ceil(n / (m - 1)), (len(moved), len(lost))
