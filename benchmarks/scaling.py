"""Scaling shape: how cproxy's cost per message grows with message size, keys and queues,
with the raw SQLite store's rate for the same messages measured in the same run.

Cells as in ``matrix`` (``harness.cells``: fresh topic and group, 4 producers and 4 pullers
at once, rate = messages / first produce -> last delivery):

- size sweep    100 B, 1 KB, 10 KB, 100 KB bodies (10k keys, 8 queues; batch 100, fewer
                per call for big bodies so a call stays under 4 MiB)
- keys sweep    100, 1k, 10k, 100k keys (100 B, 8 queues, batch 100)
- queues sweep  1, 8, 64, 256 queues (100 B, 10k keys, batch 100)

For every size the raw store limit (1 / (1/append + 1/read), this process) is measured for
the same batch and body size. Rounds are interleaved; medians. ``--ab REF``: as in matrix.

    python -m benchmarks.scaling --quick               # < 1 minute
    python -m benchmarks.scaling --json scaling.json   # full (about 70 s)
"""

from __future__ import annotations

from typing import Any

from benchmarks.harness.ab import ab_report, rounds, sides
from benchmarks.harness.cells import AB_METRICS, Cell, describe, run_cell
from benchmarks.harness.load import run_loop
from benchmarks.harness.report import (
    arg_parser,
    finish,
    machine_facts,
    median,
    pct,
    progress,
    table,
)
from benchmarks.harness.server import servers
from benchmarks.harness.store import store_limit

SIZES = (100, 1_000, 10_000, 100_000)
MAX_CALL_BYTES = 4 * 2**20
FULL_MESSAGES = {100: 30_000, 1_000: 20_000, 10_000: 3_000, 100_000: 400}
QUICK_MESSAGES = {100: 3_000, 1_000: 2_000, 10_000: 400, 100_000: 60}


def batch_for(size: int) -> int:
    return max(1, min(100, MAX_CALL_BYTES // (size + 200)))


def cells(quick: bool) -> list[Cell]:
    sized = QUICK_MESSAGES if quick else FULL_MESSAGES
    n = 4_000 if quick else 30_000
    out = [Cell("size", 10_000, batch_for(s), 4, 8, s, sized[s]) for s in SIZES]
    keys = (100, 100_000) if quick else (100, 1_000, 100_000)
    out += [Cell("keys", k, 100, 4, messages=n if quick else max(n, k)) for k in keys]
    queues = (1, 256) if quick else (1, 64, 256)
    return out + [Cell("queues", 10_000, 100, 4, q, messages=n) for q in queues]


async def run(args: Any, the_servers: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"commits": {s.source.label: s.source.commit for s in the_servers}}
    sized = QUICK_MESSAGES if args.quick else FULL_MESSAGES
    out["store_limit"] = {}
    for size in SIZES:
        n = max(200, sized[size] // 2)
        out["store_limit"][str(size)] = await store_limit(batch_for(size), size, n)
        progress(f"raw store {size} B: {out['store_limit'][str(size)]}")
    async with sides(the_servers) as the_sides:
        out["cells"] = await rounds(
            the_sides, cells(args.quick), args.repeat, lambda c: c.name, run_cell, describe
        )
    return out


def cell_table(out: dict[str, Any], the_cells: list[Cell], label: str) -> str:
    def s(c: Cell, key: str) -> float:
        return median([r[key] for r in out["cells"][label][c.name]])

    def lim(c: Cell, key: str) -> Any:
        return out["store_limit"][str(c.body_bytes)][key] if c.sweep == "size" else None

    def vs_limit(c: Cell) -> str:
        limit = lim(c, "limit_msgs_per_s")
        return f"{s(c, 'msgs_per_s') / limit:.1%}" if limit else ""

    def store_share(c: Cell) -> str:
        cpu = lim(c, "cpu_us_per_msg")
        return pct(cpu / s(c, "server_cpu_us_per_msg")) if cpu else ""

    return table(
        [
            ("sweep", lambda c: c.sweep),
            ("body", lambda c: f"{c.body_bytes:,} B"),
            ("keys", lambda c: c.keys),
            ("queues", lambda c: c.queues),
            ("batch", lambda c: c.batch),
            ("msgs/cell", lambda c: c.messages),
            ("e2e msgs/s", lambda c: f"{s(c, 'msgs_per_s'):,.0f}"),
            ("MB/s", lambda c: f"{s(c, 'mb_per_s'):.1f}"),
            ("server µs CPU/msg", lambda c: f"{s(c, 'server_cpu_us_per_msg'):.0f}"),
            ("server core use", lambda c: pct(s(c, "server_core_share"))),
            ("store limit msgs/s", lambda c: lim(c, "limit_msgs_per_s") or ""),
            ("e2e / limit", vs_limit),
            ("store share of server CPU", store_share),
        ],
        the_cells,
    )


def report(out: dict[str, Any], args: Any) -> str:
    the_cells, commits = cells(args.quick), out["commits"]
    text = [f"## Scaling shape (A = commit {commits['A']}, {args.repeat} rounds, medians)", ""]
    if "B" in commits:
        names = [c.name for c in the_cells]
        text += ["### A/B", "", ab_report(out["cells"], names, AB_METRICS, commits), ""]
    for label in out["cells"]:
        text += [f"### Cells, server {label} ({commits[label]})", ""]
        text += [cell_table(out, the_cells, label), ""]
    limits = out["store_limit"]
    text += ["### Raw store (this process)", ""]
    text.append(
        table(
            [
                ("body", lambda z: f"{int(z):,} B"),
                ("batch", lambda z: batch_for(int(z))),
                ("append msgs/s", lambda z: limits[z]["append_msgs_per_s"]),
                ("read msgs/s", lambda z: limits[z]["read_msgs_per_s"]),
                ("limit msgs/s", lambda z: limits[z]["limit_msgs_per_s"]),
                ("limit MB/s", lambda z: f"{limits[z]['limit_msgs_per_s'] * int(z) / 1e6:.1f}"),
                ("store µs CPU/msg", lambda z: limits[z]["cpu_us_per_msg"]),
            ],
            list(limits),
        )
    )
    return "\n".join(text)


def main() -> None:
    parser = arg_parser(__doc__, "fewer points and messages, 1 round (< 1 minute)", ab=True)
    parser.add_argument("--repeat", type=int, help="rounds (default 2; 1 with --quick)")
    args = parser.parse_args()
    args.repeat = args.repeat or (1 if args.quick else 2)
    facts = machine_facts()
    with servers("cproxy-scaling-", args.ab) as the_servers:
        out = run_loop(lambda: run(args, the_servers))
    out["machine"] = facts
    finish(out, args, "scaling", report(out, args))


if __name__ == "__main__":
    main()
