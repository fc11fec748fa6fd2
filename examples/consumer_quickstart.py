"""Quickstart: produce ride events, then consume them in order per ride.

1. Start a server:   cproxy serve
2. Run this:         python examples/consumer_quickstart.py [URL]
                     (default: $CPROXY_URL, else http://127.0.0.1:9713)
3. Stop with Ctrl-C: running handlers finish and their acks are sent before it exits.

It uses its own topic ``quickstart-rides`` (4 queues) and group ``quickstart``, so it runs on
the same server as the README tour (topic ``rides``, 8 queues) and the other examples.

Events of one ride arrive one at a time, in the order they were produced; different rides are
handled in parallel on 4 threads. A handler that raises is retried (here: the first "pickup" of
every ride fails once). Delivery is at least once, so the handler is wrapped with
``idempotent``: an event that comes again after a crash is skipped, not applied twice.
"""

from __future__ import annotations

import logging
import os
import sys

from consumer_sdk import Consumer, Message, Producer, idempotent

URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("CPROXY_URL", "http://127.0.0.1:9713")
TOPIC = "quickstart-rides"
EVENTS = ("requested", "accepted", "pickup", "dropoff")
log = logging.getLogger("quickstart")


def produce() -> None:
    with Producer(URL) as producer:
        # A no-op when the topic exists with 4 queues (another count would be a 409 conflict).
        producer.create_topic(TOPIC, queues=4)
        for ride in range(3):
            for event in EVENTS:
                # key: messages with one key keep their order. id: sending the same event
                # again (a retry, or running this script twice) stores nothing new.
                result = producer.send(
                    TOPIC,
                    {"ride": ride, "event": event},
                    key=f"ride-{ride}",
                    id=f"ride-{ride}-{event}",
                )
                log.info("sent ride %d %s -> %s", ride, event, result)


@idempotent(key=lambda msg: f"{msg.key}/{msg.body['event']}", store="quickstart-idem.sqlite3")
def handle(msg: Message) -> None:
    """Returning acks the message; raising fails it, and it is delivered again later."""
    ride, event = msg.body["ride"], msg.body["event"]
    if event == "pickup" and msg.attempt == 1:
        raise RuntimeError(f"ride {ride}: driver app timed out")  # retried after backoff
    log.info("handled ride %d %s (attempt %d)", ride, event, msg.attempt)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    produce()
    consumer = Consumer(
        URL,
        group="quickstart",
        topics=[TOPIC],
        handler=handle,
        concurrency=4,
        # Create the group at start: order by message key, retry failures after 200 ms.
        ensure_group={"order_by": "key", "retry_backoff_ms": [200], "max_attempts": 5},
    )
    consumer.run()  # blocks until Ctrl-C / SIGTERM, then stops gracefully


if __name__ == "__main__":
    main()
