"""Key isolation under stalls: healthy-key throughput when 1 % of keys stall, cproxy's
per-key ordering (``order_by: "key"``) against a partition-ordered baseline
(``order_by: "qid"``: the whole queue is one chain, exactly what a Kafka consumer group or a
RocketMQ orderly consumer gives: a stalled message holds its whole queue).

One ``cproxy serve`` subprocess. ``--messages`` messages over ``--keys`` keys (message i has
key ``k{i % keys}``; murmur2 places keys on ``--queues`` queues) are produced once; every run
then drains that same backlog in its own fresh consumer group (every group sees every
message), with the same pullers (``--pullers`` async pullers, max_messages 100, wait_ms 1000,
acks on the next pull). Stalled keys: every key whose index is a multiple of 100 (1 %).

Runs, per ordering (key, qid):

- ``none``: no stall; the stalled keys' messages are acked like the rest;
- ``never-ack``: the handler holds every delivered message of a stalled key (never acks;
  ``ack_timeout_ms`` 600000, so nothing times out during the run);
- ``always-fail``: the handler fails every delivery of a stalled key (``max_attempts`` 1000,
  ``retry_backoff_ms`` [200]).

All groups use the same config (ack_timeout_ms 600000, max_attempts 1000, backoff 200 ms,
max_buffered 10000); only ``order_by`` and the handler differ. *Healthy msgs/s* = first
deliveries of non-stalled-key messages / time until the last of them was delivered; runs that
cannot finish (the qid stall runs) or are slow by construction (qid without stall: one message
per queue in flight) stop at ``--time-limit`` and count what got through in that window.

Two measurements:

1. *Sequential*: each of the 6 runs alone, in rounds (rotating order); medians, and the median
   of per-round ratios stall / no-stall. qid runs only in the first ``--qid-rounds`` rounds.
2. *Paired* (the robust one on a shared machine): a no-stall group and a stall group of the
   same ordering drain the backlog at the same time, each with its own pullers, so both see
   the same machine load; the ratio compares healthy deliveries over the common window (until
   the first of the two finished, or the time limit).

    .venv/bin/python -m benchmarks.isolation --quick          # < 1 minute
    .venv/bin/python -m benchmarks.isolation --json iso.json  # full (about 10 minutes)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import machine_facts, markdown_table
from benchmarks._load import (
    Action,
    Probe,
    ServerProcess,
    consume,
    create_topic,
    delete_group,
    git_commit,
    group_stats,
    key_stride,
    load_average,
    make_batches,
    median,
    produce,
    put_group,
    run_with_server,
)
from cproxy.partitioner import partition_for_key

TOPIC = "iso"
STALLS = ("none", "never-ack", "always-fail")
ORDERS = ("key", "qid")
GROUP_CONFIG: dict[str, Any] = {
    "ack_timeout_ms": 600_000,
    "max_attempts": 1000,
    "retry_backoff_ms": [200],
    "max_buffered": 10_000,
}


def is_stalled(k: int, every: int) -> bool:
    return k % every == 0


def policy_for(stall: str, every: int) -> Callable[[int], Action]:
    actions: dict[str, Action] = {"none": "ack_other", "never-ack": "hold", "always-fail": "fail"}
    bad = actions[stall]

    def policy(k: int) -> Action:
        return bad if k % every == 0 else "ack"

    return policy


async def one_run(
    url: str,
    admin: httpx.AsyncClient,
    pid: int,
    args: argparse.Namespace,
    order: str,
    stall: str,
    tag: str,
    healthy_total: int,
) -> dict[str, Any]:
    group = f"iso-{order}-{stall}-{tag}"
    await put_group(admin, group, TOPIC, order, **GROUP_CONFIG)
    limit = None if stall == "none" and order == "key" else args.time_limit
    try:
        with Probe(pid, args.profile, group) as p:
            stats = await consume(
                url,
                group,
                healthy_total,
                args.pullers,
                100,
                wait_ms=1000,
                policy=policy_for(stall, args.stall_every),
                time_limit_s=limit if limit is not None else 600,
            )
        gstats = await group_stats(admin, group)
    finally:
        await delete_group(admin, group)
    seconds = stats.healthy_seconds if stats.healthy_done_at else (limit or 600)
    return {
        "order_by": order,
        "stall": stall,
        "healthy_delivered": stats.healthy_delivered,
        "healthy_total": healthy_total,
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
        "group_at_end": {
            k: gstats[k]
            for k in ("buffered", "in_flight", "waiting", "retrying", "blocked_keys", "parked_keys")
        },
        "load_1m": load_average(),
    }


def delivered_by(timeline: list[tuple[float, int]], t: float) -> int:
    """Healthy first deliveries a puller set had made by ``t`` seconds."""
    count = 0
    for at, cumulative in timeline:
        if at > t:
            break
        count = cumulative
    return count


async def paired_run(
    url: str,
    admin: httpx.AsyncClient,
    pid: int,
    args: argparse.Namespace,
    order: str,
    stall: str,
    tag: str,
    healthy_total: int,
) -> dict[str, Any]:
    """A no-stall group and a stall group drain the backlog *at the same time*, with their
    own pullers each: both see the same machine load, so their ratio is immune to drift.
    Compared over the common window: until the first of the two finished (or the limit)."""
    groups = {s: f"pair-{order}-{s}-{tag}" for s in ("none", stall)}
    for group in groups.values():
        await put_group(admin, group, TOPIC, order, **GROUP_CONFIG)
    try:
        with Probe(pid, None, f"pair-{order}-{stall}") as p:
            results = await asyncio.gather(
                *(
                    consume(
                        url,
                        group,
                        healthy_total,
                        args.pullers,
                        100,
                        wait_ms=1000,
                        policy=policy_for(s, args.stall_every),
                        time_limit_s=args.time_limit,
                    )
                    for s, group in groups.items()
                )
            )
    finally:
        for group in groups.values():
            await delete_group(admin, group)
    none, stalled = results
    ends = [r.healthy_done_at - r.started for r in results if r.healthy_done_at]
    window = min(ends) if ends else args.time_limit
    a, b = delivered_by(none.timeline, window), delivered_by(stalled.timeline, window)
    return {
        "order_by": order,
        "stall": stall,
        "window_s": round(window, 3),
        "no_stall_healthy_in_window": a,
        "stall_healthy_in_window": b,
        "no_stall_msgs_per_s": round(a / window, 1),
        "stall_msgs_per_s": round(b / window, 1),
        "ratio": round(b / a, 4) if a else float("nan"),
        "server_core_share": round(p.server_cpu / p.wall, 2),
        "order_violations": none.order_violations + stalled.order_violations,
        "load_1m": load_average(),
    }


async def run(args: argparse.Namespace, server: ServerProcess) -> dict[str, Any]:
    out: dict[str, Any] = {"load_1m_at_start": load_average()}
    stalled_keys = [k for k in range(args.keys) if is_stalled(k, args.stall_every)]
    stalled_queues = sorted({partition_for_key(f"k{k}", args.queues) for k in stalled_keys})
    healthy_total = sum(
        1 for i in range(args.messages) if not is_stalled(i % args.keys, args.stall_every)
    )
    out["setup"] = {
        "messages": args.messages,
        "keys": args.keys,
        "queues": args.queues,
        "stalled_keys": len(stalled_keys),
        "stalled_key_fraction": len(stalled_keys) / args.keys,
        "queues_with_a_stalled_key": stalled_queues,
        "healthy_messages": healthy_total,
        "pullers": args.pullers,
        "group_config": GROUP_CONFIG,
        "time_limit_s": args.time_limit,
    }
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as admin:
        await create_topic(admin, TOPIC, args.queues)
        batches = make_batches(args.messages, 100, args.keys, 100)
        produce_s = await produce(server.url, TOPIC, batches, 4, key_stride(100, args.keys))
        out["produce_msgs_per_s"] = round(args.messages / produce_s)
        runs: list[dict[str, Any]] = []
        combos = [(o, s) for o in ORDERS for s in STALLS]
        for rnd in range(args.repeat):
            todo = combos[rnd % len(combos) :] + combos[: rnd % len(combos)]
            for order, stall in todo:
                if order == "qid" and rnd >= args.qid_rounds:
                    continue
                r = await one_run(
                    server.url, admin, server.pid, args, order, stall, f"r{rnd}", healthy_total
                )
                r["round"] = rnd
                runs.append(r)
                print(
                    f"round {rnd + 1} {order:3s}/{stall:11s} "
                    f"{r['healthy_msgs_per_s']:8,.0f} healthy msgs/s "
                    f"({r['healthy_delivered']:,}/{healthy_total:,} in {r['seconds']} s, "
                    f"server {r['server_core_share']:.0%} core) load {r['load_1m']}",
                    file=sys.stderr,
                    flush=True,
                )
        out["runs"] = runs
        pairs: list[dict[str, Any]] = []
        for rnd in range(args.pair_rounds):
            for order in ORDERS:
                if order == "qid" and rnd >= args.qid_rounds:
                    continue
                for stall in STALLS[1:]:
                    r = await paired_run(
                        server.url, admin, server.pid, args, order, stall, f"p{rnd}", healthy_total
                    )
                    r["round"] = rnd
                    pairs.append(r)
                    print(
                        f"pair {rnd + 1} {order:3s}/{stall:11s} stall/no-stall "
                        f"{r['ratio']:.3f} over {r['window_s']} s "
                        f"({r['stall_healthy_in_window']:,} vs {r['no_stall_healthy_in_window']:,}"
                        f") load {r['load_1m']}",
                        file=sys.stderr,
                        flush=True,
                    )
        out["pairs"] = pairs
    out["load_1m_at_end"] = load_average()
    return out


def summarize(out: dict[str, Any]) -> dict[str, Any]:
    runs = out["runs"]
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault((r["order_by"], r["stall"]), []).append(r)
    rates = {k: median([r["healthy_msgs_per_s"] for r in v]) for k, v in by.items()}
    ratios: dict[tuple[str, str], float] = {}
    for order in ORDERS:
        for stall in STALLS[1:]:
            per_round = []
            for r in by.get((order, stall), []):
                base = [b for b in by.get((order, "none"), []) if b["round"] == r["round"]]
                if base:
                    per_round.append(r["healthy_msgs_per_s"] / base[0]["healthy_msgs_per_s"])
            ratios[(order, stall)] = median(per_round)
    paired: dict[tuple[str, str], list[float]] = {}
    for r in out.get("pairs", []):
        paired.setdefault((r["order_by"], r["stall"]), []).append(r["ratio"])
    return {"by": by, "rates": rates, "ratios": ratios, "paired": paired}


def report(out: dict[str, Any]) -> str:
    s = summarize(out)
    setup = out["setup"]
    rows = []
    for order in ORDERS:
        for stall in STALLS:
            runs = s["by"].get((order, stall), [])
            if not runs:
                continue
            rates = [r["healthy_msgs_per_s"] for r in runs]
            ratio = "1 (base)" if stall == "none" else f"{s['ratios'][(order, stall)]:.3f}"
            end = runs[-1]["group_at_end"]
            rows.append(
                (
                    f"{order}",
                    stall,
                    len(runs),
                    f"{median(rates):,.0f}",
                    f"{min(rates):,.0f}-{max(rates):,.0f}",
                    ratio,
                    f"{median([r['healthy_delivered'] for r in runs]):,.0f}"
                    f"/{setup['healthy_messages']:,}",
                    f"{median([r['seconds'] for r in runs]):.1f}",
                    f"{median([r['server_cpu_us_per_healthy_msg'] for r in runs]):.0f}",
                    f"buffered {end['buffered']}, in flight {end['in_flight']}, "
                    f"retrying {end['retrying']}, parked {end['parked_keys']}",
                )
            )
    prows = []
    for order in ORDERS:
        for stall in STALLS[1:]:
            pr = [r for r in out.get("pairs", []) if (r["order_by"], r["stall"]) == (order, stall)]
            if not pr:
                continue
            ratios = [r["ratio"] for r in pr]
            prows.append(
                (
                    order,
                    stall,
                    len(pr),
                    f"{median(ratios):.3f}",
                    f"{min(ratios):.3f}-{max(ratios):.3f}",
                    f"{median([r['stall_msgs_per_s'] for r in pr]):,.0f}",
                    f"{median([r['no_stall_msgs_per_s'] for r in pr]):,.0f}",
                    f"{median([r['window_s'] for r in pr]):.1f}",
                )
            )
    key_none = s["rates"].get(("key", "none"), float("nan"))
    qid_none = s["rates"].get(("qid", "none"), float("nan"))
    text = [
        f"## Key isolation under stalls (commit {out['commit']})",
        "",
        f"{setup['messages']:,} messages over {setup['keys']:,} keys on {setup['queues']} "
        f"queues; {setup['stalled_keys']} stalled keys "
        f"({setup['stalled_key_fraction']:.0%}) sitting on queues "
        f"{setup['queues_with_a_stalled_key']} "
        f"({len(setup['queues_with_a_stalled_key'])}/{setup['queues']} queues); "
        f"{setup['healthy_messages']:,} healthy messages; {setup['pullers']} pullers; "
        f"time limit {setup['time_limit_s']} s for stall runs.",
        "",
        markdown_table(
            [
                "order_by",
                "stall",
                "runs",
                "healthy msgs/s (median)",
                "range",
                "stall / no-stall (median of per-round ratios)",
                "healthy delivered",
                "seconds",
                "server µs CPU / healthy msg",
                "group at end of last run",
            ],
            rows,
        ),
        "",
        f"No-stall throughput, qid baseline / key: {qid_none / key_none:.2f} (the qid group "
        "hands out one message per queue at a time: at most "
        f"{setup['queues']} in flight).",
        "",
        "### Paired runs: no-stall and stall groups draining the backlog at the same time",
        "",
        markdown_table(
            [
                "order_by",
                "stall",
                "pairs",
                "healthy stall / no-stall (median)",
                "range",
                "stall group healthy msgs/s",
                "no-stall group healthy msgs/s",
                "common window s",
            ],
            prows,
        ),
    ]
    return "\n".join(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="6,000 messages, 1 round")
    parser.add_argument("--messages", type=int, help="default 150,000 (6,000 with --quick)")
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--stall-every", type=int, default=100, help="k %% N == 0 stalls (1%%)")
    parser.add_argument("--pullers", type=int, default=4)
    parser.add_argument("--repeat", type=int, help="rounds (default 3; 1 with --quick)")
    parser.add_argument("--qid-rounds", type=int, help="rounds with qid runs (default 2)")
    parser.add_argument("--pair-rounds", type=int, help="paired rounds (default 5; 1)")
    parser.add_argument("--time-limit", type=float, help="per stall run, s (default 30; 5)")
    parser.add_argument("--profile", type=Path, help="py-spy each sequential run into DIR")
    parser.add_argument("--max-buffered", type=int, default=10_000, help="of every group")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)
    GROUP_CONFIG["max_buffered"] = args.max_buffered
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    args.messages = args.messages or (6_000 if args.quick else 150_000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.qid_rounds = args.qid_rounds if args.qid_rounds is not None else (1 if args.quick else 2)
    args.time_limit = args.time_limit or (5.0 if args.quick else 30.0)
    args.pair_rounds = (
        args.pair_rounds if args.pair_rounds is not None else (1 if args.quick else 5)
    )
    facts = machine_facts()
    started = time.perf_counter()
    out = run_with_server("cproxy-iso-", lambda server: run(args, server))
    out["commit"] = git_commit()
    out["machine"] = facts
    out["command"] = " ".join(["python -m benchmarks.isolation", *(argv or sys.argv[1:])])
    out["total_seconds"] = round(time.perf_counter() - started, 1)
    print(report(out))
    print(
        f"\n(total {out['total_seconds']} s, load {out['load_1m_at_start']} -> "
        f"{out['load_1m_at_end']}, {facts.get('cpu')}, {facts.get('logical_cores')} cores)"
    )
    if args.json is not None:
        summary = summarize(out)
        out["summary"] = {
            "healthy_msgs_per_s": {f"{o}/{s}": v for (o, s), v in summary["rates"].items()},
            "ratio_to_no_stall": {f"{o}/{s}": v for (o, s), v in summary["ratios"].items()},
            "paired_ratio": {f"{o}/{s}": median(v) for (o, s), v in summary["paired"].items()},
        }
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
