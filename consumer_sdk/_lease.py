"""Lease extension: keep a slow handler's message from timing out and being redelivered."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from consumer_sdk.config import NO_RETRY, ConsumerConfig
from consumer_sdk.errors import ClientError

from ._ledger import Delivery

if TYPE_CHECKING:
    from ._core import ConsumerCore

log = logging.getLogger("consumer_sdk.consumer")

#: Used to size lease extension when the group's ack timeout cannot be read at start.
DEFAULT_ACK_TIMEOUT_MS = 30_000


def lease_settings(cfg: ConsumerConfig, ack_timeout_ms: int | None) -> tuple[int, int]:
    """``(extend_after_ms, extend_lease_ms)`` from the config and the group's ack timeout."""
    timeout_ms = ack_timeout_ms or DEFAULT_ACK_TIMEOUT_MS
    lease_ms = cfg.extend_lease_ms or timeout_ms
    # A third of the timeout: two more tries fit before the lease would run out.
    after_ms = cfg.extend_after_ms or max(1, timeout_ms // 3)
    if ack_timeout_ms is not None and after_ms >= min(ack_timeout_ms, lease_ms):
        log.warning(
            "extend_after_ms=%d is not below the lease (%d ms): slow handlers will time out "
            "before they are extended",
            after_ms,
            min(ack_timeout_ms, lease_ms),
        )
    return after_ms, lease_ms


async def keep_leases(core: ConsumerCore) -> None:
    """Until the core closes, extend every delivery whose lease is ``extend_after_ms`` old.

    Deliveries waiting for a free handler count too: the server's clock runs for them as well.
    """
    after_s = core.extend_after_ms / 1000
    tick_s = min(max(after_s / 4, 0.005), 1.0)
    while not core.closing:
        await core.wait_closed(tick_s)
        due = core.ledger.due_for_extension(time.monotonic(), after_s)
        # A proxy that left the cluster has handed its queues over: nothing to extend there.
        due = {i: ds for i, ds in due.items() if not core.retired(i)}
        if due:
            await asyncio.gather(*(_extend(core, i, ds) for i, ds in due.items()))


async def _extend(core: ConsumerCore, index: int, deliveries: list[Delivery]) -> None:
    client = core.clients[index]
    now = time.monotonic()
    try:
        answer = await client.extend(
            core.group,
            [d.message.ref for d in deliveries],
            core.extend_lease_ms,
            retry=NO_RETRY,
            attempts={d.message.ref: d.message.attempt for d in deliveries},
        )
    except ClientError as exc:
        # Not fatal: the next tick tries again while the current lease still runs.
        log.warning("extending %d lease(s) on %s failed: %s", len(deliveries), client.url, exc)
        return
    for d in deliveries:
        d.leased_at = now
    core.ledger.count("extended", answer.applied)
    if answer.unknown:
        core.ledger.count("leases_lost", len(answer.unknown))
        log.warning(
            "%s no longer had %d message(s) in flight when extending, e.g. %s: they timed out "
            "and will be (or were) delivered again",
            client.url,
            len(answer.unknown),
            answer.unknown[0],
        )
