"""Key isolation at the engine level, free of HTTP, SQLite and machine noise.

The same experiment as ``isolation.py`` (1 % of 1,000 keys stall; ``order_by`` key versus the
partition-ordered baseline ``qid``), but driving ``GroupEngine`` directly in this process with
a simulated clock: every *round* plans and serves the engine's fetches from an in-memory copy
of the queues, pulls up to ``--pull`` messages, and acks (or fails, or holds) them at once;
the clock advances 1 ms per round. Two machine-independent measures:

- *rounds* needed to deliver every healthy message once (the engine's own throughput limit:
  how many pull round trips the work takes); a run that cannot finish stops when no healthy
  message was delivered for 5 simulated seconds;
- engine CPU µs per healthy message (``time.process_time``; a warm-up run first, then
  rounds with the runs interleaved; medians).

Group config as in ``isolation.py``: ack_timeout 600 s, max_attempts 1000, backoff 200 ms,
max_buffered 10,000.

    .venv/bin/python -m benchmarks.isolation_engine --quick
    .venv/bin/python -m benchmarks.isolation_engine --json iso-engine.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import orjson

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import markdown_table
from benchmarks._load import git_commit, load_average, median
from benchmarks.isolation import GROUP_CONFIG, ORDERS, STALLS, policy_for
from cproxy.engine.config import GroupConfig
from cproxy.engine.group import GroupEngine
from cproxy.engine.records import Result
from cproxy.model import Message, QueueProgress
from cproxy.partitioner import partition_for_key

TOPIC = "iso"
STALL_LIMIT_MS = 5_000


def build_queues(messages: int, keys: int, queues: int) -> list[list[Message]]:
    out: list[list[Message]] = [[] for _ in range(queues)]
    qids = [partition_for_key(f"k{k}", queues) for k in range(keys)]
    for i in range(messages):
        k = i % keys
        q = out[qids[k]]
        body = orjson.dumps({"k": k, "s": i // keys})
        q.append(Message(TOPIC, qids[k], len(q), f"k{k}", body, None, None, 0))
    return out


def run_engine(
    queues: list[list[Message]], order: str, stall: str, healthy_total: int, pull: int
) -> dict[str, Any]:
    config = GroupConfig.from_dict({"topics": {TOPIC: {"order_by": order}}, **GROUP_CONFIG})
    progress = {(TOPIC, q): QueueProgress(0) for q in range(len(queues))}
    ends = {(TOPIC, q): len(msgs) for q, msgs in enumerate(queues)}
    engine = GroupEngine("g", config, progress, ends)
    policy = policy_for(stall, 100)
    now = 0
    rounds = healthy = last_progress = 0
    cpu0 = time.process_time()
    while healthy < healthy_total and now - last_progress < STALL_LIMIT_MS:
        for req in engine.plan_fetches(now):
            msgs = queues[req.qid]
            if req.is_reload:
                window = msgs[req.from_offset : req.upto]
                found = [m for m in window if engine.order_value(m) == req.chain_value]
                engine.on_fetched(req, found[: req.max_count], req.upto)
            else:
                engine.on_fetched(req, msgs[req.from_offset : req.from_offset + req.max_count])
        entries = engine.pull(pull, None, now)
        acks: dict[int, list[int]] = {}
        fails: dict[int, list[tuple[int, str | None]]] = {}
        for entry in entries:
            m = entry.message
            k = orjson.loads(m.body_json)["k"]
            action = policy(k)
            if action in ("ack", "ack_other"):
                acks.setdefault(m.qid, []).append(m.offset)
                if action == "ack" and entry.attempt == 1:
                    healthy += 1
                    last_progress = now
            elif action == "fail":
                fails.setdefault(m.qid, []).append((m.offset, "stalled"))
        qids = set(acks) | set(fails)
        if qids:
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
        "buffered_at_end": engine.buffered,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="30,000 messages, 1 round")
    parser.add_argument("--messages", type=int, help="default 150,000")
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--pull", type=int, default=100, help="max_messages per pull")
    parser.add_argument("--repeat", type=int, help="rounds (default 5; 1 with --quick)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.messages = args.messages or (30_000 if args.quick else 150_000)
    args.repeat = args.repeat or (1 if args.quick else 5)
    queues = build_queues(args.messages, args.keys, args.queues)
    healthy_total = sum(1 for i in range(args.messages) if (i % args.keys) % 100 != 0)
    run_engine(queues, "key", "none", healthy_total, args.pull)  # warm-up, not counted
    runs: list[dict[str, Any]] = []
    combos = [(o, s) for o in ORDERS for s in STALLS]
    for rnd in range(args.repeat):
        for order, stall in combos[rnd % len(combos) :] + combos[: rnd % len(combos)]:
            r = run_engine(queues, order, stall, healthy_total, args.pull)
            r["round"] = rnd
            runs.append(r)
            print(
                f"round {rnd + 1} {order}/{stall}: {r['healthy_delivered']:,} healthy in "
                f"{r['rounds']:,} rounds, {r['cpu_us_per_healthy_msg']} µs/msg",
                file=sys.stderr,
                flush=True,
            )
    rows = []
    summary: dict[str, dict[str, float]] = {}
    for order in ORDERS:
        base = [r for r in runs if (r["order_by"], r["stall"]) == (order, "none")]
        base_rounds = median([r["rounds"] for r in base])
        base_cpu = median([r["cpu_us_per_healthy_msg"] for r in base])
        for stall in STALLS:
            rs = [r for r in runs if (r["order_by"], r["stall"]) == (order, stall)]
            rounds = median([r["rounds"] for r in rs])
            cpu = median([r["cpu_us_per_healthy_msg"] for r in rs])
            delivered = median([r["healthy_delivered"] for r in rs])
            # Healthy throughput per round relative to no stall (a run that cannot finish
            # counts what it delivered over the rounds it made progress in).
            rate = delivered / rounds
            base_rate = healthy_total / base_rounds
            summary[f"{order}/{stall}"] = {
                "rate_ratio": rate / base_rate,
                "cpu_ratio": cpu / base_cpu,
            }
            rows.append(
                (
                    order,
                    stall,
                    f"{delivered:,.0f}/{healthy_total:,}",
                    f"{rounds:,.0f}",
                    f"{rate:.1f}",
                    f"{rate / base_rate:.3f}",
                    f"{cpu:.1f}",
                    f"{cpu / base_cpu:.2f}",
                )
            )
    print(
        f"## Key isolation in the engine alone (commit {git_commit()}, {args.repeat} rounds, "
        "medians)\n\n"
        f"{args.messages:,} messages, {args.keys:,} keys, {args.queues} queues, pulls of "
        f"{args.pull}, simulated clock 1 ms per round; load {load_average()}.\n"
    )
    print(
        markdown_table(
            [
                "order_by",
                "stall",
                "healthy delivered",
                "rounds (pull round trips)",
                "healthy msgs per round",
                "vs no stall",
                "engine µs CPU / healthy msg",
                "CPU vs no stall",
            ],
            rows,
        )
    )
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": runs, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
