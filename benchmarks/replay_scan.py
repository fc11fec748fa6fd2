"""What a replay of one order value costs to find its messages (SQLite store).

A replay (``POST /v1/groups/{g}/replay``) reads the queue range from ``from`` up to the
group's fetch position and keeps the value's messages: ``order_by: key`` compares each
message's key, a JSON path parses each body. This stores ``--messages`` messages of ~100
bytes on one queue (1,000 keys, bodies ``{"user": ..., "n": ...}``) and times that scan the
way the runner makes it (``REPLAY_SCAN_BATCH`` messages per store read), for both kinds of
order value; it reports seconds per million messages scanned.

    python -m benchmarks.replay_scan                     # 1,000,000 messages
    python -m benchmarks.replay_scan --messages 200000   # quicker; the figure is per million
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import orjson

from cproxy.broker.runner_ops import REPLAY_SCAN_BATCH
from cproxy.engine.orderkey import OrderBy
from cproxy.model import NewMessage
from cproxy.store.sqlite import SqliteStore

T0 = 1_700_000_000_000


async def scan(store: SqliteStore, order_by: str, value: str, upto: int) -> tuple[int, float]:
    """(messages found, seconds) for one replay scan of queue 0 from offset 0 to ``upto``."""
    extract = OrderBy.parse(order_by).extract
    found = 0
    started = time.perf_counter()
    offset = 0
    while offset < upto:
        batch = await store.read("t", 0, offset, REPLAY_SCAN_BATCH)
        if not batch:
            break
        found += sum(1 for m in batch if m.offset < upto and extract(m) == value)
        offset = batch[-1].offset + 1
    return found, time.perf_counter() - started


async def run(messages: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp))
        await store.open()
        try:
            await store.create_topic("t", 1)
            for start in range(0, messages, 1000):
                batch = [
                    NewMessage(
                        f"user-{n % 1000}",
                        orjson.dumps({"user": f"user-{n % 1000}", "n": n, "pad": "x" * 40}),
                        qid=0,
                    )
                    for n in range(start, min(messages, start + 1000))
                ]
                await store.append("t", batch, T0 + start, 0)
            out: dict[str, float] = {"messages": messages}
            for order_by in ("key", "$.user"):
                found, seconds = await scan(store, order_by, "user-7", messages)
                assert found == len(range(7, messages, 1000)), found
                out[f"{order_by} s/million"] = round(seconds * 1_000_000 / messages, 2)
            return out
        finally:
            await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    args = parser.parse_args()
    print(asyncio.run(run(args.messages)))


if __name__ == "__main__":
    main()
