"""Key isolation at the engine level, free of HTTP, SQLite and machine noise.

The same experiment as ``isolation.py`` (1 % of 1,000 keys stall; ``order_by`` key versus the
partition-ordered baseline ``qid``), but driving ``GroupEngine`` directly in this process with
a simulated clock: every *round* makes the engine's planned reads from an in-memory log
through the broker's own read loop (``cproxy.broker.drive.fetch_round``), pulls up to
``--pull`` messages, and acks (or fails, or holds) them at once; the clock advances 1 ms per
round. Two machine-independent measures:

- *rounds* needed to deliver every healthy message once (the engine's own throughput limit:
  how many pull round trips the work takes); a run that cannot finish stops when no healthy
  message was delivered for 5 simulated seconds;
- engine CPU µs per healthy message (``time.process_time``; a warm-up run first, then
  rounds with the runs interleaved; medians).

Group config as in ``isolation.py``: ack_timeout 600 s, max_attempts 1000, backoff 200 ms,
max_buffered 10,000.

    python -m benchmarks.isolation_engine --quick
    python -m benchmarks.isolation_engine --json iso-engine.json
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import orjson

from benchmarks.harness.load import ORDERS, STALL_GROUP_CONFIG, STALLS, policy_for
from benchmarks.harness.report import (
    arg_parser,
    finish,
    machine_facts,
    median,
    progress,
    ratio,
    table,
)
from benchmarks.harness.server import this_tree
from cproxy.broker.drive import fetch_round
from cproxy.engine.group import GroupEngine
from cproxy.engine.group_config import GroupConfig
from cproxy.engine.records import Result
from cproxy.model import Message, QueueProgress
from cproxy.placement import queue_for_key

TOPIC = "iso"
STALL_LIMIT_MS = 5_000


class QueueLog:
    """Every queue's messages in memory; ``read`` is the store's range read."""

    def __init__(self, messages: int, keys: int, queues: int) -> None:
        self.queues: list[list[Message]] = [[] for _ in range(queues)]
        qids = [queue_for_key(f"k{k}", queues) for k in range(keys)]
        for i in range(messages):
            k = i % keys
            q = self.queues[qids[k]]
            body = orjson.dumps({"k": k, "s": i // keys})
            q.append(Message(TOPIC, qids[k], len(q), f"k{k}", body, None, None, 0))

    async def read(
        self, topic: str, qid: int, from_offset: int, max_count: int
    ) -> Sequence[Message]:
        return self.queues[qid][from_offset : from_offset + max_count]


async def run_engine(
    log: QueueLog, order: str, stall: str, healthy_total: int, pull: int
) -> dict[str, Any]:
    config = GroupConfig.from_dict({"topics": {TOPIC: {"order_by": order}}, **STALL_GROUP_CONFIG})
    progress_ = {(TOPIC, q): QueueProgress(0) for q in range(len(log.queues))}
    ends = {(TOPIC, q): len(msgs) for q, msgs in enumerate(log.queues)}
    engine = GroupEngine("g", config, progress_, ends)
    policy = policy_for(stall, 100)
    now = rounds = healthy = last_progress = 0
    cpu0 = time.process_time()
    while healthy < healthy_total and now - last_progress < STALL_LIMIT_MS:
        await fetch_round(engine, log, now)
        acks: dict[int, list[int]] = {}
        fails: dict[int, list[tuple[int, str | None]]] = {}
        for delivery in engine.pull(pull, None, now):
            m = delivery.message
            action = policy(orjson.loads(m.body_json)["k"])
            if action in ("ack", "ack_other"):
                acks.setdefault(m.qid, []).append(m.offset)
                if action == "ack" and delivery.attempt == 1:
                    healthy += 1
                    last_progress = now
            elif action == "fail":
                fails.setdefault(m.qid, []).append((m.offset, "stalled"))
        if qids := set(acks) | set(fails):
            engine.apply_results(
                [Result(TOPIC, q, acks.get(q, ()), fails.get(q, ())) for q in qids], now
            )
        rounds += 1
        now += 1
    cpu = time.process_time() - cpu0
    return {
        "order_by": order,
        "stall": stall,
        "healthy_delivered": healthy,
        "completed": healthy >= healthy_total,
        "rounds": rounds if healthy >= healthy_total else last_progress + 1,
        "cpu_us_per_healthy_msg": round(cpu / max(healthy, 1) * 1e6, 2),
        "buffered_at_end": engine.stats(now).buffered,
    }


async def run(args: Any, log: QueueLog, healthy_total: int) -> list[dict[str, Any]]:
    await run_engine(log, "key", "none", healthy_total, args.pull)  # warm-up, not counted
    runs: list[dict[str, Any]] = []
    combos = [(o, s) for o in ORDERS for s in STALLS]
    for rnd in range(args.repeat):
        for order, stall in combos[rnd % len(combos) :] + combos[: rnd % len(combos)]:
            r = await run_engine(log, order, stall, healthy_total, args.pull)
            runs.append({**r, "round": rnd})
            progress(
                f"round {rnd + 1} {order}/{stall}: {r['healthy_delivered']:,} healthy in "
                f"{r['rounds']:,} rounds, {r['cpu_us_per_healthy_msg']} µs/msg"
            )
    return runs


def summarize(runs: list[dict[str, Any]], healthy_total: int) -> list[dict[str, Any]]:
    """Per (order, stall): medians, and healthy throughput per round and CPU relative to the
    same ordering without a stall (a run that cannot finish counts what it delivered over
    the rounds it made progress in)."""
    rows = []
    for order in ORDERS:
        base = [r for r in runs if (r["order_by"], r["stall"]) == (order, "none")]
        base_rate = healthy_total / median([r["rounds"] for r in base])
        base_cpu = median([r["cpu_us_per_healthy_msg"] for r in base])
        for stall in STALLS:
            rs = [r for r in runs if (r["order_by"], r["stall"]) == (order, stall)]
            rounds = median([r["rounds"] for r in rs])
            delivered = median([r["healthy_delivered"] for r in rs])
            cpu = median([r["cpu_us_per_healthy_msg"] for r in rs])
            rows.append(
                {
                    "order_by": order,
                    "stall": stall,
                    "delivered": delivered,
                    "rounds": rounds,
                    "rate": delivered / rounds,
                    "rate_ratio": ratio(delivered / rounds, base_rate),
                    "cpu": cpu,
                    "cpu_ratio": ratio(cpu, base_cpu),
                }
            )
    return rows


def main() -> None:
    parser = arg_parser(__doc__, "30,000 messages, 1 round (~2 s)")
    parser.add_argument("--messages", type=int, help="default 150,000")
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--pull", type=int, default=100, help="max_messages per pull")
    parser.add_argument("--repeat", type=int, help="rounds (default 5; 1 with --quick)")
    args = parser.parse_args()
    args.messages = args.messages or (30_000 if args.quick else 150_000)
    args.repeat = args.repeat or (1 if args.quick else 5)
    facts = machine_facts()
    log = QueueLog(args.messages, args.keys, args.queues)
    healthy_total = sum(1 for i in range(args.messages) if (i % args.keys) % 100 != 0)
    runs = asyncio.run(run(args, log, healthy_total))
    rows = summarize(runs, healthy_total)
    text = table(
        [
            ("order_by", lambda r: r["order_by"]),
            ("stall", lambda r: r["stall"]),
            ("healthy delivered", lambda r: f"{r['delivered']:,.0f}/{healthy_total:,}"),
            ("rounds (pull round trips)", lambda r: f"{r['rounds']:,.0f}"),
            ("healthy msgs per round", lambda r: f"{r['rate']:.1f}"),
            ("vs no stall", lambda r: f"{r['rate_ratio']:.3f}"),
            ("engine µs CPU / healthy msg", lambda r: f"{r['cpu']:.1f}"),
            ("CPU vs no stall", lambda r: f"{r['cpu_ratio']:.2f}"),
        ],
        rows,
    )
    commit = this_tree().commit
    header = (
        f"## Key isolation in the engine alone (commit {commit}, {args.repeat} rounds, "
        f"medians)\n\n{args.messages:,} messages, {args.keys:,} keys, {args.queues} queues, "
        f"pulls of {args.pull}, simulated clock 1 ms per round.\n"
    )
    summary = {f"{r['order_by']}/{r['stall']}": r for r in rows}
    out = {"machine": facts, "commit": commit, "runs": runs, "summary": summary}
    finish(out, args, "isolation_engine", f"{header}\n{text}")


if __name__ == "__main__":
    main()
