"""Scaling shape: how cproxy's cost per message grows with message size, keys and queues,
with the raw SQLite store's rate for the same messages measured in the same run.

One ``cproxy serve`` subprocess; each cell is a fresh topic and group (order_by key) drained
by 4 pullers while 4 closed-loop producers fill it (as in ``matrix.py``: rate = messages /
first produce -> last delivery; ``batch`` is the produce batch and the pull max_messages).

- size sweep    100 B, 1 KB, 10 KB, 100 KB bodies (10k keys, 8 queues; batch 100, and
                fewer per call for big bodies so a call stays under 4 MiB)
- keys sweep    100, 1k, 10k, 100k keys (100 B, 8 queues, batch 100)
- queues sweep  1, 8, 64, 256 queues (100 B, 10k keys, batch 100)

For every size the raw store limit (``store_raw``: append, then sequential read, in this
process) is measured for the same batch and body size; limit = 1 / (1/append + 1/read).
Rounds are interleaved; medians are reported.

    .venv/bin/python -m benchmarks.scaling --quick            # < 1 minute
    .venv/bin/python -m benchmarks.scaling --json scaling.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import store_raw
from benchmarks._common import machine_facts, markdown_table
from benchmarks._load import ServerProcess, git_commit, load_average, median, run_with_server
from benchmarks.matrix import Cell, run_cell

SIZES = (100, 1_000, 10_000, 100_000)
MAX_CALL_BYTES = 4 * 2**20


def batch_for(size: int) -> int:
    return max(1, min(100, MAX_CALL_BYTES // (size + 200)))


FULL_MESSAGES = {100: 30_000, 1_000: 20_000, 10_000: 3_000, 100_000: 400}
QUICK_MESSAGES = {100: 3_000, 1_000: 2_000, 10_000: 400, 100_000: 60}


def messages_for(size: int, quick: bool) -> int:
    """Messages per size cell: 3-40 MB of bodies in the full mode."""
    return (QUICK_MESSAGES if quick else FULL_MESSAGES)[size]


def cells(quick: bool) -> list[Cell]:
    out = [Cell("size", 10_000, batch_for(s), 4, 8, s) for s in SIZES]
    keys = (100, 1_000, 10_000, 100_000) if not quick else (100, 100_000)
    out += [Cell("keys", k, 100, 4) for k in keys if k != 10_000]
    queues = (1, 8, 64, 256) if not quick else (1, 256)
    out += [Cell("queues", 10_000, 100, 4, q) for q in queues if q != 8]
    return out


def cell_messages(cell: Cell, quick: bool) -> int:
    if cell.sweep == "size":
        return messages_for(cell.body_bytes, quick)
    n = 4_000 if quick else 30_000
    return n if quick else max(n, cell.keys)


async def limits(quick: bool) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="cproxy-raw-") as tmp:
        for size in SIZES:
            n = max(200, messages_for(size, quick) // 2)
            append, read = await store_raw.run_case(
                store_raw.Case(batch_for(size), size), n, 8, 1000, Path(tmp), "normal"
            )
            out[size] = {
                "messages": n,
                "append_msgs_per_s": round(append.wall),
                "read_msgs_per_s": round(read.wall),
                "limit_msgs_per_s": round(1 / (1 / append.wall + 1 / read.wall)),
                "cpu_us_per_msg": round(1e6 / append.cpu + 1e6 / read.cpu, 1),
            }
            print(f"raw store {size} B: {out[size]}", file=sys.stderr, flush=True)
    return out


async def run(args: argparse.Namespace, server: ServerProcess) -> dict[str, Any]:
    out: dict[str, Any] = {"load_1m_at_start": load_average()}
    out["store_limit"] = await limits(args.quick)
    the_cells = cells(args.quick)
    results: dict[str, list[dict[str, Any]]] = {c.name: [] for c in the_cells}
    async with httpx.AsyncClient(base_url=server.url, timeout=300) as admin:
        for rnd in range(args.repeat):
            order = the_cells[rnd % len(the_cells) :] + the_cells[: rnd % len(the_cells)]
            for cell in order:
                n = cell_messages(cell, args.quick)
                r = await run_cell(server.url, admin, server.pid, cell, n, f"s{rnd}")
                results[cell.name].append(r)
                print(
                    f"round {rnd + 1} {cell.name:24s} {r['msgs_per_s']:7,} msgs/s "
                    f"{r['mb_per_s']:6.1f} MB/s {r['server_cpu_us_per_msg']:7.1f} µs/msg "
                    f"({r['server_core_share']:.0%} core) load {r['load_1m']}",
                    file=sys.stderr,
                    flush=True,
                )
    out["cells"] = results
    out["load_1m_at_end"] = load_average()
    return out


def report(out: dict[str, Any], quick: bool) -> str:
    rows = []
    for cell in cells(quick):
        runs = out["cells"][cell.name]
        rate = median([r["msgs_per_s"] for r in runs])
        cpu = median([r["server_cpu_us_per_msg"] for r in runs])
        lim = out["store_limit"].get(cell.body_bytes) if cell.sweep == "size" else None
        rows.append(
            (
                cell.sweep,
                f"{cell.body_bytes:,} B",
                f"{cell.keys:,}",
                cell.queues,
                cell.batch,
                f"{runs[0]['messages']:,}",
                f"{rate:,.0f}",
                f"{median([r['mb_per_s'] for r in runs]):.1f}",
                f"{cpu:.0f}",
                f"{median([r['server_core_share'] for r in runs]):.0%}",
                f"{lim['limit_msgs_per_s']:,}" if lim else "",
                f"{rate / lim['limit_msgs_per_s']:.1%}" if lim else "",
                f"{lim['cpu_us_per_msg'] / cpu:.0%}" if lim else "",
            )
        )
    lim_rows = [
        (
            f"{size:,} B",
            batch_for(size),
            f"{v['append_msgs_per_s']:,}",
            f"{v['read_msgs_per_s']:,}",
            f"{v['limit_msgs_per_s']:,}",
            f"{v['limit_msgs_per_s'] * size / 1e6:.1f}",
            v["cpu_us_per_msg"],
        )
        for size, v in out["store_limit"].items()
    ]
    return "\n".join(
        [
            f"## Scaling shape (commit {out['commit']}, {out['repeat']} rounds, medians)",
            "",
            markdown_table(
                [
                    "sweep",
                    "body",
                    "keys",
                    "queues",
                    "batch",
                    "msgs/cell",
                    "e2e msgs/s",
                    "MB/s",
                    "server µs CPU/msg",
                    "server core use",
                    "store limit msgs/s",
                    "e2e / limit",
                    "store share of server CPU",
                ],
                rows,
            ),
            "",
            "### Raw store (same process)",
            "",
            markdown_table(
                [
                    "body",
                    "batch",
                    "append msgs/s",
                    "read msgs/s",
                    "limit msgs/s",
                    "limit MB/s",
                    "store µs CPU/msg",
                ],
                lim_rows,
            ),
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer points and messages")
    parser.add_argument("--repeat", type=int, help="rounds (default 2; 1 with --quick)")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)
    args.repeat = args.repeat or (1 if args.quick else 2)
    facts = machine_facts()
    started = time.perf_counter()
    out = run_with_server("cproxy-scaling-", lambda server: run(args, server))
    out["repeat"] = args.repeat
    out["commit"] = git_commit()
    out["machine"] = facts
    out["command"] = " ".join(["python -m benchmarks.scaling", *(argv or sys.argv[1:])])
    out["total_seconds"] = round(time.perf_counter() - started, 1)
    print(report(out, args.quick))
    print(
        f"\n(total {out['total_seconds']} s, load {out['load_1m_at_start']} -> "
        f"{out['load_1m_at_end']}, {facts.get('cpu')}, {facts.get('logical_cores')} cores)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
