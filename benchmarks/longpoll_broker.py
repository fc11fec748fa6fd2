"""Long polls in the broker alone: N waiting pulls on one group, a trickle of produces, no HTTP.

``benchmarks.longpoll`` measures the whole server; on a loaded machine its figures are
dominated by HTTP request handling (every long poll that expires is a request). This script
isolates what the broker does with waiting pulls: one process, ``Broker`` over the memory
store on uvloop, N tasks long-polling one group (``max_messages`` 1, acks on the next pull),
then ``--rate`` single-message produces per second (each a new key) for ``--seconds``:

- *send→deliver*: ``produce()`` called -> the pull that carries the message returned
  (produces run on schedule for ``--seconds`` at most: a broker that cannot keep up
  produces fewer: the table shows delivered/produced);
- *CPU µs per message*: process CPU during the trickle / messages;
- *idle CPU*: process CPU share while N pulls wait and nothing is produced (``--wait-ms``
  bounds each wait, so this includes expiring and re-entering waits).

``--ab REF`` runs the same measurement with the broker of REF (the script runs in a child
process with REF's tree first on ``PYTHONPATH``), alternating A and B per cell.

    python -m benchmarks.longpoll_broker --quick
    python -m benchmarks.longpoll_broker --ab 6c6c186 --pullers 1000 5000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


async def measure(pullers: int, rate: float, seconds: float, wait_ms: int) -> dict[str, Any]:
    """One cell in this process, with whichever ``cproxy`` is first on the path."""
    import anyio
    import orjson

    from cproxy.broker.broker import Broker
    from cproxy.config import Settings
    from cproxy.engine.group_config import GroupConfig
    from cproxy.engine.records import Result
    from cproxy.model import NewMessage
    from cproxy.store.memory import MemoryStore

    broker = Broker(MemoryStore(), Settings())
    latencies: list[float] = []
    waiting = 0
    changed = [anyio.Event()]  # replaced each time it fires

    def note() -> None:
        event, changed[0] = changed[0], anyio.Event()
        event.set()

    async def until(done: Any) -> None:
        while not done():
            await changed[0].wait()

    async with anyio.create_task_group() as tg:
        await broker.start(tg)
        await broker.create_topic("t", 8)
        await broker.put_group("g", GroupConfig.from_dict({"topics": {"t": {"order_by": "key"}}}))

        async def poll() -> None:
            nonlocal waiting
            results: list[Any] = []
            while True:
                waiting += 1
                note()
                answer = await broker.pull("g", 1, wait_ms, None, results)
                waiting -= 1
                now = time.monotonic() * 1000
                results = []
                for d in answer.deliveries:
                    latencies.append(now - orjson.loads(d.message.body_json)["t"])
                    results.append(Result(d.message.topic, d.message.qid, acks=[d.message.offset]))
                note()

        for _ in range(pullers):
            tg.start_soon(poll)
        with anyio.fail_after(60):
            await until(lambda: waiting >= pullers)
        idle_s = min(5.0, seconds)
        c0, w0 = time.process_time(), time.monotonic()
        await anyio.sleep(idle_s)
        idle_share = (time.process_time() - c0) / (time.monotonic() - w0)
        # Open loop on a schedule, for ``seconds`` of wall time at most: a broker that cannot
        # keep up produces fewer (``produced`` says how many).
        total = 0
        c0, started = time.process_time(), time.monotonic()
        for i in range(int(rate * seconds)):
            delay = started + i / rate - time.monotonic()
            if delay > 0:
                await anyio.sleep(delay)
            elif time.monotonic() > started + seconds:
                break
            body = orjson.dumps({"t": time.monotonic() * 1000})
            await broker.produce("t", [NewMessage(f"k{i}", body)])
            total += 1
        with anyio.move_on_after(30):
            await until(lambda: len(latencies) >= total)
        cpu = time.process_time() - c0
        wall = time.monotonic() - started
        tg.cancel_scope.cancel()
    lat = sorted(latencies)

    def pick(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")

    return {
        "pullers": pullers,
        "produced": total,
        "delivered": len(lat),
        "p50_ms": round(pick(0.5), 2),
        "p99_ms": round(pick(0.99), 2),
        "max_ms": round(lat[-1], 1) if lat else float("nan"),
        "cpu_us_per_msg": round(cpu / max(1, total) * 1e6),
        "trickle_core_share": round(cpu / wall, 3),
        "idle_core_share": round(idle_share, 4),
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def _child(spec: str) -> None:
    args = json.loads(spec)
    try:
        import uvloop

        out = uvloop.run(measure(**args))
    except ImportError:
        out = asyncio.run(measure(**args))
    print(json.dumps(out))


def _run_side(tree: Path, cell: dict[str, Any]) -> dict[str, Any]:
    path = os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(cell)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="500 pullers, 3 s")
    parser.add_argument("--ab", metavar="REF", help="also the broker of git REF (B)")
    parser.add_argument("--pullers", type=int, nargs="+", help="cells (default 1000 5000)")
    parser.add_argument("--rate", type=float, default=100.0, help="msgs/s (100)")
    parser.add_argument("--seconds", type=float, help="trickle length (10; 3 with --quick)")
    parser.add_argument("--wait-ms", type=int, default=20_000, help="pull wait_ms (20000)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds (1)")
    args = parser.parse_args()
    if args.child:
        _child(args.child)
        return
    from benchmarks.harness.report import median, progress, table
    from benchmarks.harness.server import this_tree, tree_at

    pullers = args.pullers or ([500] if args.quick else [1000, 5000])
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    with contextlib.ExitStack() as stack:
        sources = [this_tree()]
        if args.ab:
            sources.append(stack.enter_context(tree_at(args.ab)))
        results: dict[str, dict[int, list[dict[str, Any]]]] = {
            s.label: {n: [] for n in pullers} for s in sources
        }
        for rnd in range(args.repeat):
            for i, n in enumerate(pullers):
                order = sources if (rnd + i) % 2 == 0 else list(reversed(sources))
                for source in order:
                    cell = {"pullers": n, "rate": args.rate, "seconds": seconds}
                    r = _run_side(source.tree, {**cell, "wait_ms": args.wait_ms})
                    results[source.label][n].append(r)
                    progress(f"round {rnd + 1} {source.label} {n}: {r}")
    rows = [(label, n) for label in results for n in pullers]

    def m(row: tuple[str, int], key: str) -> float:
        return median([r[key] for r in results[row[0]][row[1]]])

    commits = {s.label: s.commit for s in sources}
    print(
        f"## Long polls in the broker alone ({args.rate:g} msgs/s for {seconds:g} s, "
        f"wait_ms {args.wait_ms}, {args.repeat} round(s), medians)\n"
    )
    print(
        table(
            [
                ("side", lambda r: f"{r[0]} ({commits[r[0]]})"),
                ("pullers", lambda r: r[1]),
                ("delivered", lambda r: f"{m(r, 'delivered'):.0f}/{m(r, 'produced'):.0f}"),
                ("send→deliver p50 ms", lambda r: f"{m(r, 'p50_ms'):.2f}"),
                ("p99 ms", lambda r: f"{m(r, 'p99_ms'):.2f}"),
                ("max ms", lambda r: f"{m(r, 'max_ms'):.1f}"),
                ("CPU µs/msg", lambda r: f"{m(r, 'cpu_us_per_msg'):,.0f}"),
                ("core share, trickle", lambda r: f"{100 * m(r, 'trickle_core_share'):.1f}%"),
                ("core share, idle", lambda r: f"{100 * m(r, 'idle_core_share'):.2f}%"),
                ("max RSS MiB", lambda r: f"{m(r, 'max_rss_mib'):.0f}"),
            ],
            rows,
        )
    )
    ratios = ""
    if "B" in results:
        parts = []
        for n in pullers:
            a, b = m(("A", n), "p99_ms"), m(("B", n), "p99_ms")
            parts.append(f"{n}: {b / a:.0f}x" if a else f"{n}: n/a")
        ratios = "; B/A send→deliver p99 " + ", ".join(parts)
    command = " ".join(["python -m benchmarks.longpoll_broker", *sys.argv[1:]])
    print(f"\n(`{command}`: load {os.getloadavg()[0]:.1f}{ratios})")


if __name__ == "__main__":
    main()
