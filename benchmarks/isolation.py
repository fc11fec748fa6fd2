"""Key isolation under stalls: healthy-key throughput when 1 % of keys stall, cproxy's
per-key ordering (``order_by: "key"``) against a partition-ordered baseline
(``order_by: "qid"``: the whole queue is one chain, what a Kafka consumer group or a
RocketMQ orderly consumer gives: a stalled message holds its whole queue).

``--messages`` messages over ``--keys`` keys (murmur2 places keys on ``--queues`` queues) are
produced once; every run drains that backlog in its own fresh group, with ``--pullers``
pullers (max_messages 100, wait_ms 1000, acks on the next pull). Stalled keys: every key
whose index is a multiple of ``--stall-every`` (1 %). Stalls (``harness.load.policy_for``):
``none``; ``never-ack`` (held, ack_timeout_ms 600000); ``always-fail`` (max_attempts 1000,
retry_backoff_ms [200]). Every group has the same config (``STALL_GROUP_CONFIG``); only
``order_by`` and the handler differ. *Healthy msgs/s* = first deliveries of non-stalled
messages / time until the last of them; runs that cannot finish (qid with a stall) or are
slow by construction (qid: one message per queue in flight) stop at ``--time-limit``.

1. *Sequential*: each run alone, in rotating rounds; medians and the median of per-round
   ratios stall / no-stall (qid only in the first ``--qid-rounds`` rounds).
2. *Paired* (robust on a shared machine): a no-stall and a stall group of the same ordering
   drain the backlog at the same time, each with its own pullers; the ratio compares healthy
   deliveries over the common window (until the first finished, or the time limit). Each pair
   round runs twice, each group's pullers starting first once (on this one client loop the
   first to start keeps a lead); the round's ratio is the geometric mean of the two.

    python -m benchmarks.isolation --quick            # < 1 minute
    python -m benchmarks.isolation --json iso.json    # full (about 7 minutes)
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

from benchmarks.harness.ab import Side, sides
from benchmarks.harness.load import (
    ORDERS,
    STALL_GROUP_CONFIG,
    STALLS,
    ConsumerStats,
    consume,
    create_topic,
    delete_group,
    group_stats,
    key_stride,
    make_batches,
    policy_for,
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
    progress,
    ratio,
    table,
)
from benchmarks.harness.server import servers
from cproxy.placement import queue_for_key

TOPIC = "iso"
END_STATS = ("buffered", "in_flight", "waiting", "retrying", "blocked_keys", "parked_keys")


async def drain(side: Side, args: Any, group: str, stall: str, limit: float) -> ConsumerStats:
    """The pullers of one run: ``stall``'s policy, max_messages 100, wait_ms 1000."""
    policy = policy_for(stall, args.stall_every)
    return await consume(
        side.url, group, args.healthy_total, args.pullers, 100, policy=policy, time_limit_s=limit
    )


async def one_run(side: Side, args: Any, order: str, stall: str, tag: str) -> dict[str, Any]:
    group = f"iso-{order}-{stall}-{tag}"
    await put_group(side.admin, group, TOPIC, order, **args.group_config)
    limit = 600 if stall == "none" and order == "key" else args.time_limit
    try:
        with Probe(side.pid, args.profile, group) as p:
            stats = await drain(side, args, group, stall, limit)
        gstats = await group_stats(side.admin, group)
    finally:
        await delete_group(side.admin, group)
    seconds = stats.healthy_seconds if stats.healthy_done_at else limit
    return {
        "order_by": order,
        "stall": stall,
        "healthy_delivered": stats.healthy_delivered,
        "completed": bool(stats.healthy_done_at),
        "seconds": round(seconds, 3),
        "healthy_msgs_per_s": round(stats.healthy_delivered / seconds, 1),
        "stalled_deliveries": stats.stalled_deliveries,
        "order_violations": stats.order_violations,
        "pulls": stats.pulls,
        "server_cpu_us_per_healthy_msg": round(
            p.server_cpu / max(stats.healthy_delivered, 1) * 1e6, 1
        ),
        "server_core_share": round(p.server_cpu / max(seconds, 1e-9), 2),
        "group_at_end": {k: gstats[k] for k in END_STATS},
        "load_1m": load_average(),
    }


