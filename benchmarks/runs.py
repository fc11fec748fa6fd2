"""Same-key runs: drain throughput with ``max_per_key`` 1 vs 32, A/B in one run.

Without runs a pull carries at most one message per order value, so when few order values
exist (``order_by: qid`` over 8 queues; a hot-key topic of 10 keys) every pull hands out at
most 8 or 10 messages, however large ``max_messages``. With ``max_per_key`` 32 one pull may
carry up to 32 consecutive messages of each.

Per round and item, a fresh topic (8 queues) gets a backlog of ``--messages`` messages first
(closed loop, per-key order kept); then ``--pullers`` plain pull loops through
``consumer_sdk.AsyncClient`` (``max_messages`` 100, acks riding on the next pull, a trivial
handler) drain it in a fresh group. The rate is messages / drain time. Items run in rotating
order, ``max_per_key`` 1 and 32 back to back; reported are medians and the ratio 32 vs 1.
The pullers check per-key order on every delivery.

    python -m benchmarks.runs --quick                 # 5,000 messages, 3 rounds
    python -m benchmarks.runs                         # 10,000 messages, 5 rounds
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from benchmarks.harness.ab import Side, rounds, sides
from benchmarks.harness.load import (
    consume,
    create_topic,
    delete_group,
    key_stride,
    make_batches,
    produce,
    put_group,
    run_loop,
)
from benchmarks.harness.probe import Probe
from benchmarks.harness.report import (
    arg_parser,
    finish,
    load_average,
    machine_facts,
    median,
    ratio,
    table,
)
from benchmarks.harness.server import servers

QUEUES = 8
BATCH = 100  # produce batch and pull max_messages
BODY_BYTES = 100
PRODUCERS = 4
#: scenario -> (order_by, keys)
SCENARIOS = {"qid": ("qid", 1000), "hot-key": ("key", 10)}
RUN_LENGTHS = (1, 32)


@dataclass(frozen=True)
class Item:
    scenario: str
    max_per_key: int
    messages: int
    pullers: int

    @property
    def name(self) -> str:
        return f"{self.scenario} max_per_key={self.max_per_key}"


async def drain(side: Side, item: Item, tag: str) -> dict[str, Any]:
    """Produce the backlog into a fresh topic, then time its drain by a fresh group."""
    order_by, keys = SCENARIOS[item.scenario]
    topic = f"runs-{item.scenario}-{item.max_per_key}-{tag}"
    group = f"{topic}-g"
    n = item.messages
    await create_topic(side.admin, topic, QUEUES)
    # Backlog first; the stride keeps each key's order across the concurrent producers.
    stride = key_stride(BATCH, keys)
    await produce(side.url, topic, make_batches(n, BATCH, keys, BODY_BYTES), PRODUCERS, stride)
    await put_group(side.admin, group, topic, order_by)
    try:
        with Probe(side.pid) as p:
            stats = await consume(
                side.url, group, n, item.pullers, BATCH, wait_ms=1000, max_per_key=item.max_per_key
            )
    finally:
        await delete_group(side.admin, group)
    seconds = stats.healthy_done_at - stats.started
    return {
        "messages": n,
        "seconds": round(seconds, 3),
        "msgs_per_s": round(n / seconds),
        "msgs_per_pull": round(n / max(1, stats.pulls - stats.empty_pulls), 1),
        "server_cpu_us_per_msg": round(p.server_cpu / n * 1e6, 1),
        "order_violations": stats.order_violations,
        "load_1m": load_average(),
    }


def describe(r: dict[str, Any]) -> str:
    return (
        f"{r['msgs_per_s']:7,} msgs/s, {r['msgs_per_pull']:5.1f} msgs/pull, "
        f"{r['server_cpu_us_per_msg']:6.1f} µs/msg server, load {r['load_1m']}"
    )


def main() -> None:
    parser = arg_parser(__doc__, "5,000 messages, 3 rounds")
    parser.add_argument("--messages", type=int, help="default 10,000 (5,000 with --quick)")
    parser.add_argument("--rounds", type=int, help="default 5 (3 with --quick)")
    parser.add_argument("--pullers", type=int, default=4)
    args = parser.parse_args()
    n = args.messages or (5_000 if args.quick else 10_000)
    repeat = args.rounds or (3 if args.quick else 5)
    items = [Item(scenario, mpk, n, args.pullers) for scenario in SCENARIOS for mpk in RUN_LENGTHS]
    facts = machine_facts()

    async def run() -> dict[str, dict[str, list[dict[str, Any]]]]:
        with servers("cproxy-runs-", None) as procs:
            async with sides(procs) as the_sides:
                return await rounds(the_sides, items, repeat, lambda i: i.name, drain, describe)

    started = time.perf_counter()
    results = run_loop(run)["A"]
    rows = []
    for scenario in SCENARIOS:
        one, many = (results[Item(scenario, m, n, args.pullers).name] for m in RUN_LENGTHS)
        rate_1 = median([r["msgs_per_s"] for r in one])
        rate_32 = median([r["msgs_per_s"] for r in many])
        rows.append(
            {
                "scenario": scenario,
                "order_by": SCENARIOS[scenario][0],
                "keys": SCENARIOS[scenario][1],
                "rate_1": rate_1,
                "rate_32": rate_32,
                "ratio": ratio(rate_32, rate_1),
                "per_pull_1": median([r["msgs_per_pull"] for r in one]),
                "per_pull_32": median([r["msgs_per_pull"] for r in many]),
                "cpu_1": median([r["server_cpu_us_per_msg"] for r in one]),
                "cpu_32": median([r["server_cpu_us_per_msg"] for r in many]),
                "violations": sum(r["order_violations"] for r in [*one, *many]),
                "runs": len(one),
            }
        )
    text = table(
        [
            ("scenario", lambda r: r["scenario"]),
            ("order_by", lambda r: f"`{r['order_by']}`"),
            ("keys", lambda r: r["keys"]),
            ("msgs/s, max_per_key=1", lambda r: f"{r['rate_1']:,.0f}"),
            ("msgs/s, max_per_key=32", lambda r: f"{r['rate_32']:,.0f}"),
            ("**32 vs 1**", lambda r: f"**{r['ratio']:.2f}x**"),
            ("msgs per pull (1 / 32)", lambda r: f"{r['per_pull_1']:.1f} / {r['per_pull_32']:.1f}"),
            ("server µs per msg (1 / 32)", lambda r: f"{r['cpu_1']:.0f} / {r['cpu_32']:.0f}"),
            ("order violations", lambda r: r["violations"]),
            ("rounds", lambda r: r["runs"]),
        ],
        rows,
    )
    header = (
        f"## Same-key runs: drain throughput, max_per_key 1 vs 32 ({n:,} messages backlog, "
        f"{QUEUES} queues, {args.pullers} pull loops, max_messages {BATCH}; medians of "
        f"{repeat} interleaved rounds, {time.perf_counter() - started:.0f} s in all)"
    )
    out = {"machine": facts, "messages": n, "rounds": repeat, "rows": rows, "runs": results}
    finish(out, args, "runs", f"{header}\n\n{text}")


if __name__ == "__main__":
    main()
