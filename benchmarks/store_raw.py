"""Raw SQLite store throughput: the ceiling the end-to-end numbers are compared against.

Appends pre-built batches from one coroutine (so only the store is measured, not request
parsing), then reads every queue back sequentially. Each case uses a fresh database.
Rates are given per wall-clock second and per CPU second of this process (all threads): on a
shared machine the second one is the steadier measure of what the store itself costs.

    .venv/bin/python benchmarks/store_raw.py            # 200k messages per case
    .venv/bin/python benchmarks/store_raw.py --quick    # 20k messages per case
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sqlite3
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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20k messages per case")
    parser.add_argument("--messages", type=int, help="messages per case (default 200000)")
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--read-batch", type=int, default=1000, help="max_count per read")
    parser.add_argument("--synchronous", default="normal", choices=["normal", "full"])
    parser.add_argument("--data-dir", type=Path, help="where to put the databases (default: tmp)")
    args = parser.parse_args()
    total = args.messages or (20_000 if args.quick else 200_000)

    print(
        f"SQLite store, {total} messages per case, {args.queues} queues, "
        f"synchronous={args.synchronous}, read max_count={args.read_batch}; "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}\n"
    )
    print(
        "| batch | body | ids (dedup) | append msgs/s | append msgs/CPU-s "
        "| read msgs/s | read msgs/CPU-s |"
    )
    print(
        "|------:|-----:|:-----------:|--------------:|------------------:|------------:|----------------:|"
    )
    with tempfile.TemporaryDirectory(dir=args.data_dir) as tmp:
        for case in CASES:
            append, read = await run_case(
                case, total, args.queues, args.read_batch, Path(tmp), args.synchronous
            )
            print(
                f"| {case.batch} | {case.body_bytes} B | {'yes' if case.with_ids else 'no'} "
                f"| {append.wall:,.0f} | {append.cpu:,.0f} | {read.wall:,.0f} | {read.cpu:,.0f} |"
            )


if __name__ == "__main__":
    asyncio.run(main())
