"""Wake-ups of the consumer's event loop: one "something changed" signal that every waiter
(pullers, flushers, ``serve()``) re-checks its condition on.

Notifications from worker threads are coalesced so a burst of finished handlers costs one loop
wake-up, not one each.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable


class Wakeups:
    """The change signal; the loop is bound by setting ``_loop`` and ``_loop_thread``."""

    def __init__(self) -> None:
        self._changed = asyncio.Event()
        self._notify_lock = threading.Lock()
        self._notify_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0

    def notify(self) -> None:
        """Wake the loop's waiters; callable from any thread."""
        loop = self._loop
        # Unlocked fast path: a wake-up is already queued and runs after our change.
        if loop is None or self._notify_scheduled:
            return
        with self._notify_lock:
            if self._notify_scheduled:
                return
            self._notify_scheduled = True
        try:
            if threading.get_ident() == self._loop_thread:
                loop.call_soon(self._wake)
            else:
                loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop closed: a handler outlived drain_timeout_ms
            pass

    def _wake(self) -> None:
        with self._notify_lock:
            self._notify_scheduled = False
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def wait_change(self, timeout_s: float | None = None) -> None:
        """Wait until something changes, or ``timeout_s`` passes."""
        event = self._changed
        if timeout_s is None:
            await event.wait()
            return
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            pass

    async def pause(self, seconds: float, until: Callable[[], bool]) -> None:
        """Sleep ``seconds``, waking early once ``until()`` holds."""
        deadline = time.monotonic() + seconds
        while not until():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            await self.wait_change(left)
