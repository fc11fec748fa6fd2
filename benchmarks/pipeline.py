"""A consume -> produce pipeline with and without ``produce`` on the ack (guarantee 10).

Produces ``--messages`` inputs over ``--keys`` keys, then each contender turns every input
into one output on a topic of its own, in its own group, with ``AsyncConsumer``:

- ``produce-then-ack``: the handler sends its output with ``AsyncProducer.send`` and returns
  None: two calls per input, at-least-once outputs (a crash between them duplicates);
- ``produce-on-ack``: the handler returns ``Produce(topic, [output])``: the ack and the
  output in one call and one store transaction, exactly-once outputs.

Each round runs both in rotating order. Reported: median pipeline msgs/s (until every input
is acked with its output stored) and the median per-round ratio to ``produce-then-ack``.

    python -m benchmarks.pipeline --quick               # 2,000 inputs, 2 rounds (~20 s)
    python -m benchmarks.pipeline --messages 10000 --rounds 5
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable

from benchmarks.harness.report import arg_parser, finish, interleaved, machine_facts, median, table
from benchmarks.harness.server import servers
from consumer_sdk import AsyncConsumer, AsyncProducer, Client, Message, Produce, Producer

TOPIC = "pipe-in"


def produce_inputs(url: str, messages: int, keys: int, queues: int) -> None:
    with Producer(url, timeout_ms=60_000) as producer:
        producer.create_topic(TOPIC, queues)
        for start in range(0, messages, 1000):
            batch = [
                {"key": f"k{n % keys}", "body": {"n": n, "pad": "x" * 64}}
                for n in range(start, min(start + 1000, messages))
            ]
            producer.send_batch(TOPIC, batch)


async def drain(url: str, group: str, total: int, handler: Callable[[Message], Awaitable[object]],
                concurrency: int) -> float:  # fmt: skip
    consumer = AsyncConsumer(
        url, group=group, handler=handler, concurrency=concurrency, wait_ms=1000,
        handle_signals=False,
    )  # fmt: skip
    await consumer.start()
    started = time.perf_counter()
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def check() -> None:  # polled every 5 ms: the SDK signals no "n acked"
        if consumer.stats().acked >= total:
            done.set()
        else:
            loop.call_later(0.005, check)

    check()
    await done.wait()
    elapsed = time.perf_counter() - started
    await consumer.stop()
    return elapsed


async def produce_then_ack(url: str, group: str, out: str, total: int, conc: int) -> float:
    async with AsyncProducer(url, timeout_ms=60_000) as producer:

        async def handle(msg: Message) -> None:
            await producer.send(out, {"from": msg.body["n"]}, key=msg.key)

        return await drain(url, group, total, handle, conc)


async def produce_on_ack(url: str, group: str, out: str, total: int, conc: int) -> float:
    async def handle(msg: Message) -> Produce:
        return Produce(out, [{"key": msg.key, "body": {"from": msg.body["n"]}}])

    return await drain(url, group, total, handle, conc)


CONTENDERS = {"produce-then-ack": produce_then_ack, "produce-on-ack": produce_on_ack}


def main() -> None:
    parser = arg_parser(__doc__, "2,000 inputs, 2 rounds")
    parser.add_argument("--messages", type=int, help="default 5,000 (2,000 with --quick)")
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, help="default 3 (2 with --quick)")
    args = parser.parse_args()
    n = args.messages or (2_000 if args.quick else 5_000)
    rounds = args.rounds or (2 if args.quick else 3)
    facts = machine_facts()

    def one(name: str, rnd: int) -> float:
        group = out = f"{name}-{rnd}-{os.getpid()}"
        with Client(server.url) as c:
            c.create_topic(out, args.queues)
            c.put_group(group, {"topics": {TOPIC: {"order_by": "key"}}})
        return n / asyncio.run(CONTENDERS[name](server.url, group, out, n, args.concurrency))

    with servers("cproxy-pipeline-") as (server,):
        produce_inputs(server.url, n, args.keys, args.queues)
        rates = interleaved(list(CONTENDERS), rounds, one)
    base = next(iter(CONTENDERS))
    rows = [{"pipeline": name, "msgs_per_s": median(rs),
             "ratio": median([a / b for a, b in zip(rs, rates[base], strict=True)])}
            for name, rs in rates.items()]  # fmt: skip
    out = {"machine": facts, "messages": n, "rounds": rounds, "results": rows}
    text = table(
        [
            ("pipeline", lambda r: r["pipeline"]),
            ("msgs/s", lambda r: f"{r['msgs_per_s']:,.0f}"),
            (f"ratio to {base}", lambda r: f"{r['ratio']:.2f}"),
        ],
        rows,
    )
    header = (
        f"## Pipeline in -> out ({n:,} inputs, {args.keys:,} keys, {args.queues} queues, "
        f"concurrency {args.concurrency}, SQLite, median of {rounds} rounds)"
    )
    finish(out, args, "pipeline", f"{header}\n\n{text}")


if __name__ == "__main__":
    main()
