"""Randomised runs of the engine: order, the memory bound and derived counts always hold."""

from __future__ import annotations

import random

import pytest

from tests.engine.harness import Harness


@pytest.mark.parametrize("delays", [False, True])
@pytest.mark.parametrize("per_key", [1, 4])
@pytest.mark.parametrize("seed", range(12))
def test_random_workload_keeps_order_bound_and_counts(
    seed: int, per_key: int, delays: bool
) -> None:
    """With ``delays``, a third of the messages are delayed (some far enough off to be
    released from memory): none is handed out early, and order and the bound still hold."""
    rng = random.Random(seed)
    max_buffered = rng.choice([5, 12, 40])
    h = Harness(
        queues=2,
        max_buffered=max_buffered,
        ack_timeout_ms=rng.choice([50, 5_000]),
        retry_backoff_ms=[0, 20],
        max_attempts=1_000,  # never dead-letter: every message must end acked
    )
    keys = [f"k{i}" for i in range(rng.choice([3, 30]))] + [None]
    produced: dict[str | None, list[tuple[int, int]]] = {}
    acked: dict[str | None, list[tuple[int, int]]] = {}
    in_flight: dict[tuple[int, int], str | None] = {}
    for _ in range(600):
        op = rng.random()
        if op < 0.35:
            key = rng.choice(keys)
            delay = rng.choice([None, None, 100, 1500, 5000]) if delays else None
            m = h.produce(key, qid=rng.randrange(2), delay_ms=delay)
            produced.setdefault(key, []).append((m.qid, m.offset))
            if rng.random() < 0.5:
                h.engine.offer("t", m.qid, [m])
        elif op < 0.75:
            h.fetch()
            got = h.engine.pull(rng.randrange(1, 8), None, h.now, max_per_key=per_key)
            for d in got:
                due = d.message.deliver_at_ms
                assert due is None or due <= h.now, "handed out before deliver_at_ms"
            values = [d.message.key for d in got if d.message.key is not None]
            if per_key == 1:
                assert len(values) == len(set(values)), "two messages of one key in one pull"
            before = dict(in_flight)
            for d in got:
                ref = (d.message.qid, d.message.offset)
                if d.message.key is not None:
                    busy = [r for r, k in before.items() if k == d.message.key and r != ref]
                    assert not busy, f"{d.message.key} handed out while {busy} in flight"
                in_flight[ref] = d.message.key
            stopped: set[str | None] = set()  # keys whose run the consumer stopped handling
            for d in got:
                if d.message.key in stopped:
                    continue
                if d.message.key is not None and per_key > 1:
                    # Handled in order: anything but an ack ends this key's run here.
                    stopped.add(d.message.key)
                if rng.random() < 0.8:
                    stopped.discard(d.message.key)
                    if h.ack(d).applied:
                        acked.setdefault(d.message.key, []).append(
                            (d.message.qid, d.message.offset)
                        )
                    in_flight.pop((d.message.qid, d.message.offset), None)
                elif rng.random() < 0.5:
                    h.fail(d)
                    for ref in [r for r, k in in_flight.items() if k == d.message.key]:
                        del in_flight[ref]  # the rest of a run went back with it
                    in_flight.pop((d.message.qid, d.message.offset), None)
        else:
            h.advance(rng.choice([1, 30, 60, 1000]))
            # Whatever timed out is no longer in flight for us either.
            # Seen from far ahead, every head still in flight is past stuck_after_ms: listed.
            later = h.now + 10**9
            live = {
                (b.qid, b.offset) for b in h.engine.blocked_keys(later) if b.state == "in_flight"
            }
            for ref in [r for r, k in in_flight.items() if k is not None and r not in live]:
                del in_flight[ref]
        s = h.engine.stats(h.now)
        held_delayed = s.buffered - (s.ready + s.in_flight + s.waiting + s.retrying + s.exhausted)
        assert 0 <= held_delayed <= s.delayed if delays else held_delayed == 0
        assert s.buffered <= max_buffered
        assert s.ready >= 0 and s.waiting >= 0 and s.retrying >= 0
    # Drain: everything produced ends acked, each key in produce order.
    for _ in range(10_000):
        h.advance(6_000)
        h.fetch()
        got = h.engine.pull(50, None, h.now, max_per_key=per_key)
        if not got and h.engine.stats(h.now).buffered == 0 and h.engine.stats(h.now).delayed == 0:
            break
        for d in got:
            due = d.message.deliver_at_ms
            assert due is None or due <= h.now, "handed out before deliver_at_ms"
            if h.ack(d).applied:
                acked.setdefault(d.message.key, []).append((d.message.qid, d.message.offset))
    for key, refs in produced.items():
        if key is None:
            assert sorted(acked.get(key, [])) == sorted(refs)
            continue
        # Order is per queue (the guarantee): a key produced to both queues is two sequences.
        for qid in (0, 1):
            mine = [r for r in refs if r[0] == qid]
            assert [r for r in acked.get(key, []) if r[0] == qid] == mine, f"{key} out of order"
    committed = {q.qid: q.committed_offset for q in h.engine.stats(h.now).queues}
    assert committed == {q: len(h.log[("t", q)]) for q in (0, 1)}
