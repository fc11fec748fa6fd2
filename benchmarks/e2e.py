"""End-to-end figures of issue #2: a real ``cproxy serve`` subprocess driven over HTTP.

Phases (each on its own topic and group, order_by key, 1,000 keys, 8 queues):

0. memory (first, on a fresh server): RSS at start, after producing 100k messages with no
   group, with those buffered by a group (``max_buffered=200000``) that consumes nothing,
   and after deleting that group; RSS again at the very end, every group drained;
1. produce: M messages in batches of 100 from several concurrent producers;
2. consume: N pullers (``max_messages=100``, acks on the next pull) drain the group;
   sequential end-to-end = M / (produce s + consume s);
3. mixed: producers and pullers at once on a fresh topic (first produce to last ack);
4. latency: long-polling pullers (``wait_ms=5000``) wait; an open-loop producer sends at a
   fixed rate in small batches; per message, delivery time - ``produced_at_ms`` (store)
   and - client send time.

Client and server share the machine: on few cores the numbers are a floor, not a ceiling.

    python -m benchmarks.e2e --quick                        # < 1 minute
    python -m benchmarks.e2e --json e2e.json                # 200k messages
    python -m benchmarks.e2e --quick --profile /tmp/prof    # py-spy per phase
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.ab import Side, sides
from benchmarks.harness.load import (
    consume,
    create_topic,
    delete_group,
    drained,
    group_stats,
    key_stride,
    make_batches,
    open_loop_produce,
    produce,
    put_group,
    run_loop,
    wait_stats,
)
from benchmarks.harness.probe import Probe, rss
from benchmarks.harness.report import arg_parser, finish, machine_facts, markdown_table, percentiles
from benchmarks.harness.server import servers

KEYS = 1000


async def setup(side: Side, args: Any, topic: str, group: str | None) -> None:
    await create_topic(side.admin, topic, args.queues)
    if group is not None:
        buffer = {} if args.max_buffered is None else {"max_buffered": args.max_buffered}
        await put_group(side.admin, group, topic, "key", **buffer)


async def memory_phase(side: Side, args: Any) -> dict[str, Any]:
    n = args.memory_messages
    out: dict[str, Any] = {"messages": n, "before": rss(side.pid)}
    await create_topic(side.admin, "mem", args.queues)
    batches = make_batches(n, args.batch, KEYS, args.body_bytes)
    await produce(side.url, "mem", batches, args.producers, key_stride(args.batch, KEYS))
    out["after_produce_no_group"] = base = rss(side.pid)
    t0 = time.perf_counter()
    await put_group(side.admin, "mem-g", "mem", "key", max_buffered=200_000)
    s = await wait_stats(side.admin, "mem-g", lambda s: s["buffered"] >= n, "buffered")
    out["read_in_seconds"] = round(time.perf_counter() - t0, 3)
    await asyncio.sleep(0.5)  # let allocations settle
    out["buffered"] = {k: s[k] for k in ("buffered", "ready", "waiting")}
    out["after_buffering"] = after = rss(side.pid)
    await delete_group(side.admin, "mem-g")
    out["after_group_deleted"] = rss(side.pid)
    out["bytes_per_buffered_message"] = round((after["rss_mib"] - base["rss_mib"]) * 2**20 / n)
    if "anon_mib" in after:
        anon = (after["anon_mib"] - base["anon_mib"]) * 2**20 / n
        out["anon_bytes_per_buffered_message"] = round(anon)
    return out


async def throughput_phases(side: Side, args: Any, out: dict[str, Any]) -> None:
    m, prof = args.messages, args.profile
    stride = key_stride(args.batch, KEYS)
    await setup(side, args, "tput", "tput-g")
    batches = make_batches(m, args.batch, KEYS, args.body_bytes)
    with Probe(side.pid, prof, "produce") as p:
        produce_s = await produce(side.url, "tput", batches, args.producers, stride)
    out["produce"] = {"messages": m, "msgs_per_s": round(m / produce_s), **p.row()}
    with Probe(side.pid, prof, "consume") as p:
        t0 = time.perf_counter()
        stats = await consume(side.url, "tput-g", m, args.pullers, 100, wait_ms=500)
        consume_s = max(stats.healthy_done_at, stats.flushed_at) - t0
    await wait_stats(side.admin, "tput-g", drained, "drained", 30)
    out["consume"] = {
        "messages": stats.healthy_delivered,
        "msgs_per_s": round(m / consume_s),
        "pulls": stats.pulls,
        "empty_pulls": stats.empty_pulls,
        "order_violations": stats.order_violations,
        **p.row(),
    }
    out["e2e_sequential"] = {"msgs_per_s": round(m / (produce_s + consume_s))}
    await setup(side, args, "mixed", "mixed-g")
    batches = make_batches(m, args.batch, KEYS, args.body_bytes)
    with Probe(side.pid, prof, "mixed") as p:
        t0 = time.perf_counter()
        _, stats = await asyncio.gather(
            produce(side.url, "mixed", batches, args.producers, stride),
            consume(side.url, "mixed-g", m, args.pullers, 100, wait_ms=500),
        )
        mixed_s = max(stats.healthy_done_at, stats.flushed_at) - t0
    await wait_stats(side.admin, "mixed-g", drained, "drained", 30)
    out["mixed"] = {
        "messages": m,
        "msgs_per_s": round(m / mixed_s),
        "order_violations": stats.order_violations,
        **p.row(),
    }


async def latency_phase(side: Side, args: Any) -> dict[str, Any]:
    await setup(side, args, "lat", "lat-g")
    rate, batch = args.rate, args.rate_batch
    total = max(1, round(args.latency_seconds * rate / batch)) * batch
    consumer = asyncio.create_task(
        consume(side.url, "lat-g", total, args.pullers, 100, wait_ms=5000, record_latency=True)
    )
    await asyncio.sleep(0.5)  # the pullers are now parked in their long polls
    with Probe(side.pid, args.profile, "latency") as p:
        sent = await open_loop_produce(
            side.url, "lat", rate, batch, args.latency_seconds, KEYS, args.body_bytes
        )
        stats = await consumer
    await wait_stats(side.admin, "lat-g", drained, "drained", 30)
    return {
        "messages": total,
        "target_rate": rate,
        "batch": batch,
        "achieved_rate": round(sent.messages / sent.seconds),
        "late_batches": sent.late_batches,
        "delivered": stats.healthy_delivered,
        "order_violations": stats.order_violations,
        "store_to_delivery_ms": percentiles(stats.latencies_store_ms, 2),
        "send_to_delivery_ms": percentiles(stats.latencies_send_ms, 2),
        "produce_call_ms": percentiles(sent.call_ms, 2),
        **p.row(),
    }


async def run(args: Any, the_servers: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"commit": the_servers[0].source.commit}
    async with sides(the_servers) as (side,):
        out["memory_baseline"] = rss(side.pid)
        out["memory"] = await memory_phase(side, args)  # first: earlier phases would blur it
        await throughput_phases(side, args, out)
        out["latency"] = await latency_phase(side, args)
        buffered = 0
        for g in ("tput-g", "mixed-g", "lat-g"):
            buffered += (await group_stats(side.admin, g))["buffered"]
        out["memory_end"] = {**rss(side.pid), "buffered": buffered}
    return out


def report(out: dict[str, Any], args: Any) -> str:
    p, c, mx, lat, mem = (out[k] for k in ("produce", "consume", "mixed", "latency", "memory"))

    def cpu(x: dict[str, Any]) -> str:
        # CPU per message is steadier than msgs/s on a shared machine.
        per_msg = x["server_cpu_s"] / x["messages"] * 1e6
        return (
            f"server {per_msg:.0f} µs CPU/msg, {x['server_cpu_s'] / x['wall_s']:.0%} of a "
            f"core; client {x['client_cpu_s'] / x['wall_s']:.0%}"
        )

    def mib(name: str, x: dict[str, Any], setup: str, notes: str = "") -> tuple[str, str, str, str]:
        return (name, setup, f"{x['rss_mib']} MiB", f"anon {x.get('anon_mib')}{notes}")

    rows = [
        (
            "produce",
            f"{p['messages']:,} msgs, batch {args.batch}, {args.producers} producers",
            f"{p['msgs_per_s']:,} msgs/s",
            cpu(p),
        ),
        (
            "consume",
            f"{c['messages']:,} msgs, {args.pullers} pullers, max_messages 100, acks on next pull",
            f"{c['msgs_per_s']:,} msgs/s",
            cpu(c),
        ),
        (
            "end-to-end (sequential)",
            "M / (produce s + consume s)",
            f"{out['e2e_sequential']['msgs_per_s']:,} msgs/s",
            "",
        ),
        (
            "end-to-end (mixed)",
            "produce and consume at once, first produce to last ack",
            f"{mx['msgs_per_s']:,} msgs/s",
            cpu(mx),
        ),
    ]
    for name in ("store_to_delivery_ms", "send_to_delivery_ms", "produce_call_ms"):
        d = lat[name]
        rows.append(
            (
                f"latency {name.removesuffix('_ms').replace('_', ' ')}",
                f"{lat['achieved_rate']:,}/s (target {lat['target_rate']:,}) in batches of "
                f"{lat['batch']}, {lat['messages']:,} msgs, wait_ms 5000",
                f"p50 {d['p50']} ms, p99 {d['p99']} ms, p99.9 {d['p999']} ms, max {d['max']} ms",
                cpu(lat) if name.startswith("store") else "",
            )
        )
    buffered = mem["buffered"]["buffered"]
    per_msg = (
        f"; {mem['bytes_per_buffered_message']} B/msg RSS, "
        f"{mem.get('anon_bytes_per_buffered_message')} B/msg anon"
    )
    rows += [
        mib("RSS at start", out["memory_baseline"], "idle server"),
        mib(
            "RSS after producing",
            mem["after_produce_no_group"],
            f"{mem['messages']:,} msgs stored, no group",
        ),
        mib(
            "RSS with messages buffered",
            mem["after_buffering"],
            f"{buffered:,} buffered (read in {mem['read_in_seconds']} s), max_buffered 200,000",
            per_msg,
        ),
        mib("RSS after deleting that group", mem["after_group_deleted"], ""),
        mib(
            "RSS at the end",
            out["memory_end"],
            f"all phases done, groups drained ({out['memory_end']['buffered']} buffered)",
        ),
    ]
    violations = c["order_violations"] + mx["order_violations"] + lat["order_violations"]
    return "\n".join(
        [
            f"## cproxy end-to-end (commit {out['commit']})",
            "",
            markdown_table(["phase", "setup", "result", "notes"], rows),
            "",
            f"Per-key order violations observed by the clients: {violations}",
        ]
    )


def main() -> None:
    parser = arg_parser(__doc__, "20k messages, 5 s latency phase (< 1 minute)")
    parser.add_argument("--messages", type=int, default=200_000, help="produce/consume/mixed")
    parser.add_argument("--batch", type=int, default=100, help="messages per produce call")
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--pullers", type=int, default=4)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--body-bytes", type=int, default=100)
    parser.add_argument("--max-buffered", type=int, help="of the throughput groups")
    parser.add_argument("--rate", type=int, default=2000, help="latency phase msgs/s")
    parser.add_argument("--rate-batch", type=int, default=10, help="latency phase batch size")
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--memory-messages", type=int, default=100_000)
    parser.add_argument("--profile", type=Path, help="py-spy raw profile per phase into DIR")
    args = parser.parse_args()
    if args.quick:
        args.messages = min(args.messages, 20_000)
        args.latency_seconds = min(args.latency_seconds, 5.0)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    facts = machine_facts()
    with servers("cproxy-e2e-", None) as the_servers:
        out = run_loop(lambda: run(args, the_servers))
    out["machine"] = facts
    finish(out, args, "e2e", report(out, args))


if __name__ == "__main__":
    main()
