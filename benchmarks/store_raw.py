"""Raw SQLite store throughput: the ceiling the end-to-end numbers are compared against.

*One appender*: pre-built batches appended from one coroutine (only the store is measured,
not request parsing), then every queue read back sequentially; a fresh database per case.
Rates per wall-clock second and per CPU second of this process (all threads): on a shared
machine the second one is the steadier measure of what the store costs.

*A/B* (``--ab REF``): the one-appender cases at batch 10, 100 and 500, each run in a fresh
subprocess with the store code of this tree (A) and of git REF (B, a temporary worktree), in
alternating order, ``--repeat`` rounds; medians and the ratio A/B (how many times faster this
tree is). The load code is this tree's on both sides (``harness.store.measure_in``).

*Concurrent*: several coroutines append at once (as concurrent produce calls do), each case
with group commit off (one thread hop and one transaction per call) and on (calls queued
while the writer is busy share one hop and one transaction); interleaved runs, medians.

    python -m benchmarks.store_raw               # 200k messages per case
    python -m benchmarks.store_raw --quick       # 20k messages per case
    python -m benchmarks.store_raw --table concurrent --appenders 8 --repeat 3
    python -m benchmarks.store_raw --ab 6c6c186 --table one   # batches vs the row format
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness.report import (
    arg_parser,
    finish,
    machine_facts,
    median,
    progress,
    table,
)
from benchmarks.harness.server import Source, this_tree, tree_at
from benchmarks.harness.store import (
    Case,
    Meter,
    append_and_read,
    limit_of,
    measure_in,
    store_batches,
)
from cproxy.model import NewMessage
from cproxy.store.sqlite import SqliteStore

CASES = (
    Case(100, 100),
    Case(500, 100),
    Case(100, 1024),
    Case(500, 1024),
    Case(500, 100, with_ids=True),
)
CONCURRENT_CASES = (Case(10, 100), Case(100, 100), Case(10, 100, with_ids=True))
AB_CASES = (
    Case(10, 100),
    Case(100, 100),
    Case(500, 100),
    Case(100, 1024),
    Case(100, 100, with_ids=True),
)
AB_FIELDS = ("append_msgs_per_s", "read_msgs_per_s", "limit_msgs_per_s", "cpu_us_per_msg")


def run_ab(args: Any, total: int, sources: list[Source]) -> list[dict[str, Any]]:
    """Every ``AB_CASES`` case on every side, ``args.repeat`` rounds, alternating the order."""
    runs: dict[tuple[int, str], list[dict[str, float]]] = {}
    for rnd in range(args.repeat):
        for n, case in enumerate(AB_CASES):
            order = sources if (rnd + n) % 2 == 0 else list(reversed(sources))
            for side in order:
                append, read = measure_in(
                    side.tree, case, total, args.queues, args.read_batch, args.synchronous
                )
                r = limit_of(append, read)
                runs.setdefault((n, side.label), []).append(r)
                progress(f"round {rnd + 1} {side.label} {case}: {r}")
    rows = []
    for n, case in enumerate(AB_CASES):
        row: dict[str, Any] = {**asdict(case)}
        for side in sources:
            for f in AB_FIELDS:
                values = [r[f] for r in runs[n, side.label]]
                row[f"{f}_{side.label}"] = median(values)
                row[f"{f}_{side.label}_range"] = (min(values), max(values))
        rows.append(row)
    return rows


@dataclass(frozen=True)
class ConcurrentResult:
    msgs_per_s: float
    msgs_per_cpu_s: float
    calls_per_s: float
    writes_per_tx: float


async def run_concurrent(
    case: Case, args: Any, total: int, root: Path, group_commit: bool
) -> ConcurrentResult:
    # Each appender appends its own share one batch after another, so at most ``appenders``
    # calls wait at any moment, like that many HTTP clients.
    batches = store_batches(case, total, args.queues)
    shares = [batches[i :: args.appenders] for i in range(args.appenders)]
    store = SqliteStore(
        root / f"c-{time.monotonic_ns()}", synchronous=args.synchronous, group_commit=group_commit
    )
    await store.open()
    try:
        await store.create_topic("bench", args.queues)
        writer = store._db._tx  # white box: how many transactions the calls needed
        tx_before, writes_before = writer.transactions, writer.writes
        now_ms, window = int(time.time() * 1000), 60_000 if case.with_ids else 0

        async def appender(share: list[list[NewMessage]]) -> None:
            for batch in share:
                await store.append("bench", batch, now_ms, window)

        with Meter() as meter:
            await asyncio.gather(*(appender(share) for share in shares))
        stored = sum(q.next_offset for q in await store.queue_stats("bench"))
        if stored != total:
            raise RuntimeError(f"stored {stored}, expected {total}")
        tx, writes = writer.transactions - tx_before, writer.writes - writes_before
    finally:
        await store.close()
    rate = meter.rate(total)
    return ConcurrentResult(rate.wall, rate.cpu, len(batches) / meter.wall, writes / max(tx, 1))


async def run(args: Any, total: int, root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"messages_per_case": total, "one": [], "concurrent": []}
    if args.ab is not None:
        with tree_at(args.ab) as b:
            sources = [this_tree(), b]
            out["commits"] = {s.label: s.commit for s in sources}
            out["ab"] = run_ab(args, total, sources)
    elif args.table in ("all", "one"):
        for case in CASES:
            append, read = await append_and_read(
                case, total, args.queues, args.read_batch, root, args.synchronous
            )
            out["one"].append({**asdict(case), "append": asdict(append), "read": asdict(read)})
    if args.table in ("all", "concurrent"):
        for case in CONCURRENT_CASES:
            runs: dict[bool, list[ConcurrentResult]] = {False: [], True: []}
            for _ in range(args.repeat):  # interleaved: a noisy neighbour slows both alike
                for group_commit in (False, True):
                    r = await run_concurrent(case, args, total, root, group_commit)
                    runs[group_commit].append(r)
            row: dict[str, Any] = asdict(case)
            for mode, results in runs.items():
                for field in ConcurrentResult.__dataclass_fields__:
                    row[f"{field}_{'on' if mode else 'off'}"] = median(
                        [getattr(r, field) for r in results]
                    )
            out["concurrent"].append(row)
    return out


def report(out: dict[str, Any], args: Any) -> str:
    def ids(r: dict[str, Any]) -> str:
        return "yes" if r["with_ids"] else "no"

    def n(key: str, sub: str | None = None) -> Any:
        return lambda r: f"{(r[key][sub] if sub else r[key]):,.0f}"

    text = [f"## Raw SQLite store ({args.queues} queues, synchronous={args.synchronous})", ""]
    if "ab" in out:
        c = out["commits"]

        def ab(key: str, fmt: str = ",.0f") -> list[Any]:
            return [
                (f"{key} A", lambda r: f"{r[key + '_A']:{fmt}}"),
                (f"{key} B", lambda r: f"{r[key + '_B']:{fmt}}"),
                (f"{key} A/B", lambda r: f"{r[key + '_A'] / r[key + '_B']:.2f}"),
            ]

        text += [
            f"One appender, {out['messages_per_case']:,} messages per case, A = {c['A']}, "
            f"B = {c['B']}; median of {args.repeat} interleaved runs, each in a fresh process:",
            "",
            table(
                [
                    ("batch", lambda r: r["batch"]),
                    ("body", lambda r: f"{r['body_bytes']} B"),
                    ("ids (dedup)", ids),
                    *ab("append_msgs_per_s"),
                    *ab("read_msgs_per_s"),
                    *ab("limit_msgs_per_s"),
                    *ab("cpu_us_per_msg", ".1f"),
                ],
                out["ab"],
            ),
        ]
    if out["one"]:
        text += [
            f"One appender, {out['messages_per_case']:,} messages per case, read max_count="
            f"{args.read_batch}:",
            "",
            table(
                [
                    ("batch", lambda r: r["batch"]),
                    ("body", lambda r: f"{r['body_bytes']} B"),
                    ("ids (dedup)", ids),
                    ("append msgs/s", n("append", "wall")),
                    ("append msgs/CPU-s", n("append", "cpu")),
                    ("read msgs/s", n("read", "wall")),
                    ("read msgs/CPU-s", n("read", "cpu")),
                ],
                out["one"],
            ),
        ]
    if out["concurrent"]:
        text += [
            "",
            f"{args.appenders} concurrent appenders, 100 B bodies; group commit off vs on; "
            f"median of {args.repeat} interleaved runs each:",
            "",
            table(
                [
                    ("batch", lambda r: r["batch"]),
                    ("ids (dedup)", ids),
                    ("msgs/s off", n("msgs_per_s_off")),
                    ("msgs/s on", n("msgs_per_s_on")),
                    ("calls/s off", n("calls_per_s_off")),
                    ("calls/s on", n("calls_per_s_on")),
                    ("msgs/CPU-s off", n("msgs_per_cpu_s_off")),
                    ("msgs/CPU-s on", n("msgs_per_cpu_s_on")),
                    ("calls per tx on", lambda r: f"{r['writes_per_tx_on']:.1f}"),
                ],
                out["concurrent"],
            ),
        ]
    return "\n".join(text)


def main() -> None:
    parser = arg_parser(__doc__, "20k messages per case (~15 s)", ab=True)
    parser.add_argument("--messages", type=int, help="messages per case (default 200000)")
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--read-batch", type=int, default=1000, help="max_count per read")
    parser.add_argument("--synchronous", default="normal", choices=["normal", "full"])
    parser.add_argument("--data-dir", type=Path, help="where to put the databases (default: tmp)")
    parser.add_argument("--appenders", type=int, default=8, help="concurrent appenders")
    parser.add_argument("--repeat", type=int, default=3, help="runs per concurrent case")
    parser.add_argument("--table", choices=["all", "one", "concurrent"], default="all")
    args = parser.parse_args()
    total = args.messages or (20_000 if args.quick else 200_000)
    facts = machine_facts()
    with tempfile.TemporaryDirectory(dir=args.data_dir) as tmp:
        out = asyncio.run(run(args, total, Path(tmp)))
    out["machine"] = facts
    finish(out, args, "store_raw", report(out, args))


if __name__ == "__main__":
    main()
