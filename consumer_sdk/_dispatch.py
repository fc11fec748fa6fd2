"""Where handlers run: a thread pool (sync handlers), worker tasks (async handlers), or the
caller's ``async for`` loop."""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable

from consumer_sdk.models import Message

from ._core import ConsumerCore
from ._ledger import Delivery
from ._trace import Handlers
from ._util import describe

log = logging.getLogger("consumer_sdk.consumer")

SyncHandler = Callable[[Message], object]
AsyncHandler = Callable[[Message], Awaitable[object] | object]


#: How many failed messages a dispatcher remembers having logged with a traceback.
_LOGGED_MAX = 10_000


class FailureLog:
    """Logs handler failures: a message's first failure here as a warning with its traceback,
    its later ones as one line at info level.

    A message that fails on every delivery is retried every ``retry_backoff_ms`` for as long
    as its key is stuck (up to ``max_attempts``): a traceback each time would flood the log,
    and formatting and writing one costs ~0.2 ms of the consumer's CPU per failure. The error
    of every failure still goes to the server with its result (dead letters show the last).
    Thread-safe (the sync consumer's workers share one).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logged: OrderedDict[tuple[str, int, int], None] = OrderedDict()

    def failed(self, msg: Message, exc: BaseException, error: str) -> None:
        ref = (msg.topic, msg.qid, msg.offset)
        with self._lock:
            again = ref in self._logged
            if not again:
                self._logged[ref] = None
                if len(self._logged) > _LOGGED_MAX:
                    self._logged.popitem(last=False)
        if again:
            log.info(
                "handler failed again on %s/%d@%d (attempt %d): %s",
                msg.topic, msg.qid, msg.offset, msg.attempt, error,
            )  # fmt: skip
        else:
            log.warning(
                "handler failed on %s/%d@%d (attempt %d): %s",
                msg.topic, msg.qid, msg.offset, msg.attempt, error, exc_info=exc,
            )  # fmt: skip


class ThreadDispatcher:
    """``concurrency`` threads take deliveries from one queue and run a sync handler.

    A pulled batch never holds two messages of one order value, so the whole batch may run in
    parallel; a slow message occupies one thread and delays nothing queued behind other threads.
    """

    def __init__(self, handler: SyncHandler, concurrency: int, name: str) -> None:
        self._handlers = Handlers(handler)
        self._failures = FailureLog()
        self._concurrency = concurrency
        self._name = name
        self._queue: queue.SimpleQueue[Delivery | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._core: ConsumerCore | None = None

    def is_worker(self) -> bool:
        """True on one of this dispatcher's threads (a handler calling ``stop()``)."""
        return threading.current_thread() in self._threads

    async def start(self, core: ConsumerCore) -> None:
        self._core = core
        for i in range(self._concurrency):
            # Daemon: a handler stuck past drain_timeout_ms must not keep the process alive.
            thread = threading.Thread(
                target=self._work, name=f"{self._name}-worker-{i}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def submit(self, deliveries: list[Delivery]) -> None:
        self._handlers.choose()
        for d in deliveries:
            self._queue.put(d)

    def _work(self) -> None:
        core = self._core
        assert core is not None
        handlers = self._handlers
        while (delivery := self._queue.get()) is not None:
            try:
                result = handlers.current(delivery.message)
                if inspect.isawaitable(result):
                    # Acking an un-awaited coroutine would lose the message: refuse loudly.
                    if inspect.iscoroutine(result):
                        result.close()
                    raise TypeError("the handler returned an awaitable: use AsyncConsumer")
            except BaseException as exc:  # SystemExit too: it would silently end the thread
                error = describe(exc)
                self._failures.failed(delivery.message, exc, error)
                core.settle(delivery, error)
            else:
                core.finish(delivery, result)

    async def close(self, timeout_s: float | None) -> None:
        for _ in self._threads:
            self._queue.put(None)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s

        def join() -> None:
            for thread in self._threads:
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

        await asyncio.to_thread(join)


class TaskDispatcher:
    """Up to ``concurrency`` tasks drain a backlog of deliveries through an async handler.

    Tasks are started per batch, not per message, and end when the backlog is empty: a
    handler that never awaits costs no task switch per message.
    """

    def __init__(self, handler: AsyncHandler, concurrency: int) -> None:
        self._handlers = Handlers(handler)
        self._failures = FailureLog()
        # The traced twin of an async handler is async too.
        self._is_async = inspect.iscoroutinefunction(handler)
        self._concurrency = concurrency
        self._backlog: deque[Delivery] = deque()
        self._workers: set[asyncio.Task[None]] = set()
        self._core: ConsumerCore | None = None

    async def start(self, core: ConsumerCore) -> None:
        self._core = core

    def submit(self, deliveries: list[Delivery]) -> None:
        self._handlers.choose()
        self._backlog.extend(deliveries)
        self._spawn(1)
        # More workers only if the first one leaves a backlog when it first suspends: a
        # handler that never awaits then costs one task per batch instead of `concurrency`.
        asyncio.get_running_loop().call_soon(self._spawn, self._concurrency)

    def _spawn(self, up_to: int) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(min(up_to - len(self._workers), len(self._backlog))):
            task = loop.create_task(self._drain(), name="cproxy-handler")
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)

    async def _drain(self) -> None:
        core = self._core
        assert core is not None
        handlers, backlog, is_async = self._handlers, self._backlog, self._is_async
        settle, finish = core.settle, core.finish
        while backlog:
            delivery = backlog.popleft()
            try:
                result = handlers.current(delivery.message)
                if is_async or inspect.isawaitable(result):  # plain functions run on the loop
                    result = await result  # type: ignore[misc]
            except Exception as exc:
                error = describe(exc)
                self._failures.failed(delivery.message, exc, error)
                settle(delivery, error)
            else:
                finish(delivery, result)

    async def close(self, timeout_s: float | None) -> None:
        # Called after draining (or after drain_timeout_ms): whatever still runs is abandoned,
        # and its message redelivered after the ack timeout.
        workers = list(self._workers)
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


class IterDispatcher:
    """Holds deliveries for ``async for msg in consumer``."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Delivery] = asyncio.Queue()

    async def start(self, core: ConsumerCore) -> None:
        pass

    def submit(self, deliveries: list[Delivery]) -> None:
        for d in deliveries:
            self.queue.put_nowait(d)

    async def close(self, timeout_s: float | None) -> None:
        pass
