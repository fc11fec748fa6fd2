"""Isolation under stalls: healthy-key throughput when 1 % of keys stall, with cproxy's per-key
ordering (``order_by: key``) and with the partition-ordered baseline (``order_by: qid``: a
queue is one chain, what a Kafka consumer group gives: a stalled message holds its queue).

``--messages`` messages over 1,000 keys (8 queues) are produced once. Each pair drains that
backlog with two groups of the same ordering at the same time, each with its own 4 pullers
(max_messages 100, acks on the next pull): one with no stall, one where every key whose index
is a multiple of 100 stalls, either *never-ack* (held; ack_timeout 600 s) or *always-fail*
(failed on every delivery, retried every 200 ms). The ratio compares the two groups' healthy
deliveries over their common window (until the first finished, or ``--time-limit``), so both
saw the same load. Each pair runs twice, each group's pullers starting first once (on one
client loop the first keeps a lead); the pair's ratio is the geometric mean of the two.

    python -m benchmarks.isolation --quick             # 6,000 messages, 1 pair each
    python -m benchmarks.isolation --json iso.json     # 150,000 messages, 3 pairs each
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from benchmarks.harness.ab import Side, sides
from benchmarks.harness.load import (
    ORDERS,
    STALL_GROUP_CONFIG,
    STALLS,
    consume,
    create_topic,
    delete_group,
    key_stride,
    make_batches,
    policy_for,
    produce,
    put_group,
    run_loop,
)
from benchmarks.harness.report import (
    arg_parser,
    finish,
    load_average,
    machine_facts,
    median,
    progress,
    ratio,
    table,
)
from benchmarks.harness.server import servers

TOPIC, KEYS, EVERY = "iso", 1_000, 100


async def paired_run(side: Side, args: Any, order: str, stall: str, tag: str,
                     stall_first: bool) -> dict[str, float]:  # fmt: skip
    groups = {s: f"pair-{order}-{s}-{tag}" for s in ("none", stall)}
    for group in groups.values():
        await put_group(side.admin, group, TOPIC, order, **STALL_GROUP_CONFIG)
    runs = {
        s: consume(side.url, g, args.healthy, 4, 100, policy=policy_for(s, EVERY),
                   time_limit_s=args.time_limit)
        for s, g in groups.items()
    }  # fmt: skip
    try:
        if stall_first:
            stalled, none = await asyncio.gather(runs[stall], runs["none"])
        else:
            none, stalled = await asyncio.gather(runs["none"], runs[stall])
    finally:
        for group in groups.values():
            await delete_group(side.admin, group)
    ends = [r.healthy_done_at - r.started for r in (none, stalled) if r.healthy_done_at]
    window = min(ends) if ends else args.time_limit
    a, b = none.delivered_by(window), stalled.delivered_by(window)
    violations = none.order_violations + stalled.order_violations
    return {"window_s": window, "none_per_s": a / window, "stall_per_s": b / window,
            "ratio": ratio(b, a), "violations": violations}  # fmt: skip


async def run(args: Any, the_servers: Any) -> dict[str, Any]:
    args.healthy = sum(1 for i in range(args.messages) if (i % KEYS) % EVERY != 0)
    out: dict[str, Any] = {"commit": the_servers[0].source.commit, "pairs": []}
    async with sides(the_servers) as (side,):
        await create_topic(side.admin, TOPIC, 8)
        batches = make_batches(args.messages, 100, KEYS, 100)
        await produce(side.url, TOPIC, batches, 4, key_stride(100, KEYS))
        for rnd in range(args.pairs):
            for order in ORDERS:
                for stall in STALLS[1:]:
                    a = await paired_run(side, args, order, stall, f"p{rnd}a", False)
                    b = await paired_run(side, args, order, stall, f"p{rnd}b", True)
                    r = {k: (a[k] + b[k]) / 2 for k in a}
                    r |= {"order_by": order, "stall": stall, "load_1m": load_average(),
                          "ratio": math.sqrt(a["ratio"] * b["ratio"])}  # fmt: skip
                    out["pairs"].append(r)
                    progress(
                        f"pair {rnd + 1} {order:3s}/{stall:11s} healthy stall/none "
                        f"{r['ratio']:.3f} over {r['window_s']:.1f} s load {r['load_1m']}"
                    )
    return out


def report(out: dict[str, Any], args: Any) -> str:
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in out["pairs"]:
        by.setdefault((r["order_by"], r["stall"]), []).append(r)

    def med(k: tuple[str, str], key: str) -> float:
        return median([r[key] for r in by[k]])

    rows = table(
        [
            ("order_by", lambda k: k[0]),
            ("stall (1 % of keys)", lambda k: k[1]),
            ("pairs", lambda k: len(by[k])),
            ("healthy msgs/s, no stall", lambda k: f"{med(k, 'none_per_s'):,.0f}"),
            ("healthy msgs/s, stall", lambda k: f"{med(k, 'stall_per_s'):,.0f}"),
            ("**stall / no stall**", lambda k: f"{med(k, 'ratio'):.3f}"),
            (
                "range",
                lambda k: (
                    f"{min(r['ratio'] for r in by[k]):.3f}-{max(r['ratio'] for r in by[k]):.3f}"
                ),
            ),
            ("order violations", lambda k: int(sum(r["violations"] for r in by[k]))),
        ],
        list(by),
    )
    return (
        f"## Isolation under stalls (commit {out['commit']}; {args.messages:,} messages over "
        f"{KEYS:,} keys, 8 queues, 10 stalled keys; medians of paired runs)\n\n{rows}"
    )


def main() -> None:
    parser = arg_parser(__doc__, "6,000 messages, 1 pair each, 5 s limit")
    parser.add_argument("--messages", type=int, help="default 150,000 (6,000 with --quick)")
    parser.add_argument("--pairs", type=int, help="pair rounds (default 3; 1 with --quick)")
    parser.add_argument("--time-limit", type=float, help="per pair, s (default 30; 5 quick)")
    args = parser.parse_args()
    args.messages = args.messages or (6_000 if args.quick else 150_000)
    args.pairs = args.pairs or (1 if args.quick else 3)
    args.time_limit = args.time_limit or (5.0 if args.quick else 30.0)
    facts = machine_facts()
    with servers("cproxy-iso-", None) as the_servers:
        out = run_loop(lambda: run(args, the_servers))
    out["machine"] = facts
    finish(out, args, "isolation", report(out, args))


if __name__ == "__main__":
    main()
