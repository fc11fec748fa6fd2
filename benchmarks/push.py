"""Push: push delivery against pull on the same backlog, and healthy keys when 1 % of keys
stall on the receiver.

``--messages`` messages over ``--keys`` keys (``order_by: key``, 8 queues) are produced once;
every run drains that backlog in its own fresh group:

- *pull*: 4 pullers (max_messages 100, acks on the next pull);
- *push*: the proxy POSTs to a receiver in this process (uvicorn on loopback,
  ``tests.push_receiver``) that answers 200 at once; ``max_in_flight`` ``--in-flight``;
- *push, 1 % stalled*: the receiver never answers messages of keys whose index is a multiple
  of 100 (their requests stay open), so each stalled key holds one slot.

msgs/s = messages acked / time until the last of them; *healthy* counts only the keys that
do not stall in the stall run. Medians of ``--rounds`` rounds; ratios are per round.

    python -m benchmarks.push --quick          # 4,000 messages, 1 round
    python -m benchmarks.push --json push.json # 20,000 messages, 3 rounds
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from benchmarks.harness.load import (
    client,
    consume,
    create_topic,
    delete_group,
    make_batches,
    produce,
    put_group,
    run_loop,
)
from benchmarks.harness.report import (
    arg_parser,
    finish,
    machine_facts,
    markdown_table,
    median,
    progress,
)
from benchmarks.harness.server import free_port, servers
from tests.push_receiver import STALL, Receiver

TOPIC = "push-bench"
#: Nothing times out during a run: stalled requests stay open until the group is deleted.
LONG_MS = 600_000


class Counter:
    """Counts first acks at the receiver (``decide`` runs on the receiver's thread)."""

    def __init__(self, stall_every: int | None, every: int) -> None:
        self.stall_every, self.every, self.lock = stall_every, every, threading.Lock()
        self.acked = self.healthy = 0
        self.last_at = self.last_healthy_at = 0.0

    def decide(self, messages: list[dict[str, Any]], headers: dict[str, str]) -> int:
        k = messages[0]["body"]["k"]
        if self.stall_every is not None and k % self.stall_every == 0:
            return STALL
        with self.lock:
            now = time.perf_counter()
            first = [m for m in messages if m["attempt"] == 1]
            self.acked += len(first)
            self.last_at = now
            healthy = sum(1 for m in first if m["body"]["k"] % self.every != 0)
            if healthy:
                self.healthy += healthy
                self.last_healthy_at = now
        return 200


async def push_run(
    url: str, group: str, messages: int, healthy_total: int, args: Any, stall: bool
) -> dict[str, Any]:
    counter = Counter(args.stall_every if stall else None, args.stall_every)
    receiver = Receiver(counter.decide, port=args.receiver_port, record=False).start()
    target = healthy_total if stall else messages
    try:
        async with client(url) as c:
            push = {"url": receiver.url, "max_in_flight": args.in_flight, "timeout_ms": LONG_MS}
            started = time.perf_counter()
            await c.put_group(
                group,
                {
                    "topics": {TOPIC: {"order_by": "key", "push": push}},
                    "ack_timeout_ms": LONG_MS,
                },
            )
            deadline = started + args.time_limit
            while (counter.healthy if stall else counter.acked) < target:
                if time.perf_counter() > deadline:
                    break
                await asyncio.sleep(0.02)
            await delete_group(c, group)
    finally:
        receiver.unstall()
        receiver.stop()
    total_s = counter.last_at - started
    healthy_s = counter.last_healthy_at - started
    return {"acked": counter.acked, "healthy": counter.healthy,
            "msgs_per_s": counter.acked / total_s if total_s > 0 else 0.0,
            "healthy_per_s": counter.healthy / healthy_s if healthy_s > 0 else 0.0,
            "finished": counter.healthy >= healthy_total}  # fmt: skip


async def pull_run(url: str, group: str, messages: int, args: Any) -> dict[str, Any]:
    async with client(url) as c:
        await put_group(c, group, TOPIC, ack_timeout_ms=LONG_MS)
        stats = await consume(url, group, messages, args.pullers, 100, time_limit_s=args.time_limit)
        await delete_group(c, group)
    seconds = (stats.done_at or time.perf_counter()) - stats.started
    rate = stats.delivered / seconds if seconds > 0 else 0.0
    return {"acked": stats.delivered, "msgs_per_s": rate, "violations": stats.order_violations}


async def main_async(url: str, args: Any) -> dict[str, Any]:
    batches = make_batches(args.messages, 500, args.keys, 100)
    async with client(url) as c:
        await create_topic(c, TOPIC, args.queues)
    await produce(url, TOPIC, batches, 2, max(1, args.keys // 500))
    healthy_total = sum(1 for b in batches for m in b if m["body"]["k"] % args.stall_every != 0)
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        row: dict[str, Any] = {}
        row["pull"] = await pull_run(url, f"pull-{r}", args.messages, args)
        row["push"] = await push_run(url, f"push-{r}", args.messages, healthy_total, args, False)
        row["push_stall"] = await push_run(
            url, f"stall-{r}", args.messages, healthy_total, args, True
        )
        row["push_vs_pull"] = row["push"]["msgs_per_s"] / max(row["pull"]["msgs_per_s"], 1e-9)
        row["stall_ratio"] = row["push_stall"]["healthy_per_s"] / max(
            row["push"]["healthy_per_s"], 1e-9
        )
        rounds.append(row)
        progress(
            f"  pull {row['pull']['msgs_per_s']:.0f}/s, push {row['push']['msgs_per_s']:.0f}/s, "
            f"healthy {row['push']['healthy_per_s']:.0f}/s -> "
            f"{row['push_stall']['healthy_per_s']:.0f}/s with stalls "
            f"(ratio {row['stall_ratio']:.3f})"
        )
    return {"rounds": rounds, "healthy_total": healthy_total}


def report(out: dict[str, Any], args: Any) -> str:
    def med(run: str, key: str) -> str:
        return f"{median([float(row[run][key]) for row in out['rounds']]):,.0f}"

    ratio = median([row["stall_ratio"] for row in out["rounds"]])
    stalled = med("push_stall", "healthy_per_s")
    rows = [["pull", med("pull", "msgs_per_s"), "", ""],
            ["push", med("push", "msgs_per_s"), med("push", "healthy_per_s"), ""],
            ["push, 1 % of keys stalled", "", stalled, f"{ratio:.3f}"]]  # fmt: skip
    table = markdown_table(["run", "msgs/s", "healthy msgs/s", "stall / no-stall"], rows)
    return (
        f"## Push (commit {out['commit']}): {args.messages:,} messages, {args.keys} keys, 8 "
        f"queues; pull: 4 pullers x 100; push: max_in_flight {args.in_flight}; "
        f"{args.rounds} round(s), medians\n\n{table}\n\npush / pull: "
        f"{median([row['push_vs_pull'] for row in out['rounds']]):.2f} (per-round ratios)"
    )


def main() -> None:
    parser = arg_parser(__doc__, "4,000 messages, 1 round")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=300.0)
    args = parser.parse_args()
    if args.quick:
        args.messages, args.rounds = 4000, 1
    args.queues, args.pullers, args.stall_every = 8, 4, 100
    out: dict[str, Any] = {"machine": machine_facts(), "args": vars(args) | {"json": None}}
    # The receiver is on loopback: the server's config lists its port (cproxy.push_targets).
    args.receiver_port = free_port()
    listed = f'[push]\nallowed_urls = ["http://127.0.0.1:{args.receiver_port}/"]\n'
    with servers("cproxy-push-bench-", config_toml=listed) as (server, *_):
        out.update(run_loop(lambda: main_async(server.url, args)))
    out["commit"] = server.source.commit
    finish(out, args, "push", report(out, args))


if __name__ == "__main__":
    main()
