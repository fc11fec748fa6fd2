"""The raw SQLite store: the ceiling end-to-end figures are compared with.

Appends come from one coroutine through the store API (no HTTP, no parsing), then every
queue is read back sequentially. An end-to-end message costs one append and one read, so
the store limit is 1 / (1/append + 1/read) messages per second.

``append_and_read`` measures the store of this process. ``measure_in(tree, ...)`` runs the
same load code (this file) in a subprocess whose ``cproxy`` comes from another source tree,
e.g. a ``harness.server.tree_at(ref)`` worktree: that is how the store of an older commit (the
one-row-per-message format before record batches) is measured next to this one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType

from cproxy.model import NewMessage
from cproxy.store.sqlite import SqliteStore


@dataclass(frozen=True)
class Rate:
    """Messages per wall-clock second and per CPU second of this process (all threads)."""

    wall: float
    cpu: float


class Meter:
    """Wall and process CPU seconds over a ``with`` block."""

    wall = cpu = 0.0

    def __enter__(self) -> Meter:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.wall = time.perf_counter() - self._wall
        self.cpu = time.process_time() - self._cpu

    def rate(self, count: int) -> Rate:
        return Rate(count / self.wall, count / max(self.cpu, 1e-9))


@dataclass(frozen=True)
class Case:
    batch: int
    body_bytes: int
    with_ids: bool = False


def store_batches(case: Case, total: int, queues: int) -> list[list[NewMessage]]:
    """``total`` messages (a JSON string body padded to ``body_bytes``, 1,000 keys)."""
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


async def append_and_read(
    case: Case, total: int, queues: int, read_batch: int, root: Path, synchronous: str = "normal"
) -> tuple[Rate, Rate]:
    """Append ``total`` messages in batches, then read every queue; (append, read) rates."""
    batches = store_batches(case, total, queues)
    store = SqliteStore(
        root / f"b{case.batch}-s{case.body_bytes}-{case.with_ids}-{time.monotonic_ns()}",
        synchronous=synchronous,
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
            raise RuntimeError(f"read back {read} messages, expected {total}")
    finally:
        await store.close()
    return appending.rate(total), reading.rate(read)


async def store_limit(batch: int, body_bytes: int, total: int, queues: int = 8) -> dict[str, float]:
    """Append, read and limit msgs/s, and the store's CPU µs per message (append + read)."""
    with tempfile.TemporaryDirectory(prefix="cproxy-raw-") as tmp:
        case = Case(batch, body_bytes)
        append, read = await append_and_read(case, total, queues, 1000, Path(tmp))
    return {"messages": total, **limit_of(append, read)}


#: Run in the subprocess of ``measure_in``: this file is loaded by path (so the load code is
#: this tree's) while ``cproxy`` is imported from the tree first on ``PYTHONPATH``.
_WORKER = """
import asyncio, importlib.util, json, pathlib, sys, tempfile
spec = importlib.util.spec_from_file_location("_store_harness", sys.argv[1])
h = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = h
spec.loader.exec_module(h)
a = json.loads(sys.argv[2])
import cproxy
with tempfile.TemporaryDirectory(prefix="cproxy-raw-") as tmp:
    ap, rd = asyncio.run(h.append_and_read(
        h.Case(**a["case"]), a["total"], a["queues"], a["read_batch"], pathlib.Path(tmp),
        a["synchronous"]))
print(json.dumps({"append": [ap.wall, ap.cpu], "read": [rd.wall, rd.cpu],
                  "cproxy": cproxy.__file__}))
"""


def measure_in(
    tree: Path,
    case: Case,
    total: int,
    queues: int = 8,
    read_batch: int = 1000,
    synchronous: str = "normal",
) -> tuple[Rate, Rate]:
    """``append_and_read`` in a fresh subprocess with the store code of ``tree``."""
    args = {
        "case": asdict(case),
        "total": total,
        "queues": queues,
        "read_batch": read_batch,
        "synchronous": synchronous,
    }
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, str(Path(__file__).resolve()), json.dumps(args)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"store measurement in {tree} failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(out["cproxy"]).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"measured {out['cproxy']}, not the store of {tree}")
    return Rate(*out["append"]), Rate(*out["read"])


def limit_of(append: Rate, read: Rate) -> dict[str, float]:
    """The figures ``store_limit`` reports, from one append and one read rate."""
    return {
        "append_msgs_per_s": round(append.wall),
        "read_msgs_per_s": round(read.wall),
        "limit_msgs_per_s": round(1 / (1 / append.wall + 1 / read.wall)),
        "cpu_us_per_msg": round(1e6 / append.cpu + 1e6 / read.cpu, 1),
    }


def store_limit_in(
    tree: Path, batch: int, body_bytes: int, total: int, queues: int = 8
) -> dict[str, float]:
    """``store_limit`` for the store code of ``tree`` (a subprocess; blocks). With a worktree
    of a commit before record batches it gives the limit of the one-row-per-message format,
    to set next to this tree's in the same run."""
    append, read = measure_in(tree, Case(batch, body_bytes), total, queues)
    return {"messages": total, **limit_of(append, read)}
