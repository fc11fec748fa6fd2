"""Long-polling pulls that wait for work, served first come, first served.

A pull that finds nothing ready parks a ``Waiter`` here and sleeps on its own event. When
work becomes ready the group runner calls ``Waiters.hand_out``: the oldest waiters are
served in arrival order, each with a real ``GroupEngine.pull`` made on its behalf, and only
those that got messages are woken (as SQS long polling behaves). A produce of one message
therefore wakes one pull, not every waiting one, and an idle waiter costs nothing but its
timer.

Waiters that select topics (``topics``) queue in a *lane* per selection, so work of one
topic never scans waiters that cannot take it; across lanes the earliest arrival goes first.
Leaving (deadline passed, client gone, task cancelled) is ``remove``: O(1), no cost to the
others. A waiter that was handed messages it can no longer return keeps them in
``deliveries`` for its owner to give back (``GroupRunner`` releases them uncharged).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection

from cproxy.engine.snapshots import Handout

logger = logging.getLogger(__name__)

#: A lane's key: the pull's topic selection (sorted), or None for "every topic of the group".
LaneKey = tuple[str, ...] | None

#: How a waiting pull learns that its caller has gone: ``watch(leave)`` has ``leave()``
#: called on the event loop once the caller's client has disconnected (at once if it
#: already has), and returns a function that stops watching. A waiting pull watches only
#: while it waits. The HTTP protocol's cycle implements it with a callback on the
#: connection's loss (``cproxy.api.lean_http``); ``watch_with_task`` adapts a caller that
#: can only wait for the disconnect.
WatchGone = Callable[[Callable[[], None]], Callable[[], object]]


#: Waits end on a grid of this many seconds (or of a 20th of the wait, if shorter).
EXPIRY_GRID_S = 0.05


def expiry(now: float, timeout_s: float) -> float:
    """When a wait of ``timeout_s`` from ``now`` ends: its deadline rounded *down* to the
    grid (``EXPIRY_GRID_S``, at most a 20th of the wait), so never later than asked.

    Why: the long polls that expire within the same 50 ms then end in one turn of the event
    loop, on one wake-up, and their clients' next pulls tend to arrive together too. Waking
    an idle process costs 40-80 µs of CPU on a small VM, as much as the rest of an expiring
    poll; 5,000 pulls of 30 s expire ~170 times a second (old journal).
    """
    grid = min(EXPIRY_GRID_S, timeout_s / 20)
    deadline = now + timeout_s
    return math.floor(deadline / grid) * grid if grid > 0 else deadline


class Waiter:
    """One waiting pull: what it may take, and what it was handed."""

    __slots__ = (
        "_future",
        "_woken",
        "consumer",
        "deliveries",
        "key",
        "left",
        "max_messages",
        "max_per_key",
        "seq",
        "topics",
    )

    def __init__(
        self,
        max_messages: int,
        topics: Collection[str] | None,
        max_per_key: int = 1,
        consumer: str | None = None,
    ) -> None:
        """``max_messages``, ``max_per_key`` and ``consumer`` as for ``GroupEngine.pull``;
        ``topics`` None means every topic the group reads."""
        self.max_messages = max_messages
        self.consumer = consumer
        self.max_per_key = max_per_key
        self.topics = topics
        self.key: LaneKey = None if topics is None else tuple(sorted(set(topics)))
        #: Arrival number, set by ``Waiters.enqueue``.
        self.seq = -1
        #: What ``hand_out`` took for this waiter (empty until then, and after ``take``).
        self.deliveries: list[Handout] = []
        #: The caller went away (``leave``): whatever was handed must be given back.
        self.left = False
        self._woken = False
        #: What ``wait`` sleeps on; created there (a waiter may be made outside a loop).
        self._future: asyncio.Future[None] | None = None

    @property
    def woken(self) -> bool:
        """Handed work, or released by ``wake_all`` (or ``leave``)."""
        return self._woken

    async def wait(self, timeout_s: float) -> None:
        """Sleep until woken or ``timeout_s`` seconds passed (cancellation propagates)."""
        if self._woken:
            return
        # A bare future and one timer, not anyio's Event and move_on_after: on uvloop a
        # cancel scope's deadline timer fires up to a millisecond early and re-arms itself
        # until the clock catches up (about 20 loop turns per expiring poll, measured).
        loop = asyncio.get_running_loop()
        future = self._future = loop.create_future()
        timer = loop.call_at(expiry(loop.time(), timeout_s), _release, future)
        try:
            await future
        finally:
            timer.cancel()
            self._future = None

    def take(self) -> list[Handout]:
        """The handed deliveries, now owned by the caller (the waiter keeps none)."""
        out, self.deliveries = self.deliveries, []
        return out

    def leave(self) -> None:
        """The caller is gone: wake the waiting pull so that it leaves the line."""
        self.left = True
        self._set()

    def _wake(self, deliveries: list[Handout]) -> None:
        self.deliveries = deliveries
        self._set()

    def _set(self) -> None:
        self._woken = True
        if self._future is not None:
            _release(self._future)


class Waiters:
    """The FIFO of one group's waiting pulls (see the module docstring)."""

    __slots__ = ("_lanes", "_seq")

    def __init__(self) -> None:
        self._lanes: dict[LaneKey, OrderedDict[int, Waiter]] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return sum(len(lane) for lane in self._lanes.values())

    def __bool__(self) -> bool:
        return bool(self._lanes)  # empty lanes are dropped at once

    def enqueue(self, waiter: Waiter) -> None:
        """Queue ``waiter`` behind every waiter already queued."""
        waiter.seq = next(self._seq)
        lane = self._lanes.get(waiter.key)
        if lane is None:
            lane = self._lanes[waiter.key] = OrderedDict()
        lane[waiter.seq] = waiter

    async def wait(
        self,
        waiter: Waiter,
        timeout_s: float,
        watch: WatchGone | None,
        give_back: Callable[[list[Handout]], None],
    ) -> list[Handout]:
        """Queue ``waiter`` and wait until work is handed to it, ``timeout_s`` passed or
        ``watch`` said the caller's client disconnected; returns what it got.

        Whatever was handed to a waiter that cannot return it (cancelled, or its caller
        gone, in the same instant) goes to ``give_back``: it must not stay in flight with
        nobody to ack it.
        """
        self.enqueue(waiter)
        unwatch = None if watch is None else watch(waiter.leave)
        try:
            await waiter.wait(timeout_s)
        except BaseException:
            # Cancelled (shutdown, the server dropped the request).
            self.remove(waiter)
            give_back(waiter.take())
            raise
        finally:
            if unwatch is not None:
                unwatch()
        self.remove(waiter)
        if waiter.left:
            give_back(waiter.take())
            return []
        return waiter.take()

    def remove(self, waiter: Waiter) -> bool:
        """Take ``waiter`` out of the queue; False if it was no longer queued (woken)."""
        lane = self._lanes.get(waiter.key)
        if lane is None or lane.pop(waiter.seq, None) is None:
            return False
        if not lane:
            del self._lanes[waiter.key]
        return True

    def hand_out(
        self,
        has_work: Callable[[Collection[str] | None], bool],
        take: Callable[[Waiter], list[Handout]],
    ) -> int:
        """Serve waiting pulls in arrival order while there is work; returns how many woke.

        ``has_work(topics)`` says whether a pull of ``topics`` would get something now;
        ``take(waiter)`` makes that pull (moving the messages in flight). A waiter is
        dequeued and woken only when ``take`` gave it messages, so waiters beyond the
        available work are never touched.
        """
        woken = 0
        while True:
            best: OrderedDict[int, Waiter] | None = None
            best_seq = 0
            for lane in self._lanes.values():
                first = next(iter(lane))
                if (best is None or first < best_seq) and has_work(lane[first].topics):
                    best, best_seq = lane, first
            if best is None:
                return woken
            waiter = best[best_seq]
            deliveries = take(waiter)
            if not deliveries:
                return woken  # has_work promised work that was not there: stop, lose nobody
            del best[best_seq]
            if not best:
                del self._lanes[waiter.key]
            waiter._wake(deliveries)
            woken += 1

    def wake_all(self) -> int:
        """Wake every waiter empty-handed (the group stops); returns how many."""
        lanes, self._lanes = self._lanes, {}
        count = 0
        for lane in lanes.values():
            for waiter in lane.values():
                waiter._wake([])
                count += 1
        return count


def _release(future: asyncio.Future[None]) -> None:
    if not future.done():  # a wake-up and the deadline can fall due in the same loop turn
        future.set_result(None)


def watch_with_task(gone: Callable[[], Awaitable[object]]) -> WatchGone:
    """A ``WatchGone`` for a caller that can only wait until its client has gone
    (``gone()`` returns then; an ASGI app, which must call ``receive``): a task awaits it.
    A bare task, not a task group: an anyio task group with its cancel scopes costs
    several times as much CPU as the whole wait."""

    def watch(leave: Callable[[], None]) -> Callable[[], object]:
        return asyncio.ensure_future(_watch(gone, leave)).cancel

    return watch


async def _watch(gone: Callable[[], Awaitable[object]], leave: Callable[[], None]) -> None:
    try:
        await gone()
    except Exception as exc:  # cannot watch: wait on as if nobody watched
        logger.debug("pull not watched for a gone client: %r", exc)
        return
    leave()
