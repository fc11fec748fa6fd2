"""Dead letters in a cluster: a redrive on any proxy delivers again the dead letters of every
queue, each by its owner, and none is left hidden as "redriving"."""

from __future__ import annotations

from typing import Any

import httpx

from tests.cluster.conftest import ProxyFactory
from tests.support import wait_until

QUEUES = 4


def pull(url: str, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    answer = httpx.post(
        f"{url}/v1/groups/billing/pull",
        json={"max_messages": 32, "wait_ms": 100, "results": results},
        timeout=10,
    )
    answer.raise_for_status()
    messages: list[dict[str, Any]] = answer.json()["messages"]
    return messages


def dead_letter_refs(url: str) -> list[tuple[int, int]]:
    answer = httpx.get(f"{url}/v1/groups/billing/dead-letters", params={"limit": 1000})
    answer.raise_for_status()
    return sorted((d["qid"], d["offset"]) for d in answer.json()["dead_letters"])


def settle(url: str, messages: list[dict[str, Any]], verb: str) -> list[dict[str, Any]]:
    """Results answering ``messages`` with ``verb`` (``acks`` or ``fails``), per queue."""
    by_queue: dict[int, list[Any]] = {}
    for m in messages:
        item = m["offset"] if verb == "acks" else {"offset": m["offset"], "error": "boom"}
        by_queue.setdefault(m["qid"], []).append(item)
    return [{"topic": "rides", "qid": q, verb: items} for q, items in by_queue.items()]


def test_a_redrive_on_one_proxy_redelivers_the_dead_letters_of_every_queue(
    proxies: ProxyFactory,
) -> None:
    p0, p1 = proxies("p0", "p1")
    httpx.post(f"{p0.url}/v1/topics", json={"name": "rides", "queues": QUEUES}).raise_for_status()
    httpx.put(
        f"{p0.url}/v1/groups/billing",
        json={"topics": {"rides": {"order_by": "key"}}, "max_attempts": 1},
    ).raise_for_status()
    wait_until(
        lambda: sorted(q for p in (p0, p1) for q in p.owned()) == list(range(QUEUES))
        and all(p.owned() for p in (p0, p1)),
        20, 0.05, "queues spread over both proxies",
    )  # fmt: skip
    msgs = [{"key": f"k{n}", "body": {"n": n}} for n in range(40)]
    sent = httpx.post(f"{p0.url}/v1/topics/rides/messages", json={"messages": msgs}).json()
    everything = sorted((r["qid"], r["offset"]) for r in sent["results"])
    assert len({qid for qid, _ in everything}) > 1
    # Every message fails once: with max_attempts 1 each is dead-lettered by its owner.
    pending: dict[str, list[dict[str, Any]]] = {p0.url: [], p1.url: []}

    def fail_all() -> bool:
        for url, results in list(pending.items()):
            got = pull(url, results)
            pending[url] = settle(url, got, "fails")
        return dead_letter_refs(p0.url) == everything

    wait_until(fail_all, 30, 0.05, "every message dead-lettered")
    redriven = httpx.post(f"{p1.url}/v1/groups/billing/dead-letters/redrive").json()["redriven"]
    assert 0 < redriven < len(everything)  # p1's own queues; p0 redrives the rest
    delivered: set[tuple[int, int]] = set()
    acks: dict[str, list[dict[str, Any]]] = {p0.url: [], p1.url: []}

    def redelivered() -> bool:
        for url, results in list(acks.items()):
            got = pull(url, results)
            delivered.update((m["qid"], m["offset"]) for m in got)
            acks[url] = settle(url, got, "acks")
        return sorted(delivered) == everything

    wait_until(redelivered, 30, 0.05, "every dead letter delivered again")
    for url, results in acks.items():
        if results:
            pull(url, results)
    assert dead_letter_refs(p0.url) == []
