"""The service's one wall clock (milliseconds since the Unix epoch) and periodic jobs.

The engine reads no clock; the broker reads this one and passes ``now_ms`` down, so tests
and the HTTP layer never read time themselves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import anyio

from cproxy.errors import StoreError

logger = logging.getLogger(__name__)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def monotonic_s() -> float:
    """For intervals (rate limits): never jumps with the wall clock."""
    return time.monotonic()


async def every(
    interval_ms: int,
    job: Callable[[], Awaitable[object]],
    what: str,
    scope: anyio.CancelScope,
) -> None:
    """Run ``job`` every ``interval_ms`` until ``scope`` is cancelled; a failure is logged
    (one line for a store error, a traceback for a bug) and the next interval tries again."""
    with scope:
        while True:
            await anyio.sleep(interval_ms / 1000)
            try:
                await job()
            except StoreError as exc:
                logger.warning("%s failed, will retry: %s", what, exc)
            except Exception:
                logger.exception("%s crashed; retrying next interval", what)
