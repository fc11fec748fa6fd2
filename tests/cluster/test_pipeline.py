"""Acceptance: the pipeline ``in -> out`` of ``tests/test_pipeline_kill.py`` over two proxies
on one PostgreSQL, with hand-overs while it runs (guarantee 10 with the cluster's fencing).

Four SDK consumers pull from both proxies and return ``Produce`` from their handler; a stale
worker acks with outputs after sleeping past the ack timeout. Mid-run p1 leaves (SIGTERM: its
queues are handed over to p0) and later joins again (some are handed back). In the end
every input is finished and "out" holds exactly one output per input, in input order per key.
"""

from __future__ import annotations

import signal

import httpx
import pytest

from tests.cluster.conftest import ProxyFactory
from tests.cluster.proxies import Proxy
from tests.pipeline import Workers, check_outputs, read_all, set_up
from tests.support import wait_until

pytestmark = pytest.mark.slow

INPUTS = 800


def lag_free(members: list[Proxy]) -> bool:
    """Every queue of "in" served by a live proxy that reports no lag and nothing in flight."""
    seen: dict[int, int] = {}
    for p in members:
        if p.proc is None or p.proc.poll() is not None:
            continue
        try:
            stats = httpx.get(f"{p.url}/v1/groups/pipe", timeout=5).json()["stats"]
        except httpx.HTTPError:
            return False
        if stats["in_flight"]:
            return False
        seen.update({q["qid"]: q["lag"] for q in stats["queues"] if q["topic"] == "in"})
    return sorted(seen) == [0, 1, 2, 3] and not any(seen.values())


def owns_some(proxy: Proxy) -> bool:
    try:
        return any(
            q["owner"] == proxy.node_id and q["topic"] == "in" for q in proxy.cluster()["queues"]
        )
    except httpx.HTTPError:
        return False


def test_pipeline_over_two_proxies_with_hand_overs(proxies: ProxyFactory) -> None:
    p0, p1 = proxies("p0", "p1")
    set_up(p0.url, 4, INPUTS, 400)
    wait_until(lambda: owns_some(p0) and owns_some(p1), 30, 0.05, "queues on both proxies")
    with Workers([p0.url, p1.url], lambda: p0.url, 5000, 6) as workers:
        handled = workers.handled
        wait_until(lambda: len(handled) >= INPUTS // 4, 60, message="a quarter handled")
        p1.signal(signal.SIGTERM)  # its queues are handed over to p0
        assert p1.wait(60) in (0, -signal.SIGTERM), p1.log()
        wait_until(lambda: len(handled) >= INPUTS // 2, 60, message="half handled")
        p1.start()  # joins again: some queues are handed back to it
        wait_until(lambda: owns_some(p1), 30, 0.05, "p1 owning queues again")
        wait_until(lambda: lag_free([p0, p1]), 120, 0.2, "every input finished")
    assert "handed over" in p1.log() or "handed over" in p0.log()
    assert workers.stale.refused > 0, "the stale worker was never refused"
    check_outputs(read_all(p0.url, "out", INPUTS), INPUTS)
