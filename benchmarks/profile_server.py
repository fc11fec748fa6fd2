"""Where the server's time goes: py-spy samples of a ``cproxy serve`` subprocess under a
mixed end-to-end load, aggregated by function and by layer, as percentages of the server's
busy samples (py-spy drops idle threads: a thread waiting in epoll or on a lock is not busy).

Workload (as the matrix's base cell): 4 closed-loop producers (batch 100) and 4 pullers
(max_messages 100, acks on the next pull), 10k keys, 8 queues, 100-byte bodies, order_by key.
py-spy records the whole phase at ``--rate`` Hz (non-blocking: the server is not paused).

Layers are assigned from the innermost frame that belongs to a known package (stdlib
helpers such as typing, enum or functools count for their caller). The event loop's own C
code (uvloop: epoll, socket reads and writes, callback scheduling) shows up as self time of
``Runner.run``; a worker thread waking up (``Condition.wait`` in ``Queue.get``, i.e. taking
the GIL back after a hand-off) as thread hand-offs. *Self* time is where the
innermost frame is; *inclusive* time counts a function once per sample that has it anywhere
on the stack.

    python -m benchmarks.profile_server --quick
    python -m benchmarks.profile_server --messages 60000 --json prof.json --raw prof.txt
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.harness.ab import sides
from benchmarks.harness.load import (
    consume,
    create_topic,
    key_stride,
    make_batches,
    produce,
    put_group,
    run_loop,
)
from benchmarks.harness.probe import Probe, PySpy
from benchmarks.harness.report import arg_parser, finish, load_average, machine_facts, table
from benchmarks.harness.server import ServerProcess, servers

#: (layer, path prefixes of the frame's file as py-spy prints it: relative to sys.path).
#: First match wins, innermost frame first.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("store: SQLite calls and row mapping", ("cproxy/store/", "sqlite3/")),
    ("engine: chains, offsets, ready queues", ("cproxy/engine/",)),
    ("broker + group runner", ("cproxy/broker/",)),
    ("cproxy API handlers (parse, encode)", ("cproxy/api/",)),
    ("partitioner (murmur2 of keys)", ("cproxy/partitioner",)),
    ("cproxy model records", ("cproxy/model",)),
    ("metrics (prometheus_client)", ("cproxy/metrics", "prometheus_client/")),
    ("pydantic validation", ("pydantic/", "pydantic_core/")),
    ("FastAPI routing + dependencies", ("fastapi/",)),
    ("Starlette routing, middleware, responses", ("starlette/",)),
    ("uvicorn / httptools HTTP protocol", ("uvicorn/", "httptools/", "h11/")),
    ("anyio: cancel scopes, events, to_thread", ("anyio/",)),
    ("event loop (uvloop C: socket I/O, scheduling)", ("asyncio/", "uvloop/")),
    (
        "thread hand-offs (worker wake-up, GIL hand-over)",
        ("threading.py", "concurrent/futures/", "queue.py"),
    ),
    ("logging", ("logging/",)),
)
#: Generic stdlib helpers (path prefixes): charged to whichever layer called them.
NEUTRAL = (
    "typing.py",
    "enum.py",
    "functools.py",
    "inspect.py",
    "dataclasses.py",
    "contextlib.py",
    "abc.py",
    "copy.py",
    "weakref.py",
    "_weakrefset.py",
    "collections/",
    "json/",
    "re/",
    "<frozen",
    "<string>",
)
FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]*)(?::(?P<line>\d+))?\)$")


def parse_frame(frame: str) -> tuple[str, str]:
    m = FRAME.match(frame)
    if m is None:
        return frame, ""
    return m.group("func"), m.group("file")


def layer_of(frames: list[tuple[str, str]]) -> str:
    for _func, file in reversed(frames):
        if file.startswith(NEUTRAL):
            continue
        for layer, prefixes in LAYERS:
            if file.startswith(prefixes):
                return layer
        return "other: " + (file.split("/")[-1] or "?")
    return "other"


def aggregate(raw: str) -> dict[str, Any]:
    """Collapsed py-spy stacks (``--format raw --threads``) -> percentages."""
    total = 0
    by_thread: Counter[str] = Counter()
    by_layer: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        parts = stack.split(";")
        if parts[0].startswith("thread"):  # recorded with --threads
            thread = parts[0].split(":", 1)[-1].strip()
            parts = parts[1:]
        else:
            thread = "MainThread" if parts[0].startswith("<module>") else "?"
        thread = "event loop (MainThread)" if thread == "MainThread" else "worker threads"
        frames = [parse_frame(p) for p in parts]
        if not frames:
            continue
        total += count
        by_thread[thread] += count
        by_layer[layer_of(frames)] += count
        func, file = frames[-1]
        self_time[f"{func} ({file})"] += count
        for name in {f"{fn} ({fl})" for fn, fl in frames}:
            inclusive[name] += count

    def pct(c: Counter[str], n: int) -> list[tuple[str, float]]:
        return [(k, round(100 * v / max(total, 1), 1)) for k, v in c.most_common(n)]

    return {
        "samples": total,
        "by_thread": pct(by_thread, 10),
        "by_layer": pct(by_layer, 40),
        "self": pct(self_time, 30),
        "inclusive": pct(inclusive, 60),
    }


async def workload(args: Any, server: ServerProcess) -> dict[str, Any]:
    async with sides([server]) as (side,):
        await create_topic(side.admin, "prof", 8)
        await put_group(side.admin, "prof-g", "prof", "key")
    batches = make_batches(args.messages, args.batch, 10_000, 100)
    with Probe(server.pid) as p:
        t0 = time.perf_counter()
        consumer = asyncio.create_task(consume(server.url, "prof-g", args.messages, 4, 100))
        await produce(server.url, "prof", batches, 4, key_stride(args.batch, 10_000))
        elapsed = (await consumer).healthy_done_at - t0
    return {
        "messages": args.messages,
        "msgs_per_s": round(args.messages / elapsed),
        "server_cpu_us_per_msg": round(p.server_cpu / args.messages * 1e6, 1),
        "server_core_share": round(p.server_cpu / elapsed, 2),
        "load_1m": load_average(),
    }


def profiled(args: Any, server: ServerProcess) -> dict[str, Any]:
    """Run the workload with py-spy attached; its results plus the aggregation."""
    with tempfile.TemporaryDirectory(prefix="cproxy-spy-") as tmp:
        raw_path = Path(tmp) / "stacks.txt"
        with PySpy(server.pid, raw_path, args.rate, threads=True) as spy:
            out = run_loop(lambda: workload(args, server))
        raw = raw_path.read_text() if raw_path.exists() else ""
    if not raw:
        err = spy.stderr.decode(errors="replace")[-2000:]
        raise RuntimeError(f"py-spy recorded nothing: {err}")
    if args.raw is not None:
        args.raw.write_text(raw)
    out["profile"] = aggregate(raw)
    return out


def report(out: dict[str, Any]) -> str:
    prof = out["profile"]

    def share(header: str, rows: list[tuple[str, float]]) -> str:
        return table([(header, lambda r: r[0]), ("% of busy samples", lambda r: r[1])], rows)

    return "\n".join(
        [
            f"## Server profile under mixed load (commit {out['commit']})",
            "",
            f"{out['messages']:,} messages at {out['msgs_per_s']:,} msgs/s end to end, server "
            f"{out['server_cpu_us_per_msg']} µs CPU/msg ({out['server_core_share']:.0%} of a "
            f"core), {prof['samples']:,} busy samples at {out['rate']} Hz, load "
            f"{out['load_1m']}.",
            "",
            "### By thread",
            "",
            share("thread", prof["by_thread"]),
            "",
            "### By layer (innermost known frame)",
            "",
            share("layer", prof["by_layer"]),
            "",
            "### Self time, top functions",
            "",
            share("function (file)", prof["self"][:25]),
            "",
            "### Inclusive time, top functions",
            "",
            share("function (file)", prof["inclusive"][:40]),
        ]
    )


def main() -> None:
    parser = arg_parser(__doc__, "15,000 messages (~10 s)")
    parser.add_argument("--messages", type=int, help="default 200,000 (15,000 with --quick)")
    parser.add_argument("--batch", type=int, default=100, help="messages per produce call")
    parser.add_argument("--aggregate", type=Path, help="only aggregate this raw file")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--raw", type=Path, help="also keep the collapsed stacks here")
    args = parser.parse_args()
    args.messages = args.messages or (15_000 if args.quick else 200_000)
    if args.aggregate is not None:
        print(json.dumps(aggregate(args.aggregate.read_text()), indent=1))
        return
    facts = machine_facts()
    with servers("cproxy-prof-", None) as (server,):
        out = profiled(args, server)
    out |= {"rate": args.rate, "commit": server.source.commit, "machine": facts}
    finish(out, args, "profile_server", report(out))


if __name__ == "__main__":
    main()
