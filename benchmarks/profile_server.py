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

    .venv/bin/python -m benchmarks.profile_server --quick
    .venv/bin/python -m benchmarks.profile_server --messages 60000 --json prof.json --raw prof.txt
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import machine_facts, markdown_table
from benchmarks._load import (
    Probe,
    ServerProcess,
    consume,
    create_topic,
    git_commit,
    key_stride,
    load_average,
    make_batches,
    produce,
    put_group,
    run_loop,
)

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


async def workload(args: argparse.Namespace, server: ServerProcess) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as admin:
        await create_topic(admin, "prof", 8)
        await put_group(admin, "prof-g", "prof", "key")
    batches = make_batches(args.messages, 100, 10_000, 100)
    with Probe(server.pid, None, "prof") as p:
        t0 = time.perf_counter()
        consumer = asyncio.create_task(consume(server.url, "prof-g", args.messages, 4, 100))
        await produce(server.url, "prof", batches, 4, key_stride(100, 10_000))
        stats = await consumer
        elapsed = stats.healthy_done_at - t0
    return {
        "messages": args.messages,
        "msgs_per_s": round(args.messages / elapsed),
        "server_cpu_us_per_msg": round(p.server_cpu / args.messages * 1e6, 1),
        "server_core_share": round(p.server_cpu / elapsed, 2),
        "load_1m": load_average(),
    }


def profiled(args: argparse.Namespace, server: ServerProcess) -> dict[str, Any]:
    """Run the workload with py-spy attached; returns its results plus the aggregation."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    fd, name = tempfile.mkstemp(prefix="cproxy-spy-", suffix=".txt")
    os.close(fd)
    raw_path = Path(name)
    cmd = [spy, "record", "--nonblocking", "--threads", "--rate", str(args.rate)]
    cmd += ["--format", "raw", "-o", str(raw_path), "-p", str(server.pid)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(1.0)  # let py-spy attach
        out = run_loop(lambda: workload(args, server))
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    raw = raw_path.read_text()
    raw_path.unlink()
    if not raw:
        raise RuntimeError(f"py-spy recorded nothing: {err.decode(errors='replace')[-2000:]}")
    if args.raw is not None:
        args.raw.write_text(raw)
    out["profile"] = aggregate(raw)
    return out


def report(out: dict[str, Any]) -> str:
    prof = out["profile"]
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
            markdown_table(["thread", "% of busy samples"], prof["by_thread"]),
            "",
            "### By layer (innermost known frame)",
            "",
            markdown_table(["layer", "% of busy samples"], prof["by_layer"]),
            "",
            "### Self time, top functions",
            "",
            markdown_table(["function (file)", "% self"], prof["self"][:25]),
            "",
            "### Inclusive time, top functions",
            "",
            markdown_table(["function (file)", "% inclusive"], prof["inclusive"][:40]),
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="15,000 messages")
    parser.add_argument("--messages", type=int, help="default 200,000 (15,000 with --quick)")
    parser.add_argument("--aggregate", type=Path, help="only aggregate this raw file")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--raw", type=Path, help="also keep the collapsed stacks here")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    args.messages = args.messages or (15_000 if args.quick else 200_000)
    if args.aggregate is not None:
        print(json.dumps(aggregate(args.aggregate.read_text()), indent=1))
        return
    facts = machine_facts()
    root = Path(tempfile.mkdtemp(prefix="cproxy-prof-"))
    server = ServerProcess(root / "data")
    try:
        server.start()
        out = profiled(args, server)
    except BaseException:
        print(server.log(), file=sys.stderr)
        raise
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    out["rate"] = args.rate
    out["commit"] = git_commit()
    out["machine"] = facts
    out["command"] = " ".join(["python -m benchmarks.profile_server", *(argv or sys.argv[1:])])
    print(report(out))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
