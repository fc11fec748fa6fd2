"""Whether writes work: what ``/readyz`` answers besides "the broker takes work"."""

from __future__ import annotations

from cproxy.store.base import Lifecycle

from .clock import now_ms

#: How long a failed append keeps readiness false (unless an append succeeds first). The
#: store's probe write can pass while bigger writes fail (a disk with a few pages left); after
#: this long without producer traffic the probe alone decides, so readiness never sticks.
WRITE_FAILURE_HOLD_MS = 10_000


class WriteHealth:
    def __init__(self, store: Lifecycle) -> None:
        self._store = store
        #: ``now_ms()`` of the last append that failed with ``StoreError``; None after a success.
        self._failed_at_ms: int | None = None

    def append_failed(self) -> None:
        self._failed_at_ms = now_ms()

    def append_succeeded(self) -> None:
        self._failed_at_ms = None

    async def writable(self) -> bool:
        """False for ``WRITE_FAILURE_HOLD_MS`` after a failed append, else the store's probe
        (a real write for SQLite)."""
        failed_at = self._failed_at_ms
        if failed_at is not None and now_ms() - failed_at < WRITE_FAILURE_HOLD_MS:
            return False
        return await self._store.ping()
