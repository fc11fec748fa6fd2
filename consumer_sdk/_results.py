"""Sending results: counting what the server did not know, and the final flush on stop.

Results normally ride on the next pull; the flusher of each server (``ConsumerCore._flusher``)
sends the ones no pull will carry soon. These are the calls it and the final flush make,
given what they need (no consumer object).
"""

from __future__ import annotations

import asyncio
import logging
import time

from consumer_sdk.client import AsyncClient
from consumer_sdk.config import NO_RETRY, RetryPolicy
from consumer_sdk.errors import ClientError
from consumer_sdk.models import AckResult, QueueResult

from ._ledger import Ledger

log = logging.getLogger("consumer_sdk.consumer")


def note_answer(ledger: Ledger, client: AsyncClient, answer: AckResult) -> None:
    """Count (and log) results the server did not know."""
    if answer.unknown:
        ledger.count("unknown_results", len(answer.unknown))
        log.info(
            "%s did not know %d result(s), e.g. %s: those messages timed out and were "
            "redelivered, or had already finished",
            client.url,
            len(answer.unknown),
            answer.unknown[0],
        )


def gave_up(
    client: AsyncClient, results: list[QueueResult], exc: ClientError, since: float, limit_s: float
) -> bool:
    """For a server discovery no longer lists: drop ``results`` once sending them has failed
    for ``limit_s`` (``flush_timeout_ms``; or with an error retrying cannot fix); True if
    dropped."""
    if exc.retryable and time.monotonic() - since < limit_s:
        return False
    log.error(
        "could not send %d result(s) to %s, which left the cluster (%s): the queues' new "
        "owners deliver those messages again",
        sum(len(r.acks) + len(r.fails) for r in results),
        client.url,
        exc,
    )
    return True


async def flush(
    client: AsyncClient,
    group: str,
    ledger: Ledger,
    index: int,
    retry: RetryPolicy,
    deadline: float,
) -> None:
    """Send every pending result of server ``index`` before closing, retrying (``retry``'s
    backoff) until ``deadline`` (``time.monotonic()``); what cannot be sent is redelivered
    after its ack timeout."""
    errors = 0
    while results := ledger.take_results(index):
        try:
            note_answer(ledger, client, await client.ack(group, results, retry=NO_RETRY))
            continue
        except ClientError as exc:
            ledger.restore_results(index, results)
            errors += 1
            delay_s = retry.backoff_ms(errors) / 1000
            if not exc.retryable or time.monotonic() + delay_s > deadline:
                log.error(
                    "could not send %d result(s) to %s before stopping (%s): those messages "
                    "will be redelivered after their ack timeout",
                    sum(len(r.acks) + len(r.fails) for r in results),
                    client.url,
                    exc,
                )
                return
            log.warning("final ack to %s failed (%s); retrying", client.url, exc)
        await asyncio.sleep(delay_s)
