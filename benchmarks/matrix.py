"""End-to-end matrix: produce + pull + ack msgs/s over keys, batch sizes and pullers, the
raw-store limit for the same messages, and produce-to-delivery latency at 25/50/90 % of the
peak rate measured in the same run.

One ``cproxy serve`` subprocess (SQLite store, order_by key, 8 queues, 100-byte bodies).
Every cell runs on a fresh topic and group: 4 closed-loop producers and N pullers run at the
same time; the rate is messages / (first produce -> last message delivered). ``batch`` is
both the produce batch and the pull ``max_messages``; acks ride on the next pull.

Cells (a subset of keys x batch x pullers; the base cell is 10k keys, batch 100, 4 pullers):

- keys sweep     1k, 10k, 100k keys        (batch 100, 4 pullers)
- batch sweep    10, 100, 500               (10k keys, 4 pullers)
- pullers sweep  1, 2, 4, 8, 16             (10k keys, batch 100)

Repeats are interleaved (every cell once per round, rotating the order) and the median is
reported with the spread. The limit is ``store_raw``'s append and sequential read rate for
the same batch and body size in this process; a message costs one append and one read, so the
limit is 1 / (1/append + 1/read).

Latency: a closed-loop *peak* run on the latency setup (1k keys, produce batch 20, 4 pullers
with max_messages 100 and wait_ms 5000) first, then an open-loop producer at 25, 50 and 90 %
of that peak; per message, delivery time - ``produced_at_ms`` (store) and - client send time.

    .venv/bin/python -m benchmarks.matrix --quick            # < 1 minute
    .venv/bin/python -m benchmarks.matrix --json matrix.json # full (about 10 minutes)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import store_raw
from benchmarks._common import machine_facts, markdown_table, percentile
from benchmarks._load import (
    Probe,
    ServerProcess,
    consume,
    create_topic,
    delete_group,
    git_commit,
    key_stride,
    load_average,
    make_batches,
    median,
    open_loop_produce,
    produce,
    put_group,
    run_with_server,
)

QUEUES = 8
BODY_BYTES = 100
PRODUCERS = 4


@dataclass(frozen=True)
class Cell:
    sweep: str
    keys: int
    batch: int
    pullers: int
    queues: int = QUEUES
    body_bytes: int = BODY_BYTES

    @property
    def name(self) -> str:
        name = f"k{self.keys}-b{self.batch}-p{self.pullers}"
        if self.queues != QUEUES:
            name += f"-q{self.queues}"
        if self.body_bytes != BODY_BYTES:
            name += f"-s{self.body_bytes}"
        return name


def cells(quick: bool) -> list[Cell]:
    if quick:
        return [
            Cell("base", 10_000, 100, 4),
            Cell("keys", 100_000, 100, 4),
            Cell("batch", 10_000, 10, 4),
            Cell("batch", 10_000, 500, 4),
            Cell("pullers", 10_000, 100, 1),
            Cell("pullers", 10_000, 100, 16),
        ]
    out = [Cell("base", 10_000, 100, 4)]
    out += [Cell("keys", k, 100, 4) for k in (1_000, 100_000)]
    out += [Cell("batch", 10_000, b, 4) for b in (10, 500)]
    out += [Cell("pullers", 10_000, 100, p) for p in (1, 2, 8, 16)]
    return out


def cell_messages(cell: Cell, base: int, quick: bool) -> int:
    """A quarter for batch 10 (slow); in the full mode at least one message per key."""
    n = base if cell.batch >= 100 else base // 4
    return n if quick else max(n, cell.keys)


async def run_cell(
    url: str, admin: httpx.AsyncClient, pid: int, cell: Cell, messages: int, tag: str
) -> dict[str, Any]:
    topic, group = f"m-{cell.name}-{tag}", f"m-{cell.name}-{tag}-g"
    await create_topic(admin, topic, cell.queues)
    await put_group(admin, group, topic, "key")
    batches = make_batches(messages, cell.batch, cell.keys, cell.body_bytes)
    try:
        with Probe(pid, None, topic) as p:
            t0 = time.perf_counter()
            consumer = asyncio.create_task(
                consume(url, group, messages, cell.pullers, cell.batch, wait_ms=1000)
            )
            produce_s = await produce(
                url, topic, batches, PRODUCERS, key_stride(cell.batch, cell.keys)
            )
            stats = await consumer
            elapsed = stats.healthy_done_at - t0
    finally:
        await delete_group(admin, group)
    return {
        "cell": asdict(cell),
        "messages": messages,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(messages / elapsed),
        "mb_per_s": round(messages * cell.body_bytes / elapsed / 1e6, 2),
        "produce_only_msgs_per_s": round(messages / produce_s),
        "server_cpu_us_per_msg": round(p.server_cpu / messages * 1e6, 1),
        # Over the measured span: the pullers' last long polls after it cost ~no CPU.
        "server_core_share": round(p.server_cpu / elapsed, 2),
        "client_core_share": round(p.client_cpu / elapsed, 2),
        "pulls": stats.pulls,
        "empty_pulls": stats.empty_pulls,
        "order_violations": stats.order_violations,
        "load_1m": load_average(),
    }


async def latency_runs(
    url: str, admin: httpx.AsyncClient, pid: int, args: argparse.Namespace
) -> dict[str, Any]:
    keys, batch, pullers = 1_000, args.latency_batch, 4
    # Peak: the same producer batch and pullers, closed loop.
    peak_msgs = args.peak_messages
    topic = "lat-peak"
    await create_topic(admin, topic, QUEUES)
    await put_group(admin, f"{topic}-g", topic, "key")
    with Probe(pid, None, topic) as p:
        t0 = time.perf_counter()
        consumer = asyncio.create_task(
            consume(url, f"{topic}-g", peak_msgs, pullers, 100, wait_ms=5000)
        )
        await produce(
            url,
            topic,
            make_batches(peak_msgs, batch, keys, BODY_BYTES),
            PRODUCERS,
            key_stride(batch, keys),
        )
        stats = await consumer
        peak_s = stats.healthy_done_at - t0
    await delete_group(admin, f"{topic}-g")
    peak = peak_msgs / peak_s
    out: dict[str, Any] = {
        "setup": {"keys": keys, "produce_batch": batch, "pullers": pullers, "wait_ms": 5000},
        "peak": {
            "messages": peak_msgs,
            "msgs_per_s": round(peak),
            "server_core_share": round(p.server_cpu / peak_s, 2),
            "load_1m": load_average(),
        },
        "runs": [],
    }
    for fraction in (0.25, 0.5, 0.9):
        rate = peak * fraction
        topic = f"lat-{int(fraction * 100)}"
        await create_topic(admin, topic, QUEUES)
        await put_group(admin, f"{topic}-g", topic, "key")
        n_expected = max(1, round(args.latency_seconds * rate / batch)) * batch
        parked = asyncio.Event()

        async def settle(parked: asyncio.Event = parked) -> None:
            await asyncio.sleep(0.5)  # pullers are parked in their long polls
            parked.set()

        with Probe(pid, None, topic) as p:
            consumer = asyncio.create_task(
                consume(
                    url,
                    f"{topic}-g",
                    n_expected,
                    pullers,
                    100,
                    wait_ms=5000,
                    record_latency=True,
                    time_limit_s=args.latency_seconds * 3 + 30,
                )
            )
            await settle()
            sent = await open_loop_produce(
                url, topic, rate, batch, args.latency_seconds, keys, BODY_BYTES
            )
            stats = await consumer
        await delete_group(admin, f"{topic}-g")
        store = sorted(stats.latencies_store_ms)
        send = sorted(stats.latencies_send_ms)
        calls = sorted(sent.call_ms)

        def pct(values: list[float]) -> dict[str, float]:
            return {
                q: round(percentile(values, v), 1)
                for q, v in (("p50", 50), ("p99", 99), ("p999", 99.9), ("max", 100))
            }

        out["runs"].append(
            {
                "fraction_of_peak": fraction,
                "target_rate": round(rate),
                "achieved_rate": round(sent.messages / sent.seconds),
                "messages": sent.messages,
                "delivered": stats.healthy_delivered,
                "late_batches": sent.late_batches,
                "store_to_delivery_ms": pct(store),
                "send_to_delivery_ms": pct(send),
                "produce_call_ms": pct(calls),
                "server_core_share": round(p.server_cpu / p.wall, 2),
                "order_violations": stats.order_violations,
                "load_1m": load_average(),
            }
        )
    return out


async def store_limits(batches: list[int], total: int) -> dict[int, dict[str, float]]:
    """Raw SQLite store rates (store_raw) per produce batch, 100-byte bodies."""
    out: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="cproxy-raw-") as tmp:
        for batch in batches:
            append, read = await store_raw.run_case(
                store_raw.Case(batch, BODY_BYTES), total, QUEUES, 1000, Path(tmp), "normal"
            )
            out[batch] = {
                "append_msgs_per_s": round(append.wall),
                "read_msgs_per_s": round(read.wall),
                "limit_msgs_per_s": round(1 / (1 / append.wall + 1 / read.wall)),
                "cpu_us_per_msg": round(1e6 / append.cpu + 1e6 / read.cpu, 1),
            }
    return out


async def run(args: argparse.Namespace, server: ServerProcess) -> dict[str, Any]:
    the_cells = cells(args.quick)
    out: dict[str, Any] = {"load_1m_at_start": load_average()}
    out["store_limit"] = {
        str(k): v
        for k, v in (
            await store_limits(sorted({c.batch for c in the_cells}), args.limit_messages)
        ).items()
    }
    results: dict[str, list[dict[str, Any]]] = {c.name: [] for c in the_cells}
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as admin:
        for rnd in range(args.repeat):
            order = the_cells[rnd % len(the_cells) :] + the_cells[: rnd % len(the_cells)]
            for cell in order:
                n = cell_messages(cell, args.messages, args.quick)
                r = await run_cell(server.url, admin, server.pid, cell, n, f"r{rnd}")
                results[cell.name].append(r)
                print(
                    f"round {rnd + 1} {cell.name:18s} {r['msgs_per_s']:7,} msgs/s "
                    f"{r['server_cpu_us_per_msg']:6.1f} µs/msg server "
                    f"({r['server_core_share']:.0%} core) load {r['load_1m']}",
                    file=sys.stderr,
                    flush=True,
                )
        out["cells"] = results
        if not args.no_latency:
            out["latency"] = await latency_runs(server.url, admin, server.pid, args)
    out["load_1m_at_end"] = load_average()
    return out


def summarize(out: dict[str, Any], quick: bool) -> dict[str, dict[str, Any]]:
    summary: dict[str, dict[str, Any]] = {}
    for cell in cells(quick):
        runs = out["cells"][cell.name]
        rates = [r["msgs_per_s"] for r in runs]
        cpu = [r["server_cpu_us_per_msg"] for r in runs]
        limit = out["store_limit"][str(cell.batch)]
        summary[cell.name] = {
            "cell": cell,
            "messages": runs[0]["messages"],
            "median": median(rates),
            "min": min(rates),
            "max": max(rates),
            "cpu_us": median(cpu),
            "core": median([r["server_core_share"] for r in runs]),
            "client_core": median([r["client_core_share"] for r in runs]),
            "limit": limit["limit_msgs_per_s"],
            "fraction": median(rates) / limit["limit_msgs_per_s"],
            "store_cpu_share": limit["cpu_us_per_msg"] / median(cpu),
            "violations": sum(r["order_violations"] for r in runs),
        }
    return summary


def report(out: dict[str, Any], args: argparse.Namespace) -> str:
    summary = summarize(out, args.quick)
    rows = []
    for s in summary.values():
        c: Cell = s["cell"]
        rows.append(
            (
                c.sweep,
                f"{c.keys:,}",
                c.batch,
                c.pullers,
                f"{s['messages']:,}",
                f"{s['median']:,.0f}",
                f"{s['min']:,}-{s['max']:,}",
                f"{s['cpu_us']:.0f}",
                f"{1e6 / s['cpu_us']:,.0f}",
                f"{s['core']:.0%}",
                f"{s['client_core']:.0%}",
                f"{s['limit']:,}",
                f"{s['fraction']:.1%}",
                f"{s['store_cpu_share']:.0%}",
            )
        )
    lim_rows = [
        (
            b,
            f"{v['append_msgs_per_s']:,}",
            f"{v['read_msgs_per_s']:,}",
            f"{v['limit_msgs_per_s']:,}",
            v["cpu_us_per_msg"],
        )
        for b, v in out["store_limit"].items()
    ]
    text = [
        f"## End-to-end matrix (commit {out['commit']}, {args.repeat} rounds, medians)",
        "",
        markdown_table(
            [
                "sweep",
                "keys",
                "batch",
                "pullers",
                "msgs/cell",
                "e2e msgs/s",
                "range",
                "server µs CPU/msg",
                "msgs per server CPU-s",
                "server core use",
                "client core use",
                "store limit msgs/s",
                "e2e / limit",
                "store share of server CPU",
            ],
            rows,
        ),
        "",
        f"Per-key order violations seen by the pullers: "
        f"{sum(s['violations'] for s in summary.values())}",
        "",
        "### Raw store limit (same process, 100-byte bodies, 8 queues)",
        "",
        markdown_table(
            ["batch", "append msgs/s", "read msgs/s", "limit 1/(1/a+1/r)", "store µs CPU/msg"],
            lim_rows,
        ),
    ]
    if "latency" in out:
        lat = out["latency"]
        lrows = [
            (
                f"{r['fraction_of_peak']:.0%}",
                f"{r['target_rate']:,}",
                f"{r['achieved_rate']:,}",
                f"{r['delivered']:,}/{r['messages']:,}",
                *(r["store_to_delivery_ms"][q] for q in ("p50", "p99", "p999", "max")),
                *(r["send_to_delivery_ms"][q] for q in ("p50", "p99", "p999")),
                f"{r['server_core_share']:.0%}",
                r["load_1m"],
            )
            for r in lat["runs"]
        ]
        text += [
            "",
            f"### Produce-to-delivery latency (peak {lat['peak']['msgs_per_s']:,} msgs/s "
            f"closed loop: 1k keys, produce batch {lat['setup']['produce_batch']}, "
            "4 long-polling pullers, max_messages 100, wait_ms 5000)",
            "",
            markdown_table(
                [
                    "% of peak",
                    "target msgs/s",
                    "achieved",
                    "delivered",
                    "store→deliver p50 ms",
                    "p99",
                    "p99.9",
                    "max",
                    "send→deliver p50 ms",
                    "p99",
                    "p99.9",
                    "server core use",
                    "load",
                ],
                lrows,
            ),
        ]
    return "\n".join(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="6 cells, 1 round (< 1 minute)")
    parser.add_argument("--messages", type=int, help="messages per cell (batch >= 100)")
    parser.add_argument("--repeat", type=int, help="rounds (default 3; 1 with --quick)")
    parser.add_argument("--latency-seconds", type=float, help="per latency run (default 20)")
    parser.add_argument("--latency-batch", type=int, default=20, help="produce batch")
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)
    args.messages = args.messages or (4_000 if args.quick else 40_000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.latency_seconds = args.latency_seconds or (2.0 if args.quick else 20.0)
    args.peak_messages = 4_000 if args.quick else 30_000
    args.limit_messages = 10_000 if args.quick else 50_000
    facts = machine_facts()
    started = time.perf_counter()
    out = run_with_server("cproxy-matrix-", lambda server: run(args, server))
    out["commit"] = git_commit()
    out["machine"] = facts
    out["command"] = " ".join(["python -m benchmarks.matrix", *(argv or sys.argv[1:])])
    out["total_seconds"] = round(time.perf_counter() - started, 1)
    print(report(out, args))
    print(
        f"\n(total {out['total_seconds']} s, load {out['load_1m_at_start']} -> "
        f"{out['load_1m_at_end']}, {facts.get('cpu')}, {facts.get('logical_cores')} cores)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
