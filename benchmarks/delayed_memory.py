"""Server memory with a million delayed messages (issue 12: "a million delayed messages cost
disk, not RAM"), and whether undelayed keys still flow past them.

1. *Populate*: per scenario a topic (4 queues) is appended straight into a SQLite data dir
   with the store API (through HTTP a million messages take minutes): ``n`` messages of
   ~100 B due in one hour (``deliver_at_ms``), either unordered or over ``--keys`` keys.
2. Per scenario a fresh ``cproxy serve`` on that data dir: RSS idle; then a group
   (``order_by`` key, default ``max_buffered`` 10,000, start earliest) reads the topic;
   once it has read everything (``lag_excluding_parked`` 0) RSS again, with the group's
   ``buffered``, ``delayed`` and ``parked_keys``. *anon* (RSS minus file-backed pages) is
   the heap. Each kind runs at ``n / 10`` and ``n``: memory that does not grow with ``n``
   is bounded.
3. Then ``--free`` undelayed messages of fresh keys are produced over HTTP and pulled: the
   time until all arrived shows that delayed messages do not block other keys.

    python -m benchmarks.delayed_memory --quick         # 100k messages, < 1 minute
    python -m benchmarks.delayed_memory --json d.json   # 1M (a few minutes)
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks.harness.probe import rss
from benchmarks.harness.report import arg_parser, finish, machine_facts, progress, table
from benchmarks.harness.server import running
from consumer_sdk import Client, QueueResult
from cproxy.model import NewMessage
from cproxy.placement import queue_for_key
from cproxy.store.sqlite import SqliteStore

QUEUES = 4
DELAY_MS = 3_600_000
BATCH = 1000


async def populate(data_dir: Path, topic: str, messages: int, keys: int) -> float:
    """Append ``messages`` delayed messages (unordered when ``keys`` is 0); seconds taken."""
    store = SqliteStore(data_dir)
    await store.open()
    t0 = time.perf_counter()
    try:
        now_ms = int(time.time() * 1000)
        await store.create_topic(topic, QUEUES)
        qids = [queue_for_key(f"k{k}", QUEUES) for k in range(keys)]
        pad = "x" * 70
        for start in range(0, messages, BATCH):
            batch = [
                NewMessage(
                    key=f"k{i % keys}" if keys else None,
                    body_json=orjson.dumps({"i": i, "p": pad}),
                    qid=qids[i % keys] if keys else i % QUEUES,
                    deliver_at_ms=now_ms + DELAY_MS + i,
                )
                for i in range(start, min(messages, start + BATCH))
            ]
            await store.append(topic, batch, now_ms, 0)
    finally:
        await store.close()
    return time.perf_counter() - t0


def scenario(root: Path, name: str, messages: int, keys: int, free: int) -> dict[str, Any]:
    data = root / name
    data.mkdir()
    seconds = asyncio.run(populate(data, "t", messages, keys))
    progress(f"{name}: populated {messages} in {seconds:.0f}s")
    with running(root, name) as server, Client(server.url, timeout_ms=60_000) as client:
        idle = rss(server.pid)
        client.put_group("g", {"topics": {"t": {"order_by": "key"}}})
        t0 = time.monotonic()
        while True:
            stats = client.get_group("g")["stats"]
            if stats["lag_excluding_parked"] == 0 or time.monotonic() - t0 > 600:
                break
            time.sleep(0.2)
        read_s = time.monotonic() - t0
        loaded = rss(server.pid)
        # Undelayed messages of fresh keys, produced after the delayed ones: they flow.
        sent = time.monotonic()
        client.produce("t", [{"key": f"free-{i}", "body": i} for i in range(free)])
        got = 0
        results: list[QueueResult] = []
        while got < free and time.monotonic() - sent < 120:
            pulled = client.pull("g", max_messages=1000, wait_ms=500, results=results)
            got += len(pulled.messages)
            results = [QueueResult(m.topic, m.qid, acks=[m.offset]) for m in pulled.messages]
        client.ack("g", results)
        free_s = time.monotonic() - sent
        after = client.get_group("g")["stats"]
    row = {
        "scenario": name,
        "messages": messages,
        "keys": keys,
        "read_s": round(read_s, 1),
        "idle": idle,
        "loaded": loaded,
        "buffered": stats["buffered"],
        "delayed": stats["delayed"],
        "parked_keys": stats["parked_keys"],
        "free_delivered": got,
        "free_s": round(free_s, 2),
        "delayed_after": after["delayed"],
    }
    progress(str(row))
    shutil.rmtree(data, ignore_errors=True)
    return row


def _anon(row: dict[str, Any]) -> str:
    return f"{row['idle'].get('anon_mib')} → {row['loaded'].get('anon_mib')}"


def main() -> None:
    parser = arg_parser(__doc__, "100k messages instead of 1M")
    parser.add_argument("--keys", type=int, default=10_000, help="keys of the keyed scenario")
    parser.add_argument("--free", type=int, default=1000)
    args = parser.parse_args()
    n = 100_000 if args.quick else 1_000_000
    out: dict[str, Any] = {"machine": machine_facts(), "rows": []}
    root = Path(tempfile.mkdtemp(prefix="cproxy-delayed-"))
    try:
        for kind, keys in (("unordered", 0), ("keyed", args.keys)):
            for messages in (n // 10, n):
                name = f"{kind}-{messages}"
                out["rows"].append(scenario(root, name, messages, keys, args.free))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = table(
        [
            ("scenario", lambda r: r["scenario"]),
            ("keys", lambda r: r["keys"] or "none"),
            ("RSS idle MiB", lambda r: r["idle"]["rss_mib"]),
            ("RSS read MiB", lambda r: r["loaded"]["rss_mib"]),
            ("anon idle → read MiB", _anon),
            ("buffered", lambda r: r["buffered"]),
            ("delayed", lambda r: r["delayed"]),
            ("parked keys", lambda r: r["parked_keys"]),
            ("read all s", lambda r: r["read_s"]),
            ("free msgs delivered in s", lambda r: f"{r['free_delivered']} in {r['free_s']}"),
        ],
        out["rows"],
    )
    finish(out, args, "delayed_memory", text)


if __name__ == "__main__":
    main()
