"""The SDK's async transport against the HTTP/1.1 pool of another commit, interleaved A/B,
client CPU per message.

One server; each round runs both transports in rotating order, each producing ``--messages``
messages with ``AsyncProducer`` and consuming them with ``AsyncConsumer`` (its default pull
batch) on a fresh topic and group, in this process. Reported per transport: client CPU per
message (process time: the server's work is not counted) for produce and consume, and the
median per-round ratio new/old (target <= 1.2). The old pool (``consumer_sdk/_http11.py`` at
``--old-ref``, default the SDK before issue 31) is plugged in where ``AsyncClient`` makes its
sender: the rest of the SDK is the same code.

    python -m benchmarks.sdk_transport --quick              # 3 rounds, 5,000 messages
    python -m benchmarks.sdk_transport --rounds 7 --batch 1 # one message per produce call
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import consumer_sdk.client as client_module
from benchmarks.harness.report import arg_parser, finish, interleaved, machine_facts, median, table
from benchmarks.harness.server import servers
from consumer_sdk import AsyncConsumer, AsyncProducer, Message

OLD_REF = "267452d"
ROOT = Path(__file__).resolve().parent.parent


def old_pool(ref: str) -> ModuleType:
    """``consumer_sdk/_http11.py`` as it was at ``ref``, as a module of its own."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{ref}:consumer_sdk/_http11.py"],
        capture_output=True,
        check=True,
        text=True,
    ).stdout
    spec = importlib.util.spec_from_loader("consumer_sdk_http11_old", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it runs
    exec(compile(source, f"{ref}:consumer_sdk/_http11.py", "exec"), module.__dict__)
    return module


@contextlib.contextmanager
def sender(kind: str, old: ModuleType) -> Iterator[None]:
    """``AsyncClient`` builds its default sender from ``client.Http11Pool``."""
    if kind != "old":
        yield
        return
    saved = client_module.Http11Pool
    client_module.Http11Pool = old.Http11Pool  # type: ignore[misc]  # same signature
    try:
        yield
    finally:
        client_module.Http11Pool = saved  # type: ignore[misc]


async def produce(url: str, topic: str, n: int, batch: int) -> float:
    async with AsyncProducer(url) as producer:
        await producer.create_topic(topic, 8)
        cpu = time.process_time()
        for start in range(0, n, batch):
            messages = [
                {"key": f"k{i % 500}", "body": {"n": i, "pad": "x" * 64}}
                for i in range(start, min(start + batch, n))
            ]
            await producer.send_batch(topic, messages)
        return time.process_time() - cpu


async def consume(url: str, topic: str, group: str, n: int) -> float:
    done = asyncio.Event()
    seen = 0

    async def handle(msg: Message) -> None:
        nonlocal seen
        seen += 1
        if seen == n:
            done.set()

    consumer = AsyncConsumer(
        url, group=group, topics=[topic], handler=handle, handle_signals=False,
        ensure_group={"topics": {topic: {}}},
    )  # fmt: skip
    cpu = time.process_time()
    await consumer.start()
    await asyncio.wait_for(done.wait(), 300)
    await consumer.stop()
    return time.process_time() - cpu


def main() -> None:
    parser = arg_parser(__doc__, "3 rounds, 5,000 messages")
    parser.add_argument("--messages", type=int, help="per round and transport (default 20,000)")
    parser.add_argument("--batch", type=int, default=50, help="messages per produce call")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--old-ref", default=OLD_REF, help="a commit with consumer_sdk/_http11.py")
    args = parser.parse_args()
    n = args.messages or (5_000 if args.quick else 20_000)
    rounds = 3 if args.quick else args.rounds
    old = old_pool(args.old_ref)
    facts = machine_facts()

    def one(kind: str, rnd: int) -> dict[str, float]:
        topic = f"{kind}-{rnd}"
        with sender(kind, old):
            p = asyncio.run(produce(server.url, topic, n, args.batch))
            c = asyncio.run(consume(server.url, topic, f"g-{topic}", n))
        return {"produce": p / n * 1e6, "consume": c / n * 1e6, "both": (p + c) / n * 1e6}

    with servers("cproxy-transport-") as (server,):
        cpu = interleaved(["old", "new"], rounds, one)
    rows: list[dict[str, Any]] = []
    for part in ("produce", "consume", "both"):
        old_us, new_us = ([r[part] for r in cpu[k]] for k in ("old", "new"))
        ratios = [a / b for a, b in zip(new_us, old_us, strict=True)]
        rows.append({"part": part, "old": median(old_us), "new": median(new_us),
                     "ratio": median(ratios)})  # fmt: skip
    new_name = "this tree's pool"
    out = {"machine": facts, "messages": n, "batch": args.batch, "rounds": rounds, "results": rows}
    text = table(
        [
            ("client CPU per message", lambda r: r["part"]),
            (f"pool at {args.old_ref}", lambda r: f"{r['old']:.1f} µs"),
            (new_name, lambda r: f"{r['new']:.1f} µs"),
            ("new / old (target <= 1.2)", lambda r: f"{r['ratio']:.2f}"),
        ],
        rows,
    )
    header = (
        f"## SDK transport A/B ({n:,} messages, produce batch {args.batch}, consumer defaults, "
        f"median of {rounds} interleaved rounds)"
    )
    finish(out, args, "sdk_transport", f"{header}\n\n{text}")


if __name__ == "__main__":
    main()
