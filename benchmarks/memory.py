"""Memory per idle key: what the server holds for each distinct key it has in memory.

Two topics of ``--messages`` messages (~100-byte bodies, 8 queues) are appended straight into
a SQLite data dir with the store API (faster than HTTP): one over 1,000 keys, one over as
many keys as messages. Per topic a fresh ``cproxy serve`` on that data dir: *anon* RSS (RSS
minus file-backed pages such as SQLite's mmap: the heap) idle, then with a group
(``order_by: key``, ``max_buffered`` = messages) holding every message buffered. The
difference per message is the cost of a buffered message; the difference between the two
topics, divided by the difference in keys, is the cost of a distinct key (its chain in the
engine) beyond its messages.

    python -m benchmarks.memory --quick          # 20,000 messages
    python -m benchmarks.memory --messages 100000 --json memory.json
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks.harness.load import client, delete_group, put_group, run_loop, wait_stats
from benchmarks.harness.probe import rss
from benchmarks.harness.report import arg_parser, finish, machine_facts, progress, table
from benchmarks.harness.server import running, this_tree
from cproxy.model import NewMessage
from cproxy.placement import queue_for_key
from cproxy.store.sqlite import SqliteStore

QUEUES = 8


async def populate(data_dir: Path, topics: dict[str, tuple[int, int]]) -> None:
    """Append ``topics`` (name -> (messages, keys)) with the store API."""
    store = SqliteStore(data_dir)
    await store.open()
    try:
        now_ms, pad = int(time.time() * 1000), "x" * 70
        for name, (messages, keys) in topics.items():
            await store.create_topic(name, QUEUES)
            qids = [queue_for_key(f"k{k}", QUEUES) for k in range(keys)]
            for start in range(0, messages, 1000):
                batch = [
                    NewMessage(
                        key=f"k{i % keys}",
                        body_json=orjson.dumps({"k": i % keys, "s": i // keys, "p": pad}),
                        qid=qids[i % keys],
                    )
                    for i in range(start, min(messages, start + 1000))
                ]
                await store.append(name, batch, now_ms, 0)
    finally:
        await store.close()


def measure(data: Path, topic: str, messages: int, keys: int) -> dict[str, Any]:
    """A fresh server on ``data``: anon RSS idle, then with ``messages`` buffered."""

    async def go(url: str, pid: int) -> dict[str, Any]:
        async with client(url) as admin:
            await asyncio.sleep(0.5)
            idle = rss(pid)
            await put_group(admin, "mem", topic, "key", max_buffered=messages)
            await wait_stats(admin, "mem", lambda s: s["buffered"] >= messages, "buffered", 600)
            await asyncio.sleep(0.5)  # let allocations settle
            held = rss(pid)
            await delete_group(admin, "mem")  # groups persist: the next server must not read it
        return {"idle": idle, "held": held}

    with running(data.parent, data.name, this_tree()) as server:
        point = run_loop(lambda: go(server.url, server.pid))
    grown = (point["held"]["anon_mib"] - point["idle"]["anon_mib"]) * 2**20
    point |= {"topic": topic, "messages": messages, "keys": keys, "grown_bytes": grown,
              "bytes_per_msg": round(grown / messages)}  # fmt: skip
    progress(f"{messages:,} buffered over {keys:,} keys: {point['bytes_per_msg']} B/msg anon")
    return point


def main() -> None:
    parser = arg_parser(__doc__, "20,000 messages")
    parser.add_argument("--messages", type=int, help="per topic (default 100,000; 20,000 quick)")
    args = parser.parse_args()
    n = args.messages or (20_000 if args.quick else 100_000)
    topics = {"few": (n, 1_000), "many": (n, n)}
    out: dict[str, Any] = {"machine": machine_facts(), "commit": this_tree().commit}
    root = Path(tempfile.mkdtemp(prefix="cproxy-mem-"))
    try:
        data = root / "data"
        data.mkdir()
        run_loop(lambda: populate(data, topics))
        out["points"] = [measure(data, t, m, k) for t, (m, k) in topics.items()]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    few, many = out["points"]
    out["bytes_per_key"] = round(
        (many["grown_bytes"] - few["grown_bytes"]) / (many["keys"] - few["keys"])
    )
    columns = [
        ("buffered messages", lambda p: p["messages"]),
        ("distinct keys", lambda p: p["keys"]),
        ("anon MiB idle", lambda p: p["idle"]["anon_mib"]),
        ("anon MiB held", lambda p: p["held"]["anon_mib"]),
        ("RSS MiB held", lambda p: p["held"]["rss_mib"]),
        ("B per buffered message", lambda p: p["bytes_per_msg"]),
    ]
    text = (
        f"## Memory per idle key (commit {out['commit']})\n\n{table(columns, out['points'])}\n\n"
        f"Per distinct key, beyond its messages: **{out['bytes_per_key']} B**."
    )
    finish(out, args, "memory", text)


if __name__ == "__main__":
    main()
