"""The polling loop of docs/sdk.md, shared by :class:`Consumer` and :class:`AsyncConsumer`.

One asyncio engine serves both: the sync consumer runs it on a private event-loop thread and
hands messages to a thread pool, the async one runs it on the caller's loop and hands messages
to worker tasks (see ``_dispatch``). Per server there is one puller (pull with long poll,
carrying pending results) and one flusher (sends results no pull will carry soon, e.g. while
the puller sits in a long poll); one lease keeper extends messages whose handlers run long.

Servers are numbered in the order they were added and never renumbered: with ``discover``, a
proxy that joins the cluster is added (a puller and a flusher) and one that left is *retired*
(its puller stops; its flusher still sends the results of what it had handed out, and gives
them up after ``flush_timeout_ms`` of failures: the queue's new owner redelivers them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, Protocol

import httpx

from consumer_sdk._tls import Verify
from consumer_sdk._wire import produce_to_wire
from consumer_sdk.client import AsyncClient
from consumer_sdk.config import NO_RETRY, ConsumerConfig
from consumer_sdk.errors import ClientError
from consumer_sdk.models import Produce

from ._cluster import adiscover, unique_urls
from ._lease import extend, lease_settings
from ._ledger import ConsumerStats, Delivery, Ledger
from ._outputs import outputs_of, send_outputs
from ._results import flush, gave_up, note_answer
from ._runs import Runs, several_runs
from ._util import describe, group_body, prepare_group, recreate_group
from ._wakeup import Wakeups

log = logging.getLogger("consumer_sdk.consumer")
cluster_log = logging.getLogger("consumer_sdk.cluster")


class Dispatcher(Protocol):
    """Runs handlers for delivered messages and reports each outcome to ``core.settle``."""

    async def start(self, core: ConsumerCore) -> None: ...

    def submit(self, deliveries: list[Delivery]) -> None: ...

    async def close(self, timeout_s: float | None) -> None: ...


class ConsumerCore(Wakeups):
    """Pull, dispatch, record, flush, extend; stop by draining. Lives on one event loop."""

    def __init__(
        self,
        servers: Sequence[str],
        group: str,
        topics: Sequence[str] | None,
        config: ConsumerConfig,
        dispatcher: Dispatcher,
        *,
        token: str | None = None,
        ensure_group: Mapping[str, Any] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        verify: Verify = True,
        discover: bool = False,
    ) -> None:
        super().__init__()
        #: every server ever pulled from, by index (see the module doc); ``clients`` alike
        self.servers: list[str] = []
        self.group = group
        self.topics = list(topics) if topics is not None else None
        self.config = config
        #: Sent with every pull: the group's stats list consumers by it.
        self.consumer_id = f"{socket.gethostname()}/{os.getpid()}/{config.name or group}"
        self.ledger = Ledger(0)
        self.clients: list[AsyncClient] = []
        self._given = unique_urls(servers)
        self._discover = discover
        self._seeds: list[AsyncClient] = []
        self._retired: list[bool] = []
        self.fatal: BaseException | None = None
        self.closing = False
        self.extend_after_ms = 0
        self.extend_lease_ms = 0
        self._dispatcher = dispatcher
        self._token = token
        self._group_body = group_body(ensure_group, topics) if ensure_group is not None else None
        self._transport = transport
        self._verify = verify
        self._pullers: list[asyncio.Task[None]] = []
        self._puller_of: dict[int, asyncio.Task[None]] = {}
        self._background: list[asyncio.Task[None]] = []
        self._in_pull: list[bool] = []
        #: per server: the last pull came back full of several runs (keys): the server
        #: likely has more ready, so the next pull is answered at once
        self._backlog: list[bool] = []
        self._stopping = False
        # serve() and the lease keeper wait only for these, not for every change (a settled
        # message wakes just the puller and the flusher).
        self._stop_requested = asyncio.Event()
        self._closed = asyncio.Event()
        self._runs = Runs()
        #: pull answers may hold same-key runs (``max_per_key`` > 1), handled via ``_runs``
        self._per_key_runs = config.max_per_key > 1

    async def wait_closed(self, timeout_s: float) -> None:
        """Wait until the core closes (background tasks end), or ``timeout_s`` passes."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._closed.wait()
        except TimeoutError:
            pass

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def pulling(self) -> bool:
        """True while some puller may still deliver messages."""
        return any(not t.done() for t in self._pullers)

    def settle(self, delivery: Delivery, error: str | None) -> bool:
        """Record a handler outcome (None = ack); thread-safe. False if already settled.

        Within a same-key run the next message is dispatched only after this one acked; a
        fail ends the run here (the server sends the rest back behind the failed message).
        """
        if not self._per_key_runs:  # no same-key runs: nothing waits for this one
            if not self.ledger.settle(delivery, error, True):
                return False
            self.notify()
            return True
        # Acking a run's message while later ones wait here releases nothing on the server.
        urgent = error is not None or not self._runs.has_rest(delivery)
        if not self.ledger.settle(delivery, error, urgent):
            return False
        nxt, taken_back = self._runs.settled(delivery, error is None)
        if nxt is not None:
            self._dispatcher.submit([nxt])
        if taken_back:
            self.ledger.drop(taken_back)
        self.notify()
        return True

    def finish(self, delivery: Delivery, returned: object) -> None:
        """A handler returned ``returned`` (thread-safe): a plain ack, or with ``Produce``
        outputs, the ack and the outputs in one call (``_outputs``)."""
        if returned is None:  # the usual plain ack, without looking for outputs
            self.settle(delivery, None)
            return
        outputs = outputs_of(returned)
        if outputs is None:
            self.settle(delivery, None)
            return
        try:
            produce_to_wire(outputs)  # a malformed output message fails the handler
        except (TypeError, ValueError) as exc:
            self.settle(delivery, describe(exc))
            return
        loop = self._loop
        assert loop is not None
        if threading.get_ident() == self._loop_thread:
            self._send_outputs(delivery, outputs)
            return
        # RuntimeError: the loop closed (a handler outlived drain_timeout_ms).
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._send_outputs, delivery, outputs)

    def _send_outputs(self, delivery: Delivery, outputs: list[Produce]) -> None:
        # The delivery stays outstanding until the call ends: draining waits for it.
        delivery.sending = True
        self._spawn(self._outputs_call(delivery, outputs), "outputs")

    async def _outputs_call(self, delivery: Delivery, outputs: list[Produce]) -> None:
        stored = False
        try:
            client = self.clients[delivery.server]
            stored = await send_outputs(
                client, self.group, self.ledger, self.config.retry, delivery, outputs
            )
        finally:
            self.outputs_done(delivery, stored)

    def outputs_done(self, delivery: Delivery, stored: bool) -> None:
        """The ack with outputs of ``delivery`` ended (``stored`` or not): its run goes on,
        or, when it was not stored, the rest of its run is left to the server."""
        self.ledger.drop([delivery])
        nxt, taken_back = self._runs.settled(delivery, stored)
        if nxt is not None:
            self._dispatcher.submit([nxt])
        if taken_back:
            self.ledger.drop(taken_back)
        self.notify()

    def _dispatch(self, deliveries: list[Delivery]) -> None:
        """Hand a pull's deliveries to the dispatcher: same-key runs one message at a time."""
        if self._per_key_runs:
            deliveries = self._runs.split(deliveries)
        self._dispatcher.submit(deliveries)

    def stats(self) -> ConsumerStats:
        return self.ledger.stats()

    def pull_parked(self, index: int) -> bool:
        """True while a pull to server ``index`` is out that likely waits in a long poll
        (the previous one was not a full answer of several runs): no pull will carry
        results soon."""
        return self._in_pull[index] and not self._backlog[index]

    def request_stop(self) -> None:
        """Stop pulling; in-flight pulls finish and their messages are still handled."""
        if not self._stopping:
            self._stopping = True
            self._stop_requested.set()
            self._wake()

    def fail(self, exc: BaseException) -> None:
        """Stop the consumer on an error that retrying cannot fix."""
        if self.fatal is None:
            self.fatal = exc
            log.error("consumer of group %r stops on a fatal error: %s", self.group, exc)
        self.request_stop()

    # -- servers -----------------------------------------------------------------------------
    def _client(self, url: str) -> AsyncClient:
        cfg = self.config
        return AsyncClient(
            url,
            token=self._token,
            timeout_ms=cfg.request_timeout_ms,
            retry=cfg.retry,
            transport=self._transport,
            verify=self._verify,
        )

    def _add_server(self, url: str) -> int:
        """A new server slot (no tasks yet); returns its index."""
        self.servers.append(url)
        self.clients.append(self._client(url))
        self._retired.append(False)
        self._in_pull.append(False)
        self._backlog.append(False)
        index = self.ledger.add_server()
        assert index == len(self.servers) - 1
        return index

    def _run_server(self, index: int, flush_too: bool) -> None:
        self._puller_of[index] = task = self._spawn(self._puller(index), f"pull-{index}")
        self._pullers.append(task)
        if flush_too:
            self._background.append(self._spawn(self._flusher(index), f"flush-{index}"))

    def retired(self, index: int) -> bool:
        """True once discovery no longer lists server ``index``: it is not pulled any more."""
        return self._retired[index]

    @property
    def active_servers(self) -> list[str]:
        """The servers pulled from now."""
        return [u for u, gone in zip(self.servers, self._retired, strict=True) if not gone]

    def active_clients(self) -> list[AsyncClient]:
        return [c for c, gone in zip(self.clients, self._retired, strict=True) if not gone]

    def use_servers(self, urls: Sequence[str]) -> None:
        """Pull from exactly ``urls`` (the live proxies): start pullers for new ones (or ones
        that came back), retire the pullers of the others. A no-op once stopping."""
        wanted = unique_urls(urls)
        if self._stopping or not wanted:
            return
        for url in wanted:
            if url not in self.servers:
                log.info("consumer of group %r: proxy %s joined", self.group, url)
                self._run_server(self._add_server(url), flush_too=True)
                continue
            index = self.servers.index(url)
            if self._retired[index]:
                log.info("consumer of group %r: proxy %s is back", self.group, url)
                self._retired[index] = False
                task = self._puller_of.get(index)
                if task is None or task.done():
                    self._run_server(index, flush_too=False)
        for index, url in enumerate(self.servers):
            if url not in wanted and not self._retired[index]:
                log.info("consumer of group %r: proxy %s left; not pulling it", self.group, url)
                self._retired[index] = True
        self._wake()

    async def _initial_servers(self) -> list[str]:
        """The given URLs, or with ``discover`` the live proxies ``GET /v1/cluster`` lists
        (the given URLs when it answers 404, or nobody answers: re-discovery tries again)."""
        if not self._discover:
            return self._given
        self._seeds = [self._client(u) for u in self._given]
        try:
            members = await adiscover(self._seeds)
        except ClientError as exc:
            if not exc.retryable:
                raise
            return self._given
        if members is None:  # a single proxy on SQLite: nothing to re-discover
            self._discover = False
        return members or self._given

    async def start(self) -> None:
        """Open clients, prepare the group, start pullers, flushers and the lease keeper."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        cfg = self.config
        try:
            for url in await self._initial_servers():
                self._add_server(url)
            need = not (cfg.extend_after_ms and cfg.extend_lease_ms)
            found = await prepare_group(self.clients, self.group, self._group_body, need)
            self.extend_after_ms, self.extend_lease_ms = lease_settings(cfg, found)
            await self._dispatcher.start(self)
        except BaseException:
            await self._close_clients()
            raise
        for i in range(len(self.servers)):
            self._run_server(i, flush_too=True)
        self._background.append(self._spawn(self._keep_leases(), "extend"))
        if self._discover:
            self._background.append(self._spawn(self._rediscover(), "discover"))
        log.info(
            "consumer of group %r started on %s (concurrency %d, extend after %d ms)",
            self.group,
            ", ".join(self.servers),
            cfg.concurrency,
            self.extend_after_ms,
        )

    async def serve(self) -> None:
        """Run until :meth:`request_stop`, then drain; raises the fatal error if one stopped it."""
        try:
            await self._stop_requested.wait()
        finally:
            await self._shutdown()
        if self.fatal is not None:
            raise self.fatal

    async def wait_pullers(self) -> None:
        await asyncio.gather(*self._pullers, return_exceptions=True)

    async def _shutdown(self) -> None:
        cfg = self.config
        self.request_stop()
        await self.wait_pullers()
        drain_s = None if cfg.drain_timeout_ms is None else cfg.drain_timeout_ms / 1000
        drained = True
        try:
            async with asyncio.timeout(drain_s):
                while self.ledger.outstanding:
                    await self.wait_change()
        except TimeoutError:
            drained = False
            log.warning(
                "%d handler(s) still running after drain_timeout_ms=%s; their messages will be "
                "redelivered after the ack timeout",
                self.ledger.outstanding,
                cfg.drain_timeout_ms,
            )
        await self._dispatcher.close(None if drained else 0)
        self.closing = True
        self._closed.set()
        self._wake()
        await asyncio.gather(*self._background, return_exceptions=True)
        deadline = time.monotonic() + cfg.flush_timeout_ms / 1000
        await asyncio.gather(
            *(
                flush(client, self.group, self.ledger, i, cfg.retry, deadline)
                for i, client in enumerate(self.clients)
            )
        )
        await self._close_clients()
        log.info("consumer of group %r stopped: %s", self.group, self.stats())

    async def _close_clients(self) -> None:
        clients = [*self.clients, *self._seeds]
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        async def guarded() -> None:
            try:
                await coro
            except Exception as exc:  # a bug must stop the consumer, not vanish in a task
                log.exception("consumer task %s crashed", name)
                self.fail(exc)

        return asyncio.get_running_loop().create_task(guarded(), name=f"cproxy-{name}")

    # -- the loops ---------------------------------------------------------------------------
    async def _puller(self, index: int) -> None:
        cfg, ledger, client = self.config, self.ledger, self.clients[index]
        limit = cfg.outstanding_limit
        # Pull once at least half a batch fits: fewer, fuller pulls, yet the pool stays fed.
        min_batch = max(1, min(cfg.max_messages, limit) // 2)
        linger_s = cfg.ack_linger_ms / 1000
        errors = 0
        idle_ms = 0.0

        def done() -> bool:
            return self._stopping or self._retired[index]

        def has_room() -> bool:
            return done() or limit - ledger.outstanding >= min_batch

        while not done():
            while not has_room():
                await self.wait_change()
            # Give running handlers up to ack_linger_ms to finish, so their results ride on
            # this pull: the server releases the next message of a key only after its ack.
            # Not after a full answer: the server has more ready, and waiting would starve the
            # handlers (results that come while the pull is out go with the flusher at once).
            if not self._backlog[index]:
                await self.pause(linger_s, lambda: done() or not ledger.outstanding)
            if done():
                break
            asked = min(cfg.max_messages, limit - ledger.outstanding)
            if asked < 1:  # another server's puller took the room meanwhile
                continue
            results = ledger.take_results(index)
            started = time.monotonic()
            self._in_pull[index] = True
            try:
                answer = await client.pull(
                    self.group,
                    max_messages=asked,
                    wait_ms=cfg.wait_ms,
                    topics=self.topics,
                    results=results,
                    retry=NO_RETRY,
                    max_per_key=cfg.max_per_key,
                    consumer=self.consumer_id,
                )
            except ClientError as exc:
                ledger.restore_results(index, results)
                ledger.count("pull_errors")
                if await recreate_group(client, self.group, self._group_body, exc):
                    continue
                if not exc.retryable:
                    self.fail(exc)
                    break
                errors += 1
                delay_ms = cfg.retry.backoff_ms(errors)
                log.warning("pull from %s failed (%s); retry in %.0f ms", client.url, exc, delay_ms)
                await self.pause(delay_ms / 1000, done)
                continue
            finally:
                self._in_pull[index] = False
            errors = 0
            ledger.count("pulls")
            note_answer(ledger, client, answer.results)
            # One run filling the answer says nothing of other keys: assume no backlog.
            self._backlog[index] = len(answer.messages) >= asked and several_runs(answer.messages)
            if answer.messages:
                idle_ms = 0.0
                self._dispatch(ledger.add(index, answer.messages))
                self._wake()
                continue
            # Empty: the long poll already waited, so sleep only what it did not wait.
            idle_ms = min(cfg.max_idle_backoff_ms, max(cfg.idle_backoff_ms, idle_ms * 2))
            waited_ms = (time.monotonic() - started) * 1000
            if idle_ms > waited_ms:
                await self.pause((idle_ms - waited_ms) / 1000, done)

    async def _flusher(self, index: int) -> None:
        """Until the core closes, send server ``index``'s results that no pull will carry soon.

        Results normally ride on the next pull. While a pull waits in a long poll nothing else
        would carry them, and the server releases the next message of a key only after its
        ack, so they go at once. Otherwise (no pull out, or one the server answers at once
        because it has a backlog) the next pull gets ``ack_linger_ms`` to take them before a
        standalone ack: under load, results ride on pulls, not a request each. Acks inside a
        same-key run whose later messages are still here release nothing yet: they wait for
        the run's last one (one request per run, not one per message).
        """
        cfg, ledger, client = self.config, self.ledger, self.clients[index]
        linger_s = cfg.ack_linger_ms / 1000
        errors = 0
        failing_since = 0.0
        while not self.closing:
            since = ledger.pending_since(index)
            if since is None:
                await self.wait_change()
                continue
            if not ledger.urgent(index):
                # Only acks inside same-key runs: they release nothing until the run's last
                # one, so they wait for it, at most as long as an unfinished message waits
                # before its lease is extended (so holding an ack never lets it time out).
                wait_s = max(linger_s, self.extend_after_ms / 1000)
            elif self.pull_parked(index):
                wait_s = 0.0
            else:
                wait_s = linger_s  # the next pull may take them
            left = since + wait_s - time.monotonic()
            if left > 0:
                await self.wait_change(left)
                continue
            results = ledger.take_results(index)
            if not results:
                continue
            try:
                answer = await client.ack(self.group, results, retry=NO_RETRY)
            except ClientError as exc:
                errors += 1
                failing_since = failing_since if errors > 1 else time.monotonic()
                limit_s = cfg.flush_timeout_ms / 1000
                if self._retired[index] and gave_up(client, results, exc, failing_since, limit_s):
                    continue
                ledger.restore_results(index, results)
                if not exc.retryable:
                    self.fail(exc)
                    return
                delay_ms = cfg.retry.backoff_ms(errors)
                log.warning("ack to %s failed (%s); retry in %.0f ms", client.url, exc, delay_ms)
                await self.pause(delay_ms / 1000, lambda: self.closing)
                continue
            errors = 0
            note_answer(ledger, client, answer)

    async def _keep_leases(self) -> None:
        """Until the core closes, extend every delivery whose lease is ``extend_after_ms`` old.

        Deliveries waiting for a free handler count too: the server's clock runs for them too.
        """
        after_s = self.extend_after_ms / 1000
        tick_s = min(max(after_s / 4, 0.005), 1.0)
        while not self.closing:
            await self.wait_closed(tick_s)
            due = self.ledger.due_for_extension(time.monotonic(), after_s)
            # A proxy that left the cluster has handed its queues over: nothing to extend there.
            due = {i: ds for i, ds in due.items() if not self._retired[i]}
            if due:
                await asyncio.gather(
                    *(
                        extend(self.clients[i], self.group, self.extend_lease_ms, self.ledger, ds)
                        for i, ds in due.items()
                    )
                )

    async def _rediscover(self) -> None:
        """Until the consumer stops, ask ``GET /v1/cluster`` every ``discover_interval_ms`` (the
        proxies pulled from, then the given ones) and pull from exactly the live members."""
        interval_s = self.config.discover_interval_ms / 1000
        while not self._stopping:
            await self.pause(interval_s, lambda: self._stopping)
            if self._stopping:
                return
            try:
                members = await adiscover([*self.active_clients(), *self._seeds])
            except ClientError as exc:
                cluster_log.warning("re-discovering the proxies of %r failed: %s", self.group, exc)
                continue
            if members:
                self.use_servers(members)