async def paired_run(
    side: Side, args: Any, order: str, stall: str, tag: str, stall_first: bool = False
) -> dict[str, Any]:
    """Both groups drain at once; ``stall_first``: the stall group's pullers start first.

    Which group starts first matters: both groups' pullers share this process's event loop,
    and the group started first keeps a lead of up to ~30 % (none when the groups are
    drained from two processes), so ``pair`` runs each pair in both orders and combines
    them."""
    groups = {s: f"pair-{order}-{s}-{tag}" for s in ("none", stall)}
    for group in groups.values():
        await put_group(side.admin, group, TOPIC, order, **args.group_config)
    try:
        with Probe(side.pid) as p:
            runs = [drain(side, args, g, s, args.time_limit) for s, g in groups.items()]
            if stall_first:
                stalled, none = await asyncio.gather(runs[1], runs[0])
            else:
                none, stalled = await asyncio.gather(*runs)
    finally:
        for group in groups.values():
            await delete_group(side.admin, group)
    ends = [r.healthy_done_at - r.started for r in (none, stalled) if r.healthy_done_at]
    window = min(ends) if ends else args.time_limit
    a, b = none.delivered_by(window), stalled.delivered_by(window)
    return {
        "order_by": order,
        "stall": stall,
        "window_s": round(window, 3),
        "no_stall_healthy_in_window": a,
        "stall_healthy_in_window": b,
        "no_stall_msgs_per_s": round(a / window, 1),
        "stall_msgs_per_s": round(b / window, 1),
        "ratio": round(ratio(b, a), 4),
        "server_core_share": round(p.server_cpu / p.wall, 2),
        "order_violations": none.order_violations + stalled.order_violations,
        "load_1m": load_average(),
    }


async def pair(side: Side, args: Any, order: str, stall: str, tag: str) -> dict[str, Any]:
    """One pair round: ``paired_run`` in both start orders; the round's ratio is the geometric
    mean of the two (the start-order lead cancels), rates and window are their means."""
    a = await paired_run(side, args, order, stall, f"{tag}a")
    b = await paired_run(side, args, order, stall, f"{tag}b", stall_first=True)
    out = {k: round((a[k] + b[k]) / 2, 3) if isinstance(a[k], float) else a[k] for k in a}
    out["ratio"] = round(math.sqrt(a["ratio"] * b["ratio"]), 4)
    out["ratio_no_stall_first"], out["ratio_stall_first"] = a["ratio"], b["ratio"]
    out["order_violations"] = a["order_violations"] + b["order_violations"]
    return out


