"""Push delivery: the proxy POSTs a group's deliveries to an HTTP endpoint.

A ``PushLane`` is a consumer living inside the broker, one per topic entry with ``push``
settings, run as a task of its ``GroupRunner``. It takes deliveries through the same engine
verbs as a pulling consumer (``GroupRunner.pull`` with ``max_messages`` = its free slots,
then fenced ``Result`` s), so every delivery guarantee holds unchanged (docs/guarantees.md):
the next message of a chain is handed out only after the previous one is finished, and a
slow or failing endpoint holds only the keys it is slow on, while the other slots move on.

Each delivery (one message, or one order value's run with ``max_per_key`` > 1) is one
``POST {"messages": [...]}`` in the pull response's message shape (``message_json``):

- a 2xx answer acks the messages;
- another status, or no answer within ``timeout_ms``, fails the delivery (an attempt is
  charged: the message is retried after the group's backoff, then dead-lettered);
- a transport error (connection refused or reset, connect timeout) means the messages never
  arrived: they go back uncharged (``GroupEngine.release_uncharged``) and the lane pauses
  with exponential backoff (``PAUSE_MIN_MS`` doubling to ``PAUSE_MAX_MS``). After a pause it
  probes with a single message and resumes fully at the first answer of any status. One log
  line when it pauses, one when it resumes: never one per message.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import socket
import ssl
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

import anyio
import orjson
from anyio.abc import TaskGroup

from cproxy.engine.push_config import PushConfig
from cproxy.engine.records import Result
from cproxy.engine.snapshots import Handout, Outcome
from cproxy.model import MessageRef
from cproxy.push_targets import PushTargets

from .clock import now_ms
from .message_json import delivery_json

if TYPE_CHECKING:  # imported when a lane starts: most servers push nothing (~6 MiB)
    import aiohttp
    import aiohttp.abc

logger = logging.getLogger(__name__)

#: First pause after a transport error (ms); it doubles per failed probe up to ``PAUSE_MAX_MS``.
PAUSE_MIN_MS: Final = 100
PAUSE_MAX_MS: Final = 10_000
#: How long one long poll for new deliveries waits before the lane re-checks its state (ms).
PULL_WAIT_MS: Final = 1000
SIGNATURE_HEADER: Final = "X-Cproxy-Signature"


def signature(secret: str, body: bytes) -> str:
    """The ``X-Cproxy-Signature`` value of ``body``: ``sha256=<hex HMAC-SHA256>``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


#: W3C Trace Context: message headers a push request carries as HTTP headers too, so an
#: instrumented endpoint continues the producer's trace (DESIGN §6).
TRACE_HEADERS = ("traceparent", "tracestate")


def trace_headers(headers_json: bytes | None) -> dict[str, str]:
    """The trace context among a message's headers (as stored: JSON bytes); parsed only
    when it is there."""
    if headers_json is None or b"traceparent" not in headers_json:
        return {}
    headers = orjson.loads(headers_json)
    return {
        name: value
        for name in TRACE_HEADERS
        if isinstance(headers, dict) and isinstance(value := headers.get(name), str)
    }


class Pulled(Protocol):
    """What a pull hands back (``Pulled``)."""

    @property
    def deliveries(self) -> list[Handout]: ...


class PushSource(Protocol):
    """What a lane needs from its group (``GroupRunner`` provides it)."""

    name: str

    @property
    def stopping(self) -> bool: ...

    async def pull(
        self,
        max_messages: int,
        wait_ms: int,
        topics: Collection[str] | None,
        results: Sequence[Result],
        max_per_key: int = 1,
    ) -> Pulled: ...

    def apply(self, results: Iterable[Result]) -> Outcome: ...

    def release_uncharged(
        self, refs: Iterable[MessageRef], attempts: Mapping[MessageRef, int]
    ) -> Outcome: ...


@dataclass(frozen=True, slots=True)
class PushStats:
    """A push lane's state for the group's stats (``GET /v1/groups/{group}``)."""

    topic: str
    url: str
    #: Messages POSTed and not answered yet.
    in_flight: int
    #: Set while the endpoint is unreachable: when the next probe may go out (ms since the
    #: epoch; it stays set, in the past, while that probe is under way). None when healthy.
    paused_until_ms: int | None
    #: The last failure (status, timeout or transport error), None until one happens.
    last_error: str | None


class _Transport(Exception):
    """The request did not reach the endpoint (or no answer could come back)."""


