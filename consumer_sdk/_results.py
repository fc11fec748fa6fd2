"""Sending results that no pull carries: the flusher per server, and the final flush on stop.

Results normally ride on the next pull. While a pull waits in a long poll nothing else would
carry them, and the server releases the next message of a key only after its ack, so the
flusher sends them at once. Otherwise (no pull out, or one the server answers at once because
it has a backlog) it gives the next pull ``ack_linger_ms`` to take them before sending a
standalone ack: under load, results ride on pulls, not a request each. Acks inside a same-key
run whose later messages are still here release nothing yet: they wait for the run's last
one (one request per run, not one per message).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from consumer_sdk.client import AsyncClient
from consumer_sdk.config import NO_RETRY
from consumer_sdk.errors import ClientError
from consumer_sdk.models import AckResult, QueueResult

if TYPE_CHECKING:
    from ._core import ConsumerCore

log = logging.getLogger("consumer_sdk.consumer")


def note_answer(core: ConsumerCore, client: AsyncClient, answer: AckResult) -> None:
    """Count (and log) results the server did not know."""
    if answer.unknown:
        core.ledger.count("unknown_results", len(answer.unknown))
        log.info(
            "%s did not know %d result(s), e.g. %s: those messages timed out and were "
            "redelivered, or had already finished",
            client.url,
            len(answer.unknown),
            answer.unknown[0],
        )


async def flusher(core: ConsumerCore, index: int) -> None:
    """Until the core closes, send server ``index``'s results that no pull will carry soon."""
    cfg, ledger, client = core.config, core.ledger, core.clients[index]
    linger_s = cfg.ack_linger_ms / 1000
    errors = 0
    failing_since = 0.0
    while not core.closing:
        since = ledger.pending_since(index)
        if since is None:
            await core.wait_change()
            continue
        if not ledger.urgent(index):
            # Only acks inside same-key runs: they release nothing until the run's last one,
            # so they wait for it, at most as long as an unfinished message waits before its
            # lease is extended (so holding an ack never lets a message time out).
            wait_s = max(linger_s, core.extend_after_ms / 1000)
        elif core.pull_parked(index):
            wait_s = 0.0
        else:
            wait_s = linger_s  # the next pull may take them
        left = since + wait_s - time.monotonic()
        if left > 0:
            await core.wait_change(left)
            continue
        results = ledger.take_results(index)
        if not results:
            continue
        try:
            answer = await client.ack(core.group, results, retry=NO_RETRY)
        except ClientError as exc:
            errors += 1
            failing_since = failing_since if errors > 1 else time.monotonic()
            if core.retired(index) and _give_up(core, index, results, exc, failing_since):
                continue
            ledger.restore_results(index, results)
            if not exc.retryable:
                core.fail(exc)
                return
            delay_ms = cfg.retry.backoff_ms(errors)
            log.warning("ack to %s failed (%s); retry in %.0f ms", client.url, exc, delay_ms)
            await core.pause(delay_ms / 1000, lambda: core.closing)
            continue
        errors = 0
        note_answer(core, client, answer)


def _give_up(
    core: ConsumerCore, index: int, results: list[QueueResult], exc: ClientError, since: float
) -> bool:
    """For a server discovery no longer lists: drop ``results`` once sending them has failed
    for ``flush_timeout_ms`` (or with an error retrying cannot fix); True if dropped."""
    if exc.retryable and time.monotonic() - since < core.config.flush_timeout_ms / 1000:
        return False
    log.error(
        "could not send %d result(s) to %s, which left the cluster (%s): the queues' new "
        "owners deliver those messages again",
        sum(len(r.acks) + len(r.fails) for r in results),
        core.clients[index].url,
        exc,
    )
    return True


async def flush(core: ConsumerCore, index: int, deadline: float) -> None:
    """Send every pending result of one server before closing, retrying until ``deadline``
    (``time.monotonic()``); what cannot be sent is redelivered after its ack timeout."""
    client, ledger = core.clients[index], core.ledger
    errors = 0
    while results := ledger.take_results(index):
        try:
            note_answer(core, client, await client.ack(core.group, results, retry=NO_RETRY))
            continue
        except ClientError as exc:
            ledger.restore_results(index, results)
            errors += 1
            delay_s = core.config.retry.backoff_ms(errors) / 1000
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
