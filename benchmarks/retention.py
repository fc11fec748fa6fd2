"""Disk use under steady produce, with and without retention (SQLite store).

Simulated time: each round is one second of ``--rate`` messages of ``--body-bytes`` on a
topic of 4 queues; with retention on, ``apply_retention`` runs every round (the server runs
it every ``retention_interval_ms``). After every ``--every`` rounds the database file and the
WAL are measured. With retention the database must stop growing once the first window is
full; without it, it grows with every round. Also reports the time the retention pass takes
(delete + incremental vacuum) per round, which is time the writer is shared with appends.

    python -m benchmarks.retention                 # 600 rounds of 500 x 1 KB, retention 60 s
    python -m benchmarks.retention --quick         # 120 rounds
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from cproxy.model import NewMessage
from cproxy.store.sqlite import SqliteStore

T0 = 1_700_000_000_000
MIB = 1024 * 1024


def sizes(store: SqliteStore) -> tuple[int, int]:
    wal = store.path.with_name(store.path.name + "-wal")
    return store.path.stat().st_size, (wal.stat().st_size if wal.exists() else 0)


async def run(
    rounds: int, rate: int, body_bytes: int, retention_ms: int | None, every: int
) -> list[tuple[int, int, int, float]]:
    """Rows of (round, db bytes, wal bytes, retention seconds in the last ``every`` rounds)."""
    out: list[tuple[int, int, int, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp))
        await store.open()
        await store.create_topic("t", 4, retention_ms=retention_ms)
        body = b'"' + b"x" * (body_bytes - 2) + b'"'
        spent = 0.0
        try:
            for second in range(1, rounds + 1):
                now = T0 + second * 1000
                for start in range(0, rate, 500):
                    batch = [
                        NewMessage(f"k{i}", body, qid=i % 4)
                        for i in range(start, min(rate, start + 500))
                    ]
                    await store.append("t", batch, now, 0)
                if retention_ms is not None:
                    started = time.perf_counter()
                    await store.apply_retention("t", now)
                    spent += time.perf_counter() - started
                if second % every == 0:
                    out.append((second, *sizes(store), spent))
                    spent = 0.0
        finally:
            await store.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--rate", type=int, default=500, help="messages per simulated second")
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--retention-ms", type=int, default=60_000)
    parser.add_argument("--every", type=int, default=60, help="rounds between measurements")
    parser.add_argument("--quick", action="store_true", help="120 rounds, measured every 20")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.every = 120, 20
    kept_mib = args.rate * args.body_bytes * args.retention_ms / 1000 / MIB
    print(
        f"{args.rate} msg/s of {args.body_bytes} B, 4 queues, retention {args.retention_ms} ms "
        f"(keeps ~{kept_mib:.1f} MiB of bodies)"
    )
    print(
        f"{'round':>6} {'db MiB (ret.)':>14} {'wal MiB':>8} {'retention ms/round':>19}"
        f" {'db MiB (none)':>14}"
    )
    with_retention = asyncio.run(
        run(args.rounds, args.rate, args.body_bytes, args.retention_ms, args.every)
    )
    without = asyncio.run(run(args.rounds, args.rate, args.body_bytes, None, args.every))
    for (second, db, wal, spent), (_, db_none, _, _) in zip(with_retention, without, strict=True):
        print(
            f"{second:>6} {db / MIB:>14.1f} {wal / MIB:>8.1f} {spent * 1000 / args.every:>19.2f}"
            f" {db_none / MIB:>14.1f}"
        )


if __name__ == "__main__":
    main()