class PushLane:
    """Pushes the deliveries of one topic of a group to its endpoint."""

    def __init__(
        self, source: PushSource, topic: str, config: PushConfig, targets: PushTargets
    ) -> None:
        self._source = source
        self._targets = targets
        self.topic = topic
        self.config = config
        self._in_flight = 0
        self._slot_freed = anyio.Event()
        self._paused_until_ms: int | None = None
        #: Consecutive pauses; 0 when the endpoint answers.
        self._failures = 0
        self._last_error: str | None = None
        self._headers = {"content-type": "application/json", **config.headers}

    def stats(self) -> PushStats:
        return PushStats(
            self.topic, self.config.url, self._in_flight, self._paused_until_ms, self._last_error
        )

    @property
    def _probing(self) -> bool:
        return self._failures > 0

    async def run(self) -> None:
        """Push until the group stops; requests under way are awaited, not abandoned."""
        pool = _Connections(self.config, self._targets)
        async with pool, anyio.create_task_group() as tg:
            while not self._source.stopping:
                await self._fill(pool, tg)

    async def _fill(self, pool: _Connections, tg: TaskGroup) -> None:
        """Wait until the lane may push, take deliveries for its free slots and send them."""
        paused = self._paused_until_ms
        if paused is not None and (wait := paused - now_ms()) > 0:
            await anyio.sleep(wait / 1000)
            return
        free = self.config.max_in_flight - self._in_flight
        if self._probing:  # one message at a time until the endpoint answers again
            free = 1 if self._in_flight == 0 else 0
        if free <= 0:
            freed = self._slot_freed
            with anyio.move_on_after(PULL_WAIT_MS / 1000):
                await freed.wait()
            return
        pulled = await self._source.pull(
            free, PULL_WAIT_MS, [self.topic], (), self.config.max_per_key
        )
        deliveries = pulled.deliveries
        if not deliveries:
            return
        paused = self._paused_until_ms
        if paused is not None and paused > now_ms():
            # A request under way found the endpoint gone while this pull waited.
            self._release(deliveries)
            return
        for run in _runs(deliveries):
            self._in_flight += len(run)
            tg.start_soon(self._push, pool, run)

    async def _push(self, pool: _Connections, run: list[Handout]) -> None:
        try:
            await self._push_one(pool, run)
        finally:
            self._in_flight -= len(run)
            event, self._slot_freed = self._slot_freed, anyio.Event()
            event.set()

    async def _push_one(self, pool: _Connections, run: list[Handout]) -> None:
        runs = self.config.max_per_key > 1
        body = orjson.dumps({"messages": [delivery_json(d, runs) for d in run]})
        headers = dict(self._headers)
        for name, value in trace_headers(run[0].message.headers_json).items():
            headers.setdefault(name, value)
        if self.config.secret is not None:
            headers[SIGNATURE_HEADER] = signature(self.config.secret, body)
        try:
            status = await pool.post(body, headers)
        except _Transport as exc:
            self._release(run)
            self._pause(str(exc))
            return
        self._resume()
        if status is not None and 200 <= status < 300:
            self._source.apply(_results(run, ack=True, error=None))
            return
        error = (
            f"push timed out after {self.config.timeout_ms} ms"
            if status is None
            else f"push endpoint answered HTTP {status}"
        )
        self._last_error = error
        logger.debug(
            "group=%s topic=%s push failed offset=%d attempt=%d: %s",
            self._source.name,
            self.topic,
            run[0].message.offset,
            run[0].attempt,
            error,
        )
        # Failing the run's first message sends the rest back behind it, uncharged.
        self._source.apply(_results(run[:1], ack=False, error=error))

    def _release(self, deliveries: Sequence[Handout]) -> None:
        attempts = {d.message.ref: d.attempt for d in deliveries}
        self._source.release_uncharged(list(attempts), attempts)

    def _pause(self, error: str) -> None:
        now = now_ms()
        self._last_error = error
        if self._paused_until_ms is not None and self._paused_until_ms > now:
            return  # another request already paused the lane
        self._failures += 1
        delay = min(PAUSE_MAX_MS, PAUSE_MIN_MS * 2 ** min(self._failures - 1, 20))
        self._paused_until_ms = now + delay
        if self._failures == 1:
            logger.warning(
                "group=%s topic=%s push endpoint %s unreachable, pausing pushes: %s",
                self._source.name,
                self.topic,
                self.config.url,
                error,
            )
        else:
            logger.debug(
                "group=%s topic=%s push probe failed, next in %d ms",
                self._source.name,
                self.topic,
                delay,
            )

    def _resume(self) -> None:
        """The endpoint answered (any status): push at full width again."""
        if self._failures:
            logger.info(
                "group=%s topic=%s push endpoint %s reachable again after %d failed probe(s)",
                self._source.name,
                self.topic,
                self.config.url,
                self._failures,
            )
            self._failures = 0
            self._paused_until_ms = None


