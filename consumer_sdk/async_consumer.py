"""The asyncio consumer: ``async def`` handlers, or ``async for`` over the messages."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, Unpack

import httpx

from consumer_sdk._tls import Verify
from consumer_sdk.config import ConsumerOptions
from consumer_sdk.errors import ConsumerError
from consumer_sdk.models import Message

from ._consumer_base import ConsumerBase
from ._dispatch import AsyncHandler, IterDispatcher, TaskDispatcher
from ._ledger import Delivery
from ._util import describe

log = logging.getLogger("consumer_sdk.consumer")

_UNSETTLED = "consumer stopped before the message was acked or nacked"
_RELEASED = "released unprocessed: consumer stopped"


class AsyncConsumer(ConsumerBase):
    """Consumes a group's messages on the running event loop.

    Two ways to use it; both deliver at least once, and messages sharing an order value one at
    a time in offset order.

    With a ``handler`` (an ``async def`` taking a :class:`Message`), up to ``concurrency``
    handlers run at once; returning acks the message and raising fails it (returning
    :class:`Produce` acks it with those outputs, stored exactly once, as for ``Consumer``)::

        async with AsyncConsumer(url, group="billing", topics=["rides"], handler=handle) as c:
            await stop_event.wait()            # or: await consumer.run() until SIGINT/SIGTERM

    Without a handler, iterate::

        async with AsyncConsumer(url, group="billing", topics=["rides"]) as consumer:
            async for msg in consumer:
                await process(msg)             # acked when the body finishes without raising

    In ``async for``, a message is settled by ``await consumer.ack(msg)`` or
    ``await consumer.nack(msg, error)``; one left unsettled is acked when the loop asks for the
    next message or the ``async with`` block exits normally (``break`` included), and nacked
    with the exception when the block exits by raising. With ``auto_ack=False`` nothing is
    acked implicitly (to batch, say), but unsettled messages still count against
    ``max_outstanding``. Messages received but not yet yielded when the consumer stops are
    released with a fail, so they are delivered again (counting an attempt). With
    ``handle_signals`` (default), SIGINT or SIGTERM during iteration stops pulling: the loop
    yields what it already holds and then ends.

    Arguments are those of :class:`~consumer_sdk.Consumer` (durations in milliseconds), with
    ``concurrency`` counting handler tasks.
    """

    def __init__(
        self,
        servers: str | Sequence[str],
        *,
        group: str,
        handler: AsyncHandler | None = None,
        topics: Sequence[str] | None = None,
        auto_ack: bool = True,
        ensure_group: Mapping[str, Any] | None = None,
        token: str | None = None,
        handle_signals: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        verify: Verify = True,
        discover: bool = False,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        super().__init__(
            servers,
            group=group,
            topics=topics,
            ensure_group=ensure_group,
            token=token,
            handle_signals=handle_signals,
            transport=transport,
            verify=verify,
            options=options,
            discover=discover,
        )
        self._handler = handler
        self._auto_ack = auto_ack
        self._iter: IterDispatcher | None = None
        self._serve: asyncio.Task[None] | None = None
        self._held: dict[int, Delivery] = {}
        self._current: Delivery | None = None
        self._stopped = False
        self._remove_signals: Callable[[], None] = lambda: None

    @property
    def running(self) -> bool:
        return self._serve is not None and not self._serve.done()

    async def start(self) -> None:
        """Prepare the group and start pulling; raises what prevented the start."""
        if self._core is not None:
            raise ConsumerError("this consumer was already started; create a new one")
        if self._handler is not None:
            dispatcher: TaskDispatcher | IterDispatcher = TaskDispatcher(
                self._handler, self.config.concurrency
            )
        else:
            dispatcher = self._iter = IterDispatcher()
        core = self._new_core(dispatcher)
        await core.start()
        self._core = core
        self._serve = asyncio.create_task(core.serve(), name=f"cproxy-{self.group}")
        if self._iter is not None:
            # run() installs them for handlers; iteration has no run(), so it starts here.
            self._remove_signals = self._install_signals()

    def request_stop(self) -> None:
        """Ask for a graceful stop without waiting (e.g. from a signal handler)."""
        if self._core is not None:
            self._core.request_stop()

    async def stop(self) -> None:
        """Stop gracefully: no new pulls, finish running handlers, send all results.

        Raises the error that stopped the consumer early, if any. Safe to call twice.
        """
        core, serve = self._core, self._serve
        if core is None or serve is None or self._stopped:
            return
        self._stopped = True
        core.request_stop()
        try:
            if self._iter is not None:
                await core.wait_pullers()
                self._release()
            await asyncio.shield(serve)
        finally:
            self._remove_signals()

    async def run(self) -> None:
        """Start, then run the handler until stopped (``stop()``, SIGINT, SIGTERM or
        cancellation, which also stops gracefully before propagating)."""
        if self._handler is None:
            raise ConsumerError("run() needs a handler; without one, use 'async for'")
        if self._core is None:
            await self.start()
        assert self._serve is not None
        remove = self._install_signals()
        try:
            await asyncio.shield(self._serve)
        except asyncio.CancelledError:
            await self.stop()
            raise
        finally:
            remove()
        await self.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        current = self._current
        if current is not None and not current.settled:
            if e is not None:
                self._settle(current, describe(e))
            elif self._auto_ack:
                self._settle(current, None)
        try:
            await self.stop()
        except Exception:
            if e is None:
                raise
            log.exception("consumer of group %r also failed while stopping", self.group)

    # -- async for ---------------------------------------------------------------------------
    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Message:
        core, it = self._core, self._iter
        if core is None or it is None:
            raise ConsumerError(
                "iterate inside 'async with consumer' (or after start()), "
                "and only on a consumer without a handler"
            )
        current, self._current = self._current, None
        if current is not None and self._auto_ack:
            self._settle(current, None)
        while True:
            if not it.queue.empty():
                delivery = it.queue.get_nowait()
                break
            if core.fatal is not None:
                raise core.fatal
            if core.stopping and not core.pulling:
                raise StopAsyncIteration
            await core.wait_change()
        self._held[id(delivery.message)] = delivery
        self._current = delivery
        return delivery.message

    async def ack(self, msg: Message) -> None:
        """Ack a message yielded by ``async for``: its result rides on the next pull."""
        self._settle(self._take(msg), None)

    async def nack(self, msg: Message, error: BaseException | str | None = None) -> None:
        """Fail a message yielded by ``async for``; it is delivered again after the group's
        retry backoff. ``error`` is recorded on the message (and its dead letter)."""
        text = describe(error) if isinstance(error, BaseException) else error
        self._settle(self._take(msg), text or "nacked")

    def _take(self, msg: Message) -> Delivery:
        delivery = self._held.get(id(msg))
        if delivery is None or delivery.message is not msg:
            raise ConsumerError(
                "this message was not yielded by this consumer, or was already acked or nacked"
            )
        return delivery

    def _settle(self, delivery: Delivery, error: str | None) -> None:
        self._held.pop(id(delivery.message), None)
        if self._current is delivery:
            self._current = None
        assert self._core is not None
        self._core.settle(delivery, error)

    def _release(self) -> None:
        """Fail whatever the ``async for`` loop will not settle any more (see class doc)."""
        assert self._iter is not None
        for delivery in list(self._held.values()):
            self._settle(delivery, _UNSETTLED)
        queue = self._iter.queue
        while not queue.empty():
            self._settle(queue.get_nowait(), _RELEASED)

    def _install_signals(self) -> Callable[[], None]:
        if not self._handle_signals or threading.current_thread() is not threading.main_thread():
            return lambda: None
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM)
        previous = {s: signal.getsignal(s) for s in signals}

        def remove() -> None:
            for s, handler in previous.items():
                if loop.remove_signal_handler(s):
                    signal.signal(s, signal.SIG_DFL if handler is None else handler)

        def on_signal(signum: signal.Signals) -> None:
            remove()  # the previous handlers take a second signal: Ctrl-C twice aborts
            log.info("received %s: stopping gracefully (again to abort)", signum.name)
            self.request_stop()

        try:
            for s in signals:
                loop.add_signal_handler(s, on_signal, s)
        except (NotImplementedError, RuntimeError):  # not on this platform/loop
            return lambda: None
        return remove
