"""A planned hand-over under load, timed: consumers that hold every message ``hold_ms``
before acking it, a steady open-loop produce, a proxy joining and later leaving (SIGTERM),
and a poller of ``GET /v1/cluster`` noting when each queue starts releasing and when its new
owner has it; plus duplicate deliveries (a message delivered twice although nobody failed
it), messages never delivered, and per-key order violations.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.harness.deploy import HEARTBEAT_MS, Deployment
from benchmarks.harness.load import client, create_topic, open_loop_produce, put_group
from benchmarks.harness.report import percentiles
from consumer_sdk import ClientError, QueueResult

QUEUES = 8
KEYS = 1000


@dataclass
class Seen:
    """Deliveries by (qid, offset), and the last sequence number per key (order check)."""

    deliveries: dict[tuple[int, int], int] = field(default_factory=lambda: defaultdict(int))
    last_seq: dict[int, int] = field(default_factory=dict)
    order_violations: int = 0
    redelivered: int = 0


async def holding_puller(
    url: str, group: str, hold_s: float, seen: Seen, stop: asyncio.Event
) -> None:
    """Pull from ``url``; ack each message ``hold_s`` after it arrived, on a later pull. Ends
    when ``stop`` is set and nothing is held, or when its proxy is gone."""
    held: list[tuple[float, Any]] = []
    async with client(url) as c:
        while not (stop.is_set() and not held):
            now = time.perf_counter()
            due = [m for at, m in held if now - at >= hold_s]
            held = [(at, m) for at, m in held if now - at < hold_s]
            acks: dict[tuple[str, int], list[int]] = defaultdict(list)
            for m in due:
                acks[m.topic, m.qid].append(m.offset)
            results = [QueueResult(t, q, acks=tuple(o)) for (t, q), o in acks.items()]
            wait_ms = 0 if held else 200
            try:
                if stop.is_set():  # answer what came due, wait for the rest to come due
                    if results:
                        await c.ack(group, results)
                    await asyncio.sleep(min(0.02, hold_s))
                    continue
                pulled = await c.pull(group, max_messages=10, wait_ms=wait_ms, results=results)
            except ClientError:
                return  # the proxy left (its queues were handed over)
            for m in pulled.messages:
                seen.deliveries[m.qid, m.offset] += 1
                if m.attempt > 1:
                    seen.redelivered += 1
                k, s = m.body["k"], m.body["s"]
                if seen.last_seq.get(k, -1) > s:
                    seen.order_violations += 1
                seen.last_seq[k] = max(s, seen.last_seq.get(k, -1))
                held.append((time.perf_counter(), m))
            if held and not pulled.messages:
                await asyncio.sleep(min(0.02, hold_s))


@dataclass
class Ownership:
    """Per qid: (monotonic time, owner, state) whenever either changed."""

    changes: dict[int, list[tuple[float, str | None, str]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    members: list[tuple[float, tuple[str, ...]]] = field(default_factory=list)

    def note(self, view: dict[str, Any], topic: str) -> None:
        now = time.perf_counter()
        names = tuple(sorted(m["node"] for m in view["members"]))
        if not self.members or self.members[-1][1] != names:
            self.members.append((now, names))
        for q in view["queues"]:
            if q["topic"] != topic:
                continue
            row = (now, q["owner"], q["state"])
            log = self.changes[q["qid"]]
            if not log or log[-1][1:] != row[1:]:
                log.append(row)

    def moves(self, since: float, to: str | None, away: str | None) -> list[dict[str, float]]:
        """Queues that after ``since`` moved to ``to`` (or away from ``away``): when they began
        releasing and when the new owner had them, in seconds after ``since``. A queue with
        nothing in flight can pass through *releasing* between two polls: its release then
        counts from the last poll that still showed the old owner."""
        out = []
        for qid, log in self.changes.items():
            if away and not _owned_by(log, since, away):
                continue
            later = [c for c in log if c[0] >= since]
            owned = next((c for c in later if c[2] == "owned" and _new(c[1], to, away)), None)
            if owned is None:
                continue
            before = [c for c in log if c[0] < owned[0]]
            released = next((t for t, _, s in later if s == "releasing"), None)
            if released is None:
                released = max(since, before[-1][0]) if before else since
            out.append(
                {"qid": qid, "releasing_s": released - since, "owned_s": owned[0] - since,
                 "handover_ms": (owned[0] - released) * 1000}
            )  # fmt: skip
        return out


def _new(owner: str | None, to: str | None, away: str | None) -> bool:
    return owner is not None and (owner == to or (away is not None and owner != away))


def _owned_by(log: list[tuple[float, str | None, str]], t: float, node: str) -> bool:
    before = [c for c in log if c[0] <= t]
    return bool(before) and before[-1][1] == node


async def poll_ownership(url: str, topic: str, own: Ownership, stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                own.note((await http.get(f"{url}/v1/cluster")).json(), topic)
            await asyncio.sleep(0.01)


async def handover_run(d: Deployment, tag: str, hold_ms: int, rate: int) -> dict[str, Any]:
    """One join and one SIGTERM under load on ``d`` (a PostgreSQL deployment)."""
    topic, group = f"ho-{tag}", f"ho-{tag}-g"
    async with client(d.urls[0]) as admin:
        await create_topic(admin, topic, QUEUES)
        await put_group(admin, group, topic, "key", ack_timeout_ms=60_000)
    await asyncio.to_thread(d.wait_owned, topic, QUEUES)
    seen, own = Seen(), Ownership()
    stop_pull, stop_poll = asyncio.Event(), asyncio.Event()
    hold_s = hold_ms / 1000
    pullers = [
        asyncio.create_task(holding_puller(u, group, hold_s, seen, stop_pull))
        for u in d.urls
        for _ in range(2)
    ]
    poller = asyncio.create_task(poll_ownership(d.urls[0], topic, own, stop_poll))
    seconds = 12.0
    produce = asyncio.create_task(open_loop_produce(d.urls, topic, rate, 10, seconds, KEYS))
    await asyncio.sleep(2.0)
    newcomer = await asyncio.to_thread(d.add_proxy)
    node = newcomer.node_id or ""
    joined = next((t for t, names in own.members if node in names), time.perf_counter())
    pullers += [
        asyncio.create_task(holding_puller(newcomer.url, group, hold_s, seen, stop_pull))
        for _ in range(2)
    ]
    await asyncio.sleep(4.0)
    term_at = time.perf_counter()
    await asyncio.to_thread(d.stop_proxy, newcomer)
    left_s = time.perf_counter() - term_at
    sent = await produce
    await asyncio.sleep(max(1.0, 3 * hold_s))  # the last messages reach their pullers
    stop_pull.set()
    await asyncio.gather(*pullers)
    stop_poll.set()
    await poller
    joins = own.moves(joined, node, None)
    leaves = own.moves(term_at, None, node)
    total = sent.messages
    return {
        "hold_ms": hold_ms,
        "heartbeat_ms": HEARTBEAT_MS,
        "rate": rate,
        "messages": total,
        "delivered": len(seen.deliveries),
        "missing": total - len(seen.deliveries),
        "duplicates": sum(1 for n in seen.deliveries.values() if n > 1),
        "redelivered": seen.redelivered,
        "order_violations": seen.order_violations,
        "join_moves": joins,
        "leave_moves": leaves,
        "join_handover_ms": percentiles([m["handover_ms"] for m in joins]),
        "leave_handover_ms": percentiles([m["handover_ms"] for m in leaves]),
        "join_done_s": round(max((m["owned_s"] for m in joins), default=0.0), 3),
        "leave_done_s": round(max((m["owned_s"] for m in leaves), default=0.0), 3),
        "sigterm_to_exit_s": round(left_s, 3),
    }