class _Connections:
    """Keep-alive connections to the endpoint: one aiohttp session, at most ``max_in_flight``.

    aiohttp rather than httpx: on loopback an httpx request cost about 1.5 ms of CPU even
    with one single-connection client per slot (a shared httpx pool was slower still under
    concurrency), an aiohttp request about 0.2 ms; push sends one request
    per delivery, so this is its whole cost (docs/benchmarks.md, push delivery).
    """

    def __init__(self, config: PushConfig, targets: PushTargets) -> None:
        import aiohttp

        self._url = config.url
        #: A URL under ``[push] allowed_urls`` is the operator's: connected as it is. Any
        #: other is checked again at every connection (``_GuardedResolver``: DNS rebinding).
        self._targets = None if targets.listed(config.url) else targets
        self._refusal = None if self._targets is None else targets.connect_refusal(config.url)
        timeout_s = config.timeout_ms / 1000
        self._timeout_s = timeout_s
        # A connection not made within 90% of the budget counts as unreachable (uncharged),
        # not as a slow answer; the whole request is still bounded by ``timeout_ms``.
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=timeout_s * 0.9)
        self._limit = config.max_in_flight
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> _Connections:
        import aiohttp

        # One TLS context for all connections: building one loads the CA bundle (~40 ms).
        connector = aiohttp.TCPConnector(
            limit=self._limit,
            ssl=ssl.create_default_context(),
            resolver=None if self._targets is None else _guarded_resolver(self._targets),
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, trust_env=False, auto_decompress=False
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            with anyio.CancelScope(shield=True):
                await self._session.close()

    async def post(self, body: bytes, headers: Mapping[str, str]) -> int | None:
        """The answer's status; None when ``timeout_ms`` passed; raises ``_Transport``."""
        import aiohttp

        assert self._session is not None, "used outside its context"
        if self._refusal is not None:  # an internal IP literal: never resolved, so refused here
            raise _Transport(self._refusal)
        try:
            with anyio.fail_after(self._timeout_s):
                # A redirect is not followed: a 3xx is an answer like any non-2xx (a fail).
                async with self._session.post(
                    self._url, data=body, headers=headers, allow_redirects=False
                ) as answer:
                    await answer.read()
                    return answer.status
        except aiohttp.ConnectionTimeoutError as exc:  # no connection made: unreachable
            raise _Transport(f"connect timeout: {exc}".rstrip(": ")) from exc
        except TimeoutError:  # includes aiohttp's read timeouts
            return None
        except aiohttp.ClientConnectorError as exc:  # refused, unreachable, DNS
            raise _Transport(f"ConnectError: {exc}") from exc
        except aiohttp.ClientError as exc:  # reset, disconnected, protocol error
            raise _Transport(f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc


def _guarded_resolver(targets: PushTargets) -> aiohttp.abc.AbstractResolver:
    """aiohttp's resolver for an unlisted push URL: every connection resolves the name
    through ``PushTargets.guarded_addresses``, which refuses internal addresses (an
    ``OSError``: a transport error, so the lane pauses and nothing is charged)."""
    import aiohttp.abc

    class GuardedResolver(aiohttp.abc.AbstractResolver):
        async def resolve(
            self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
        ) -> list[aiohttp.abc.ResolveResult]:
            found = await targets.guarded_addresses(host, port, family)
            numeric = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV
            return [
                {
                    "hostname": host,
                    "host": address,
                    "port": port,
                    "family": fam,
                    "proto": 0,
                    "flags": numeric,
                }
                for fam, address in found
            ]

        async def close(self) -> None:
            pass

    return GuardedResolver()


def _runs(deliveries: Sequence[Handout]) -> list[list[Handout]]:
    """Split a pull's answer into requests: each same-key run together, in order."""
    out: dict[int, list[Handout]] = {}
    for d in deliveries:
        out.setdefault(d.run, []).append(d)
    return list(out.values())


def _results(run: Sequence[Handout], *, ack: bool, error: str | None) -> list[Result]:
    """Fenced results for ``run`` (each names the attempt it answers), one per queue."""
    by_queue: dict[int, list[Handout]] = {}
    for d in run:
        by_queue.setdefault(d.message.qid, []).append(d)
    results = []
    for qid, items in by_queue.items():
        offsets = [d.message.offset for d in items]
        attempts = {d.message.offset: d.attempt for d in items}
        topic = items[0].message.topic
        if ack:
            results.append(Result(topic, qid, acks=offsets, attempts=attempts))
        else:
            results.append(
                Result(topic, qid, fails=[(o, error) for o in offsets], attempts=attempts)
            )
    return results
