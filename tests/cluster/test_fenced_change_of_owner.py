"""Delivery numbers keep growing across a change of owner (docs/guarantees.md, fenced
deliveries): real proxy subprocesses on one PostgreSQL.

p1 hands messages out and their consumer goes quiet; p1 then leaves (SIGTERM: a planned
hand-over) or dies (SIGKILL: a takeover after its lease). p0 serves the queues and hands the
messages out again under numbers above p1's, so the quiet consumer's late fenced acks are
``unknown`` at p0 and change nothing, while the new deliveries' acks apply.
"""

from __future__ import annotations

import signal
from typing import Any

import httpx
import pytest

from tests.cluster.conftest import ProxyFactory
from tests.cluster.proxies import ACK_TIMEOUT_MS
from tests.cluster.test_proxies import QUEUES, Producer, setup, spread
from tests.support import wait_until


def acks(messages: list[dict[str, Any]]) -> dict[str, Any]:
    by_queue: dict[int, list[dict[str, int]]] = {}
    for m in messages:
        by_queue.setdefault(m["qid"], []).append({"offset": m["offset"], "attempt": m["attempt"]})
    return {"results": [{"topic": "rides", "qid": q, "acks": a} for q, a in by_queue.items()]}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["takeover", "hand-over"])
def test_late_acks_for_the_former_owners_deliveries_are_unknown(
    proxies: ProxyFactory, sig: signal.Signals
) -> None:
    p0, p1 = proxies("p0", "p1")
    setup(p0, p0)
    spread([p0, p1])
    Producer().send([p0], 40)
    held: list[dict[str, Any]] = []

    def pulled() -> bool:
        answer = httpx.post(
            f"{p1.url}/v1/groups/billing/pull", json={"max_messages": 32, "wait_ms": 200}
        )
        held.extend(answer.json()["messages"])
        return len(held) > 0

    wait_until(pulled, 20, 0.05, "messages from p1")
    p1.signal(sig)
    p1.wait(60)
    wait_until(lambda: p0.owned() == set(range(QUEUES)), 30, 0.05, "p0 owning everything")
    wanted = {(m["qid"], m["offset"]): m for m in held}
    again: dict[tuple[int, int], dict[str, Any]] = {}

    def redelivered() -> bool:
        answer = httpx.post(
            f"{p0.url}/v1/groups/billing/pull", json={"max_messages": 64, "wait_ms": 200}
        )
        for m in answer.json()["messages"]:
            ref = (m["qid"], m["offset"])
            if ref in wanted:
                again[ref] = m
            else:  # not one p1 handed out: let it finish so its key moves on
                httpx.post(f"{p0.url}/v1/groups/billing/ack", json=acks([m]))
        return set(wanted) <= set(again)

    wait_until(redelivered, 30 + ACK_TIMEOUT_MS / 1000, 0.05, "p0 redelivering p1's messages")
    for ref, m in again.items():
        assert m["attempt"] > wanted[ref]["attempt"], (ref, m["attempt"], wanted[ref]["attempt"])
    # The quiet consumer wakes up and acks what p1 gave it: unknown, nothing changes.
    late = httpx.post(f"{p0.url}/v1/groups/billing/ack", json=acks(held))
    assert late.status_code == 200, late.text
    assert late.json()["applied"] == 0 and len(late.json()["unknown"]) == len(held)
    stats = httpx.get(f"{p0.url}/v1/groups/billing").json()["stats"]
    assert stats["in_flight"] == len(again)
    current = httpx.post(f"{p0.url}/v1/groups/billing/ack", json=acks(list(again.values())))
    assert current.json() == {"applied": len(again), "unknown": []}
