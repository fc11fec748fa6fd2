"""End-to-end matrix and A/B: produce + pull + ack msgs/s and server CPU per message over keys,
batch sizes and pullers, and produce-to-delivery latency at 25/50/90 % of the peak measured in
the same run; with ``--ab REF``, the same against a server from another git ref, interleaved.

One ``cproxy serve`` subprocess (SQLite store, order_by key, 8 queues, 100-byte bodies);
every cell is a fresh topic and group drained by N pullers while 4 closed-loop producers fill
it (``harness.cells``). Cells around the base cell (10k keys, batch 100, 4 pullers): keys
1k/10k/100k, batch 10/100/500, pullers 1/2/4/8/16, and the base cell with a message id on
every message (``ids``: what produce dedup costs), once random (like UUID4s) and once
time-ordered (``consumer_sdk.new_message_id``, UUIDv7s). Rounds are interleaved (rotating order);
medians with the range. Latency: ``benchmarks.latency``'s cproxy points (its peak on that
setup, then open loop at 25/50/90 % of it, or at ``--latency-rates``), per server.

``--ab REF`` runs every cell against this tree's server (A) and REF's (B, a temporary
worktree, its hot path compiled in place), interleaved, and reports medians and B/A for e2e
msgs/s and msgs per server CPU-second (the figure the team's A/B checks read).

    python -m benchmarks.matrix --quick                            # < 1 minute
    python -m benchmarks.matrix --ab 267452d --sweeps base,batch --no-latency
    python -m benchmarks.matrix --quick --ab :pure                 # compiled vs source
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.harness.ab import Side, ab_report, rounds, sides
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
    pct,
    table,
)
from benchmarks.harness.server import servers
from benchmarks.latency import FRACTIONS, http_run, peak, point_table

QUEUES = 8
BODY_BYTES = 100
PRODUCERS = 4


@dataclass(frozen=True)
class Cell:
    """A fresh topic and group (``order_by: key``) that 4 closed-loop producers fill while N
    pullers drain it; ``batch`` is both the produce batch and the pull ``max_messages``."""

    sweep: str
    keys: int
    batch: int
    pullers: int
    queues: int = QUEUES
    body_bytes: int = BODY_BYTES
    messages: int = 0
    #: Every message has an id (the server then dedups produce calls by it): "random" or
    #: "ordered" (``harness.load.message``); "": none.
    ids: str = ""

    @property
    def name(self) -> str:
        suffix = {"": "", "random": "-ids", "ordered": "-ids-ordered"}[self.ids]
        return f"k{self.keys}-b{self.batch}-p{self.pullers}{suffix}"


async def run_cell(side: Side, cell: Cell, tag: str) -> dict[str, Any]:
    """One measurement of ``cell`` against ``side``'s server; the group is deleted after."""
    topic, group = f"m-{cell.name}-{tag}", f"m-{cell.name}-{tag}-g"
    n = cell.messages
    await create_topic(side.admin, topic, cell.queues)
    await put_group(side.admin, group, topic, "key")
    batches = make_batches(n, cell.batch, cell.keys, cell.body_bytes, cell.ids)
    try:
        with Probe(side.pid) as p:
            t0 = time.perf_counter()
            consumer = asyncio.create_task(
                consume(
                    side.url, group, n, cell.pullers, cell.batch, wait_ms=1000, stop_parked=True
                )
            )
            produce_s = await produce(
                side.url, topic, batches, PRODUCERS, key_stride(cell.batch, cell.keys)
            )
            stats = await consumer
            elapsed = stats.done_at - t0
    finally:
        await delete_group(side.admin, group)
    return {
        "cell": asdict(cell),
        "messages": n,
        "seconds": round(elapsed, 3),
        "msgs_per_s": round(n / elapsed),
        "mb_per_s": round(n * cell.body_bytes / elapsed / 1e6, 2),
        "produce_only_msgs_per_s": round(n / produce_s),
        "server_cpu_us_per_msg": round(p.server_cpu / n * 1e6, 1),
        "msgs_per_server_cpu_s": round(n / max(p.server_cpu, 1e-9)),
        # Over the measured span: the pullers' last long polls after it cost ~no CPU.
        "server_core_share": round(p.server_cpu / elapsed, 2),
        "client_core_share": round(p.client_cpu / elapsed, 2),
        "pulls": stats.pulls,
        "empty_pulls": stats.empty_pulls,
        "order_violations": stats.order_violations,
        "load_1m": load_average(),
    }


def describe(r: dict[str, Any]) -> str:
    """One progress line for a cell result."""
    return (
        f"{r['msgs_per_s']:7,} msgs/s {r['mb_per_s']:6.1f} MB/s "
        f"{r['server_cpu_us_per_msg']:6.1f} µs/msg server ({r['server_core_share']:.0%} core) "
        f"load {r['load_1m']}"
    )


AB_METRICS = (("e2e msgs/s", "msgs_per_s"), ("msgs per server CPU-s", "msgs_per_server_cpu_s"))


