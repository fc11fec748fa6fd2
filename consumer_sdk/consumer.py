"""The blocking consumer: a polling loop that runs a plain function per message."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from types import FrameType, TracebackType
from typing import Any, Self, Unpack

import httpx

from consumer_sdk._tls import Verify
from consumer_sdk.config import ConsumerOptions
from consumer_sdk.errors import ConsumerError

from ._consumer_base import ConsumerBase
from ._dispatch import SyncHandler, ThreadDispatcher

log = logging.getLogger("consumer_sdk.consumer")


class Consumer(ConsumerBase):
    """Consumes a group's messages with a sync ``handler(msg)`` on a pool of threads.

    Delivery semantics: at least once. A handler that returns acks its message; one that raises
    fails it, and the server delivers it again after the group's retry backoff (dead-lettering
    it after ``max_attempts``). Messages sharing an order value reach the handler one at a time
    in offset order; different order values run in parallel. Make handlers idempotent (see
    :func:`consumer_sdk.idempotent`): a message may be delivered again after a crash or an ack
    timeout. A handler may return :class:`Produce` (or a list of them) instead of None: its
    message's ack and those output messages are then stored in one transaction, so each input
    gives its outputs exactly once (docs/sdk.md).

    Arguments (durations in milliseconds); the tuning ones, ``concurrency`` to ``retry``, are
    the :class:`~consumer_sdk.ConsumerOptions` both consumers share:

    - ``servers``: one base URL or several; each gets its own puller, and results go back to
      the server that delivered the message. In a cluster (docs/scaling.md) a pull returns
      only the queues of the proxy asked, so give every proxy, or ``discover``.
    - ``discover`` (False): at start, ask ``GET /v1/cluster`` of ``servers`` (the first that
      answers) and pull from every live proxy it lists instead; ask again every
      ``discover_interval_ms`` (10000): a proxy that joins gets a puller, one that left is
      not pulled any more (the results of what it handed out are still sent to it, for up to
      ``flush_timeout_ms`` of failures; whatever it never got back, the queue's new owner
      delivers again). A 404 (a single proxy on SQLite) means: just ``servers``; nobody
      answering: ``servers`` until a later try answers. The token needs ``read_topics``.
      ``active_servers`` lists the servers pulled from now.
    - ``group``, ``topics``: the group to consume for and, optionally, a subset of its topics.
    - ``token``: bearer token. ``verify`` (True): how an https:// server's certificate is
      checked, as for :class:`~consumer_sdk.Client` (a CA bundle path for a private CA).
    - ``concurrency`` (8): handler threads. ``max_messages`` (32): per pull.
    - ``wait_ms`` (1000): long-poll wait of each pull. A pull in progress cannot be abandoned
      without stranding the messages it may return, so ``stop()`` waits for it: this bounds
      the stop latency, at the cost of one idle pull per server per ``wait_ms``.
    - ``max_outstanding`` (``max(max_messages, 4 * concurrency)``): messages received but not
      finished, across servers (soft: each server may overshoot by one pull).
    - ``ack_linger_ms`` (10): results not carried by a pull within this time are sent with a
      standalone ack, so a long poll never holds back an ack (and the next message of its key).
      A pull waits up to this long for running handlers, so their results ride on it, unless
      the previous pull came back full (the server has more ready: keep the workers fed).
      Acks inside a same-key run wait for the run's last one instead (at most
      ``extend_after_ms``): until then they release nothing on the server.
    - ``extend_after_ms`` / ``extend_lease_ms`` (a third of / the group's ``ack_timeout_ms``):
      a message unfinished this long after delivery, or after its last extension, gets its ack
      deadline moved to now + ``extend_lease_ms``, so a slow handler is not redelivered.
    - ``idle_backoff_ms`` / ``max_idle_backoff_ms`` (50 / 1000): pause after empty pulls that
      did not long-poll, doubling. ``retry``: backoff after failed calls (retried until stop).
    - ``drain_timeout_ms`` (None = forever): how long ``stop()`` waits for running handlers.
    - ``flush_timeout_ms`` (10000): how long ``stop()`` keeps retrying to send results.
    - ``ensure_group``: a group config (docs/api.md) to PUT on every server at start; ``topics``
      defaults to the consumer's, and a top-level ``"order_by"`` applies to each of them.
    - ``handle_signals`` (True): ``run()`` in the main thread stops gracefully on SIGINT and
      SIGTERM; a second SIGINT raises ``KeyboardInterrupt`` at once.
    """

    def __init__(
        self,
        servers: str | Sequence[str],
        *,
        group: str,
        handler: SyncHandler,
        topics: Sequence[str] | None = None,
        ensure_group: Mapping[str, Any] | None = None,
        token: str | None = None,
        handle_signals: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        verify: Verify = True,
        discover: bool = False,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        if inspect.iscoroutinefunction(handler):
            raise TypeError("handler is an async function: use AsyncConsumer")
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
        self._thread: threading.Thread | None = None
        self._dispatcher: ThreadDispatcher | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def running(self) -> bool:
        """True from a successful ``start()`` until the loop has stopped."""
        return self._thread is not None and self._thread.is_alive() and self._started.is_set()

    def start(self) -> None:
        """Start consuming in a background thread; returns once the group is prepared.

        Raises what prevented the start (e.g. :class:`~consumer_sdk.ResourceNotFound` for an
        unknown group, or a transport error when ``ensure_group`` could not be applied).
        """
        if self._thread is not None:
            raise ConsumerError("this consumer was already started; create a new one")
        self._dispatcher = ThreadDispatcher(
            self._handler, self.config.concurrency, name=f"cproxy-{self.group}"
        )
        self._thread = threading.Thread(
            target=self._main, name=f"cproxy-{self.group}-loop", daemon=True
        )
        self._thread.start()
        self._started.wait()
        if self._core is None or self._error is not None:
            self._thread.join()
            error, self._error = self._error, None
            assert error is not None
            raise error

    def stop(self, timeout_ms: int | None = None) -> None:
        """Stop gracefully: no new pulls, finish running handlers, send their results.

        Blocks until done (or ``timeout_ms``), then raises the error that stopped the consumer
        early, if any. Called from inside a handler, it only asks for the stop and returns.
        """
        thread, loop, core = self._thread, self._loop, self._core
        if thread is None or loop is None or core is None:
            return
        with contextlib.suppress(RuntimeError):  # RuntimeError: the loop already ended
            loop.call_soon_threadsafe(core.request_stop)
        if self._dispatcher is not None and self._dispatcher.is_worker():
            return
        thread.join(None if timeout_ms is None else timeout_ms / 1000)
        if thread.is_alive():
            raise ConsumerError(f"consumer did not stop within {timeout_ms} ms")
        self._raise_error()

    def run(self) -> None:
        """Start and block until stopped (``stop()`` from another thread, SIGINT or SIGTERM)."""
        self.start()
        thread = self._thread
        assert thread is not None
        restore = self._install_signals()
        try:
            while thread.is_alive():
                thread.join(0.5)
        finally:
            restore()
        self._raise_error()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------------------
    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _main(self) -> None:
        try:
            asyncio.run(self._amain())
        except BaseException as exc:
            self._error = exc
        finally:
            self._started.set()

    async def _amain(self) -> None:
        assert self._dispatcher is not None
        core = self._new_core(self._dispatcher)
        await core.start()
        self._loop = asyncio.get_running_loop()
        self._core = core
        self._started.set()
        await core.serve()

    def _install_signals(self) -> Callable[[], None]:
        if not self._handle_signals or threading.current_thread() is not threading.main_thread():
            return lambda: None
        signals = (signal.SIGINT, signal.SIGTERM)
        previous = {s: signal.getsignal(s) for s in signals}

        def restore() -> None:
            for s, handler in previous.items():
                # None: the handler was installed outside Python and cannot be put back.
                signal.signal(s, signal.SIG_DFL if handler is None else handler)

        def on_signal(signum: int, frame: FrameType | None) -> None:
            # The first signal stops gracefully; the previous handlers take the next one, so a
            # second Ctrl-C raises KeyboardInterrupt when a handler will not finish.
            restore()
            log.info(
                "received %s: stopping gracefully (again to abort)", signal.Signals(signum).name
            )
            loop, core = self._loop, self._core
            if loop is not None and core is not None:
                loop.call_soon_threadsafe(core.request_stop)

        for s in signals:
            signal.signal(s, on_signal)
        return restore
