"""Lease extension: keep a slow handler's message from timing out and being redelivered.

The lease keeper (``ConsumerCore._keep_leases``) calls ``extend`` for what is due."""

from __future__ import annotations

import logging
import time

from consumer_sdk.client import AsyncClient
from consumer_sdk.config import NO_RETRY, ConsumerConfig
from consumer_sdk.errors import ClientError

from ._ledger import Delivery, Ledger

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


async def extend(
    client: AsyncClient, group: str, lease_ms: int, ledger: Ledger, deliveries: list[Delivery]
) -> None:
    """Extend the leases of ``deliveries`` (all from ``client``'s server) by ``lease_ms``."""
    now = time.monotonic()
    try:
        answer = await client.extend(
            group,
            [d.message.ref for d in deliveries],
            lease_ms,
            retry=NO_RETRY,
            attempts={d.message.ref: d.message.attempt for d in deliveries},
        )
    except ClientError as exc:
        # Not fatal: the next tick tries again while the current lease still runs.
        log.warning("extending %d lease(s) on %s failed: %s", len(deliveries), client.url, exc)
        return
    for d in deliveries:
        d.leased_at = now
    ledger.count("extended", answer.applied)
    if answer.unknown:
        ledger.count("leases_lost", len(answer.unknown))
        log.warning(
            "%s no longer had %d message(s) in flight when extending, e.g. %s: they timed out "
            "and will be (or were) delivered again",
            client.url,
            len(answer.unknown),
            answer.unknown[0],
        )