def cells(quick: bool, messages: int, sweeps: str | None = None) -> list[Cell]:
    """The cells (a quarter of the messages at batch 10, and in the full mode at least one
    message per key); ``sweeps`` (comma-separated: base, keys, batch, pullers, ids) keeps
    those."""

    def cell(sweep: str, keys: int, batch: int, pullers: int, ids: str = "") -> Cell:
        n = messages if batch >= 100 else messages // 4
        return Cell(sweep, keys, batch, pullers, messages=n if quick else max(n, keys), ids=ids)

    every = [cell("base", 10_000, 100, 4)]
    every += [cell("ids", 10_000, 100, 4, ids=kind) for kind in ("random", "ordered")]
    every += [cell("keys", k, 100, 4) for k in ((100_000,) if quick else (1_000, 100_000))]
    every += [cell("batch", 10_000, b, 4) for b in (10, 500)]
    every += [cell("pullers", 10_000, 100, p) for p in ((1, 16) if quick else (1, 2, 8, 16))]
    return [c for c in every if sweeps is None or c.sweep in sweeps.split(",")]


async def latency_runs(side: Side, args: Any) -> dict[str, Any]:
    top = await peak(side.url, side.admin, args.peak_messages, side.label)
    rates = args.latency_rates or [top * f for f in FRACTIONS]
    points: dict[str, list[dict[str, Any]]] = {}
    for i, rate in enumerate(rates):
        r = await http_run(side.url, side.pid, side.admin, rate, args.latency_seconds,
                           f"{side.label}-{i}")  # fmt: skip
        points[f"{rate / top:.0%}"] = [r]
    return {"peak_msgs_per_s": round(top), "points": {f"server {side.label}": points}}


async def run(args: Any, the_servers: Any) -> dict[str, Any]:
    the_cells = cells(args.quick, args.messages, args.sweeps)
    out: dict[str, Any] = {"commits": {s.source.label: s.source.commit for s in the_servers}}
    async with sides(the_servers) as the_sides:
        out["cells"] = await rounds(
            the_sides, the_cells, args.repeat, lambda c: c.name, run_cell, describe
        )
        if not args.no_latency:
            out["latency"] = {s.label: await latency_runs(s, args) for s in the_sides}
    return out


def cell_table(out: dict[str, Any], the_cells: list[Cell], label: str) -> str:
    def s(c: Cell, key: str) -> float:
        return median([r[key] for r in out["cells"][label][c.name]])

    def spread(c: Cell) -> str:
        rates = [r["msgs_per_s"] for r in out["cells"][label][c.name]]
        return f"{min(rates):,}-{max(rates):,}"

    return table(
        [
            ("sweep", lambda c: c.sweep + (f" ({c.ids})" if c.ids else "")),
            ("keys", lambda c: c.keys),
            ("batch", lambda c: c.batch),
            ("pullers", lambda c: c.pullers),
            ("msgs/cell", lambda c: c.messages),
            ("e2e msgs/s", lambda c: f"{s(c, 'msgs_per_s'):,.0f}"),
            ("range", spread),
            ("server µs CPU/msg", lambda c: f"{s(c, 'server_cpu_us_per_msg'):.0f}"),
            ("msgs per server CPU-s", lambda c: f"{s(c, 'msgs_per_server_cpu_s'):,.0f}"),
            ("server core use", lambda c: pct(s(c, "server_core_share"))),
            ("client core use", lambda c: pct(s(c, "client_core_share"))),
        ],
        the_cells,
    )


def report(out: dict[str, Any], args: Any) -> str:
    the_cells = cells(args.quick, args.messages, args.sweeps)
    commits = out["commits"]
    violations = sum(
        r["order_violations"] for side in out["cells"].values() for rs in side.values() for r in rs
    )
    text = [f"## End-to-end matrix (A = commit {commits['A']}, {args.repeat} rounds, medians)", ""]
    if "B" in commits:
        names = [c.name for c in the_cells]
        text += ["### A/B", "", ab_report(out["cells"], names, AB_METRICS, commits), ""]
    for label in out["cells"]:
        text += [f"### Cells, server {label} ({commits[label]})", ""]
        text += [cell_table(out, the_cells, label), ""]
    text += [f"Per-key order violations seen by the pullers: {violations}"]
    for label, lat in out.get("latency", {}).items():
        text += [
            "",
            f"### Send-to-delivery latency, server {label} (peak {lat['peak_msgs_per_s']:,} "
            "msgs/s closed loop; `benchmarks.latency`'s setup)",
            "",
            point_table(lat["points"]),
        ]
    return "\n".join(text)


def main() -> None:
    parser = arg_parser(__doc__, "7 cells, 1 round, 2 s latency runs (< 1 minute)", ab=True)
    parser.add_argument("--messages", type=int, help="messages per cell at batch >= 100")
    parser.add_argument("--repeat", type=int, help="rounds (default 3; 1 with --quick)")
    parser.add_argument("--latency-seconds", type=float, help="per latency run (default 20)")
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument(
        "--latency-rates",
        metavar="R1,R2,...",
        type=lambda text: [float(r) for r in text.split(",")],
        help="latency runs at these msgs/s instead of 25/50/90 %% of each server's own peak",
    )
    parser.add_argument(
        "--sweeps", help="only these sweeps' cells, comma-separated (base,keys,batch,pullers,ids)"
    )
    args = parser.parse_args()
    args.messages = args.messages or (4_000 if args.quick else 40_000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.latency_seconds = args.latency_seconds or (2.0 if args.quick else 20.0)
    # Long enough to be a sustained rate: over half a second the peak reads high.
    args.peak_messages = 10_000 if args.quick else 150_000
    facts = machine_facts()
    with servers("cproxy-matrix-", args.ab) as the_servers:
        out = run_loop(lambda: run(args, the_servers))
    out["machine"] = facts
    finish(out, args, "matrix", report(out, args))


if __name__ == "__main__":
    main()