async def run(args: Any, the_servers: Any) -> dict[str, Any]:
    stalled_keys = [k for k in range(args.keys) if k % args.stall_every == 0]
    stalled_queues = sorted({queue_for_key(f"k{k}", args.queues) for k in stalled_keys})
    args.healthy_total = sum(
        1 for i in range(args.messages) if (i % args.keys) % args.stall_every != 0
    )
    out: dict[str, Any] = {"commit": the_servers[0].source.commit}
    out["setup"] = {
        "messages": args.messages,
        "keys": args.keys,
        "queues": args.queues,
        "stalled_keys": len(stalled_keys),
        "queues_with_a_stalled_key": stalled_queues,
        "healthy_messages": args.healthy_total,
        "pullers": args.pullers,
        "group_config": args.group_config,
        "time_limit_s": args.time_limit,
    }
    async with sides(the_servers) as (side,):
        await create_topic(side.admin, TOPIC, args.queues)
        batches = make_batches(args.messages, 100, args.keys, 100)
        produce_s = await produce(side.url, TOPIC, batches, 4, key_stride(100, args.keys))
        out["produce_msgs_per_s"] = round(args.messages / produce_s)
        out["runs"], out["pairs"] = [], []
        combos = [(o, s) for o in ORDERS for s in STALLS]
        for rnd in range(args.repeat):
            for order, stall in combos[rnd % len(combos) :] + combos[: rnd % len(combos)]:
                if order == "qid" and rnd >= args.qid_rounds:
                    continue
                r = await one_run(side, args, order, stall, f"r{rnd}")
                out["runs"].append({**r, "round": rnd})
                progress(
                    f"round {rnd + 1} {order:3s}/{stall:11s} {r['healthy_msgs_per_s']:8,.0f} "
                    f"healthy msgs/s ({r['healthy_delivered']:,} in {r['seconds']} s) "
                    f"load {r['load_1m']}"
                )
        for rnd in range(args.pair_rounds):
            for order in ORDERS[: 1 if rnd >= args.qid_rounds else 2]:
                for stall in STALLS[1:]:
                    r = await pair(side, args, order, stall, f"p{rnd}")
                    out["pairs"].append({**r, "round": rnd})
                    progress(
                        f"pair {rnd + 1} {order:3s}/{stall:11s} stall/no-stall {r['ratio']:.3f} "
                        f"({r['ratio_no_stall_first']:.3f} no-stall first, "
                        f"{r['ratio_stall_first']:.3f} stall first) "
                        f"over {r['window_s']} s load {r['load_1m']}"
                    )
    return out


