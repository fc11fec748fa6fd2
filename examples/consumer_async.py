"""The asyncio flavour: ``async for`` over a group's messages.

    cproxy serve                                   # in another terminal
    python examples/consumer_async.py [URL]        # default: $CPROXY_URL, else http://127.0.0.1:9713

It uses its own topic ``async-orders`` and group ``shipping``, so it runs on the same server
as the README tour and the other examples. Each run produces nine messages (without ids, so
they are new every time) and stops after consuming nine.

Each message is acked when the loop body finishes without raising; an exception leaving the
``async with`` block fails (nacks) the message being handled, so it is delivered again. To keep
going after a failure, nack explicitly: ``await consumer.nack(msg, exc)``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from consumer_sdk import AsyncConsumer, AsyncProducer

URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("CPROXY_URL", "http://127.0.0.1:9713")
TOPIC = "async-orders"


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    async with AsyncProducer(URL) as producer:
        await producer.create_topic(TOPIC, queues=2)
        await producer.send_batch(
            TOPIC,
            [{"key": f"order-{n % 3}", "body": {"order": n % 3, "step": n}} for n in range(9)],
        )

    async with AsyncConsumer(
        URL,
        group="shipping",
        topics=[TOPIC],
        ensure_group={"order_by": "$.order"},  # order by a field of the JSON body
    ) as consumer:
        handled = 0
        async for msg in consumer:
            try:
                await asyncio.sleep(0.01)  # your I/O here
            except Exception as exc:  # fail this message, keep consuming
                await consumer.nack(msg, exc)
                continue
            logging.info("order %s step %s", msg.body["order"], msg.body["step"])
            handled += 1
            if handled == 9:
                break  # leaving the block acks this message and stops the consumer cleanly


if __name__ == "__main__":
    asyncio.run(main())
