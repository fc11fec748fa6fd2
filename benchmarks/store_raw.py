"""Raw SQLite store throughput: the ceiling the end-to-end numbers are compared against.

Appends pre-built batches from one coroutine (so only the store is measured, not request
parsing), then reads every queue back sequentially. Each case uses a fresh database.
Rates are given per wall-clock second and per CPU second of this process (all threads): on a
shared machine the second one is the steadier measure of what the store itself costs.

A second table has several coroutines appending at once (as concurrent produce calls do),
each case run with group commit off (one thread hop and one transaction per call, the old
path) and on (the calls queued while the writer is busy share one hop and one transaction).

    .venv/bin/python benchmarks/store_raw.py            # 200k messages per case
    .venv/bin/python benchmarks/store_raw.py --quick    # 20k messages per case
    .venv/bin/python benchmarks/store_raw.py --table concurrent --appenders 8 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sqlite3
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cproxy.model import NewMessage
from cproxy.store.sqlite import SqliteStore


@dataclass(frozen=True)
class Rate:
    wall: float
    cpu: float


class Meter:
    """Messages per wall-clock second and per process CPU second over a ``with`` block."""

    def __enter__(self) -> Meter:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._wall
        self.cpu = time.process_time() - self._cpu

    def rate(self, count: int) -> Rate:
        return Rate(count / self.wall, count / max(self.cpu, 1e-9))


@dataclass(frozen=True)
class Case:
    batch: int
    body_bytes: int
    with_ids: bool = False


CASES = (
    Case(100, 100),
    Case(500, 100),
    Case(100, 1024),
    Case(500, 1024),
    Case(500, 100, with_ids=True),
)


def make_batches(case: Case, total: int, queues: int) -> list[list[NewMessage]]:
    # A JSON string body padded to the requested size, as the HTTP layer would store it.
    body = b'{"p":"' + b"x" * max(case.body_bytes - 8, 0) + b'"}'
    messages = [
        NewMessage(
            qid=i % queues,
            key=f"key-{i % 1000}",
            body_json=body,
            id=f"msg-{i}" if case.with_ids else None,
        )
        for i in range(total)
    ]
    return [messages[i : i + case.batch] for i in range(0, total, case.batch)]


async def run_case(
    case: Case, total: int, queues: int, read_batch: int, root: Path, synchronous: str
) -> tuple[Rate, Rate]:
    batches = make_batches(case, total, queues)
    store = SqliteStore(
        root / f"b{case.batch}-s{case.body_bytes}-{case.with_ids}", synchronous=synchronous
    )
    await store.open()
    try:
        await store.create_topic("bench", queues)
        now_ms = int(time.time() * 1000)
        with Meter() as appending:
            for batch in batches:
                await store.append("bench", batch, now_ms, 60_000 if case.with_ids else 0)
        read = 0
        with Meter() as reading:
            for qid in range(queues):
                offset = 0
                while chunk := await store.read("bench", qid, offset, read_batch):
                    read += len(chunk)
                    offset = chunk[-1].offset + 1
        if read != total:
            raise SystemExit(f"read back {read} messages, expected {total}")
    finally:
        await store.close()
    return appending.rate(total), reading.rate(read)


@dataclass(frozen=True)
class Concurrent:
    batch: int
    body_bytes: int = 100
    with_ids: bool = False


CONCURRENT_CASES = (Concurrent(10), Concurrent(100), Concurrent(10, with_ids=True))


@dataclass(frozen=True)
class ConcurrentResult:
    msgs: Rate
    calls: Rate
    writes_per_tx: float


async def run_concurrent(
    case: Concurrent,
    total: int,
    appenders: int,
    queues: int,
    root: Path,
    synchronous: str,
    group_commit: bool,
    run: int,
) -> ConcurrentResult:
    # Each appender gets its own share of pre-built batches and appends them one after another,
    # so at most ``appenders`` calls are waiting at any moment, like that many HTTP clients.
    batches = make_batches(Case(case.batch, case.body_bytes, case.with_ids), total, queues)
    shares = [batches[i::appenders] for i in range(appenders)]
    name = f"c{appenders}-b{case.batch}-{case.with_ids}-{group_commit}-{run}"
    store = SqliteStore(root / name, synchronous=synchronous, group_commit=group_commit)
    await store.open()
    try:
        await store.create_topic("bench", queues)
        writer = store._db._writer  # white box: how many transactions the calls needed
        tx_before, writes_before = writer.transactions, writer.writes
        now_ms = int(time.time() * 1000)
        window = 60_000 if case.with_ids else 0

        async def appender(share: list[list[NewMessage]]) -> None:
            for batch in share:
                await store.append("bench", batch, now_ms, window)

        with Meter() as meter:
            await asyncio.gather(*(appender(share) for share in shares))
        stats = await store.queue_stats("bench")
        if sum(q.next_offset for q in stats) != total:
            raise SystemExit(f"stored {sum(q.next_offset for q in stats)}, expected {total}")
        tx, writes = writer.transactions - tx_before, writer.writes - writes_before
    finally:
        await store.close()
    return ConcurrentResult(meter.rate(total), meter.rate(len(batches)), writes / max(tx, 1))


def median(results: list[ConcurrentResult]) -> ConcurrentResult:
    def mid(values: list[float]) -> float:
        return statistics.median(values)

    return ConcurrentResult(
        Rate(mid([r.msgs.wall for r in results]), mid([r.msgs.cpu for r in results])),
        Rate(mid([r.calls.wall for r in results]), mid([r.calls.cpu for r in results])),
        mid([r.writes_per_tx for r in results]),
    )


async def concurrent_table(args: argparse.Namespace, total: int, root: Path) -> None:
    print(
        f"\n{args.appenders} concurrent appenders, {total} messages per case, 100 B bodies; "
        f"group commit off (the old path: one hop and one transaction per call) vs on; "
        f"median of {args.repeat} interleaved runs each\n"
    )
    print(
        "| batch | ids (dedup) | msgs/s off | msgs/s on | calls/s off | calls/s on "
        "| msgs/CPU-s off | msgs/CPU-s on | calls per tx on |"
    )
    print("|------:|:-:|--:|--:|--:|--:|--:|--:|--:|")
    for case in CONCURRENT_CASES:
        runs: dict[bool, list[ConcurrentResult]] = {False: [], True: []}
        # Interleaved, so that a noisy neighbour slows both modes alike.
        for run in range(args.repeat):
            for group in (False, True):
                runs[group].append(
                    await run_concurrent(
                        case,
                        total,
                        args.appenders,
                        args.queues,
                        root,
                        args.synchronous,
                        group,
                        run,
                    )
                )
        off, on = median(runs[False]), median(runs[True])
        print(
            f"| {case.batch} | {'yes' if case.with_ids else 'no'} "
            f"| {off.msgs.wall:,.0f} | {on.msgs.wall:,.0f} "
            f"| {off.calls.wall:,.0f} | {on.calls.wall:,.0f} "
            f"| {off.msgs.cpu:,.0f} | {on.msgs.cpu:,.0f} | {on.writes_per_tx:.1f} |"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20k messages per case")
    parser.add_argument("--messages", type=int, help="messages per case (default 200000)")
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--read-batch", type=int, default=1000, help="max_count per read")
    parser.add_argument("--synchronous", default="normal", choices=["normal", "full"])
    parser.add_argument("--data-dir", type=Path, help="where to put the databases (default: tmp)")
    parser.add_argument("--appenders", type=int, default=8, help="concurrent appenders")
    parser.add_argument("--repeat", type=int, default=3, help="runs per concurrent case")
    parser.add_argument(
        "--table", choices=["all", "one", "concurrent"], default="all", help="which tables"
    )
    args = parser.parse_args()
    total = args.messages or (20_000 if args.quick else 200_000)

    print(
        f"SQLite store, {args.queues} queues, synchronous={args.synchronous}, "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}"
    )
    with tempfile.TemporaryDirectory(dir=args.data_dir) as tmp:
        if args.table in ("all", "one"):
            await sequential_table(args, total, Path(tmp))
        if args.table in ("all", "concurrent"):
            await concurrent_table(args, total, Path(tmp))


async def sequential_table(args: argparse.Namespace, total: int, root: Path) -> None:
    print(f"\nOne appender, {total} messages per case, read max_count={args.read_batch}\n")
    print(
        "| batch | body | ids (dedup) | append msgs/s | append msgs/CPU-s "
        "| read msgs/s | read msgs/CPU-s |"
    )
    print(
        "|------:|-----:|:-----------:|--------------:|------------------:|------------:|----------------:|"
    )
    for case in CASES:
        append, read = await run_case(
            case, total, args.queues, args.read_batch, root, args.synchronous
        )
        print(
            f"| {case.batch} | {case.body_bytes} B | {'yes' if case.with_ids else 'no'} "
            f"| {append.wall:,.0f} | {append.cpu:,.0f} | {read.wall:,.0f} | {read.cpu:,.0f} |"
        )


if __name__ == "__main__":
    asyncio.run(main())