def summarize(out: dict[str, Any]) -> dict[str, Any]:
    """Median rate per (order, stall), median of per-round ratios to no stall, paired ratios."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in out["runs"]:
        by.setdefault((r["order_by"], r["stall"]), []).append(r)
    ratios: dict[tuple[str, str], float] = {}
    for (order, stall), runs in by.items():
        base = {b["round"]: b["healthy_msgs_per_s"] for b in by.get((order, "none"), [])}
        per_round = [
            ratio(r["healthy_msgs_per_s"], base[r["round"]]) for r in runs if r["round"] in base
        ]
        ratios[(order, stall)] = median(per_round)
    pairs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in out["pairs"]:
        pairs.setdefault((r["order_by"], r["stall"]), []).append(r)
    return {"by": by, "ratios": ratios, "pairs": pairs}


def report(out: dict[str, Any]) -> str:
    s, setup = summarize(out), out["setup"]
    healthy = setup["healthy_messages"]

    def med(runs: list[dict[str, Any]], key: str) -> float:
        return median([r[key] for r in runs])

    def spread(runs: list[dict[str, Any]], key: str) -> str:
        values = [r[key] for r in runs]
        fmt = "{:.3f}" if key == "ratio" else "{:,.0f}"
        return f"{fmt.format(min(values))}-{fmt.format(max(values))}"

    def at_end(runs: list[dict[str, Any]]) -> str:
        e = runs[-1]["group_at_end"]
        return (
            f"buffered {e['buffered']}, in flight {e['in_flight']}, retrying {e['retrying']}, "
            f"parked {e['parked_keys']}"
        )

    seq = table(
        [
            ("order_by", lambda k: k[0]),
            ("stall", lambda k: k[1]),
            ("runs", lambda k: len(s["by"][k])),
            ("healthy msgs/s (median)", lambda k: f"{med(s['by'][k], 'healthy_msgs_per_s'):,.0f}"),
            ("range", lambda k: spread(s["by"][k], "healthy_msgs_per_s")),
            (
                "stall / no-stall (median of per-round ratios)",
                lambda k: "1 (base)" if k[1] == "none" else f"{s['ratios'][k]:.3f}",
            ),
            (
                "healthy delivered",
                lambda k: f"{med(s['by'][k], 'healthy_delivered'):,.0f}/{healthy:,}",
            ),
            ("seconds", lambda k: f"{med(s['by'][k], 'seconds'):.1f}"),
            (
                "server µs CPU / healthy msg",
                lambda k: f"{med(s['by'][k], 'server_cpu_us_per_healthy_msg'):.0f}",
            ),
            ("group at end of last run", lambda k: at_end(s["by"][k])),
        ],
        [(o, st) for o in ORDERS for st in STALLS if (o, st) in s["by"]],
    )
    paired = table(
        [
            ("order_by", lambda k: k[0]),
            ("stall", lambda k: k[1]),
            ("pairs", lambda k: len(s["pairs"][k])),
            ("healthy stall / no-stall (median)", lambda k: f"{med(s['pairs'][k], 'ratio'):.3f}"),
            ("range", lambda k: spread(s["pairs"][k], "ratio")),
            ("stall group msgs/s", lambda k: f"{med(s['pairs'][k], 'stall_msgs_per_s'):,.0f}"),
            (
                "no-stall group msgs/s",
                lambda k: f"{med(s['pairs'][k], 'no_stall_msgs_per_s'):,.0f}",
            ),
            ("common window s", lambda k: f"{med(s['pairs'][k], 'window_s'):.1f}"),
        ],
        [(o, st) for o in ORDERS for st in STALLS[1:] if (o, st) in s["pairs"]],
    )
    key_none = med(s["by"].get(("key", "none"), []), "healthy_msgs_per_s")
    qid_none = med(s["by"].get(("qid", "none"), []), "healthy_msgs_per_s")
    return "\n".join(
        [
            f"## Key isolation under stalls (commit {out['commit']})",
            "",
            f"{setup['messages']:,} messages over {setup['keys']:,} keys on {setup['queues']} "
            f"queues; {setup['stalled_keys']} stalled keys on queues "
            f"{setup['queues_with_a_stalled_key']}; {healthy:,} healthy messages; "
            f"{setup['pullers']} pullers; time limit {setup['time_limit_s']} s for stall runs.",
            "",
            seq,
            "",
            f"No-stall throughput, qid baseline / key: {ratio(qid_none, key_none):.2f} (qid hands "
            f"out one message per queue at a time: at most {setup['queues']} in flight).",
            "",
            "### Paired runs: no-stall and stall groups draining the backlog at the same time",
            "",
            paired,
        ]
    )


def main() -> None:
    parser = arg_parser(__doc__, "6,000 messages, 1 round, 5 s limit (< 1 minute)")
    parser.add_argument("--messages", type=int, help="default 150,000 (6,000 with --quick)")
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--stall-every", type=int, default=100, help="k %% N == 0 stalls (1%%)")
    parser.add_argument("--pullers", type=int, default=4)
    parser.add_argument("--repeat", type=int, help="rounds (default 3; 1 with --quick)")
    parser.add_argument("--qid-rounds", type=int, help="rounds with qid runs (default 2; 1)")
    parser.add_argument("--pair-rounds", type=int, help="paired rounds (default 5; 1)")
    parser.add_argument("--time-limit", type=float, help="per stall run, s (default 30; 5)")
    parser.add_argument("--profile", type=Path, help="py-spy each sequential run into DIR")
    parser.add_argument("--max-buffered", type=int, default=10_000, help="of every group")
    args = parser.parse_args()
    args.group_config = {**STALL_GROUP_CONFIG, "max_buffered": args.max_buffered}
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    args.messages = args.messages or (6_000 if args.quick else 150_000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.qid_rounds = args.qid_rounds if args.qid_rounds is not None else (1 if args.quick else 2)
    args.time_limit = args.time_limit or (5.0 if args.quick else 30.0)
    if args.pair_rounds is None:
        args.pair_rounds = 1 if args.quick else 5
    facts = machine_facts()
    with servers("cproxy-iso-", None) as the_servers:
        out = run_loop(lambda: run(args, the_servers))
    out["machine"] = facts
    s = summarize(out)
    out["summary"] = {
        "ratio_to_no_stall": {f"{o}/{st}": v for (o, st), v in s["ratios"].items()},
        "paired_ratio": {
            f"{o}/{st}": median([r["ratio"] for r in v]) for (o, st), v in s["pairs"].items()
        },
    }
    finish(out, args, "isolation", report(out))


if __name__ == "__main__":
    main()
