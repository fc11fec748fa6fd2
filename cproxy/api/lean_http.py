"""Every endpoint answered from uvicorn's HTTP protocol, below ASGI (the uvicorn hook).

At batch 10 a produce or a pull carries ten messages, and uvicorn's ASGI cycle per request
(a scope, a ``RequestResponseCycle``, ``receive`` and ``send`` messages, two socket writes)
was about a quarter of the server's CPU (old journal, round 8). ``LeanHttpProtocol``
is uvicorn's httptools protocol with one change: a request the route table knows
(``endpoint.RouteTable``: the router's own routes) gets a ``LeanCycle``, which hands the
parsed headers and body to the endpoint's ``respond`` (the same prologue and answers as
through ASGI) and writes its answer with one write. The connection stays uvicorn's:
keep-alive and its timeout, pipelining, flow control, ``Expect: 100-continue``, graceful
shutdown. Anything else (``/docs``, ``/openapi.json``, unknown paths, other methods) goes
through ASGI.

It subclasses uvicorn's private classes, so ``protocol_for`` checks first that they are as
this module expects (``incompatibility``: uvicorn's source, read once at start) and falls
back to uvicorn's own protocol with one WARNING when they are not. ``CPROXY_LEAN_HTTP=0`` in
the environment turns the hook off (the suite runs both ways: .ci/run). With a concurrency
limit or a root path the protocol leaves everything to ASGI.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import re
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

from .endpoint import Disconnected, Endpoint, RouteTable, too_large

logger = logging.getLogger(__name__)

#: ``(method, path, status, content type, body)`` of each answer made here (tests record them).
Observer = Callable[[str, str, int, str, bytes], None]

try:
    import httptools
    from uvicorn.protocols.http.httptools_impl import (
        STATUS_LINE,
        HttpToolsProtocol,
        RequestResponseCycle,
    )
except ImportError:  # pragma: no cover - httptools is a dependency; uvicorn may move things
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
#: What uvicorn's protocol reads on a cycle: all a ``LeanCycle`` provides (uvicorn 0.54).
_CYCLE_USE = frozenset(
    {"body", "disconnected", "keep_alive", "message_event", "more_body", "response_complete",
     "run_asgi"}
)  # fmt: skip
#: What this module reads or calls on the protocol (each must be one of its own).
_PROTOCOL_USE = frozenset(
    {"app", "connection_lost", "cycle", "expect_100_continue", "flow", "headers",
     "limit_concurrency", "logger", "loop", "on_headers_complete", "on_response_complete",
     "parser", "pipeline", "root_path", "server_state", "tasks", "transport", "url"}
)  # fmt: skip


def incompatibility() -> str | None:
    """What in uvicorn's httptools protocol is not as ``LeanHttpProtocol`` expects (read
    from its source), or None when all is: the protocol reads no other attribute of a cycle
    than ``_CYCLE_USE``, has everything of ``_PROTOCOL_USE``, and its status lines and
    default headers are where they were."""
    if HttpToolsProtocol is None:
        return "uvicorn's httptools protocol cannot be imported"
    try:
        source = inspect.getsource(HttpToolsProtocol)
    except (OSError, TypeError) as exc:
        return f"its source cannot be read ({exc})"
    used = set(re.findall(r"\bcycle\.(\w+)", source)) - _CYCLE_USE
    if used:
        return f"it uses cycle attribute(s) {sorted(used)} that LeanCycle lacks"
    defined = set(re.findall(r"\bself\.(\w+)", source)) | set(dir(HttpToolsProtocol))
    missing = _PROTOCOL_USE - defined
    if missing:
        return f"it lacks {sorted(missing)}"
    if "default_headers" not in source and "default_headers" not in inspect.getsource(
        RequestResponseCycle
    ):
        return "server_state.default_headers is gone"
    if not isinstance(STATUS_LINE, dict) or 200 not in STATUS_LINE:
        return "STATUS_LINE is not a table of status lines"
    return None


def protocol_for(app: Any, observe: Observer | None = None) -> type[asyncio.Protocol] | str:
    """The ``http`` setting of ``uvicorn.Config`` serving ``app``: the lean protocol bound
    to ``app``'s state and route table; uvicorn's own (``"auto"``) with ``CPROXY_LEAN_HTTP=0``
    or, after one WARNING, when uvicorn's internals are not as expected."""
    if os.environ.get("CPROXY_LEAN_HTTP", "1") == "0":
        logger.info("lean HTTP protocol off (CPROXY_LEAN_HTTP=0): every call through ASGI")
        return "auto"
    problem = incompatibility()
    if problem is not None:
        logger.warning(
            "lean HTTP protocol off, every call through ASGI: uvicorn's httptools protocol "
            "is not as tested (%s)",
            problem,
        )
        return "auto"
    attributes = {"lean_state": app.state, "table": RouteTable(app.router.routes)}
    return type("LeanHttpProtocol", (LeanHttpProtocol,), {**attributes, "observe": observe})


if HttpToolsProtocol is not None:

    class LeanHttpProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol; known routes get a ``LeanCycle`` instead of ASGI."""

        #: The app's state (settings, broker, authorizer), set by ``protocol_for``.
        lean_state: Any = None
        table: RouteTable
        observe: Observer | None = None

        def on_headers_complete(self) -> None:
            if (
                self.limit_concurrency is None
                and not self.root_path
                and not self.parser.should_upgrade()
            ):
                parsed = httptools.parse_url(self.url)
                path = parsed.path.decode("ascii")
                if "%" in path:
                    path = urllib.parse.unquote(path)
                found = self.table.find(self.parser.get_method(), path)
                if found is not None:
                    self._start_lean(path, parsed.query or b"", *found)
                    return
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            cycle = self.cycle
            super().connection_lost(exc)  # marks an unanswered cycle disconnected
            if isinstance(cycle, LeanCycle) and cycle.disconnected:
                cycle.client_gone()

        def _start_lean(
            self, path: str, query: bytes, endpoint: Endpoint, params: dict[str, str]
        ) -> None:
            keep_alive = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
            cycle = LeanCycle(self, path, query, endpoint, params, keep_alive)
            existing = self.cycle
            self.cycle = cycle
            if existing is None or existing.response_complete:
                task = self.loop.create_task(cycle.run_asgi(self.app))
                task.add_done_callback(self.tasks.discard)
                self.tasks.add(task)
            else:  # pipelined: started by on_response_complete, as uvicorn's own cycles
                self.flow.pause_reading()
                self.pipeline.appendleft((cycle, self.app))

    class LeanCycle(RequestResponseCycle):
        """One request to an endpoint. Has what the protocol reads and sets on a cycle (``body``,
        ``more_body``, ``message_event``, ``disconnected``, ``keep_alive``,
        ``response_complete``) and ``run_asgi``, by which the protocol starts it; is the
        ``Exchange`` the endpoint reads. No scope, no ASGI messages; a waiting pull learns
        that its client has gone from the protocol's ``connection_lost``, not from a task
        waiting for it."""

        def __init__(
            self,
            protocol: LeanHttpProtocol,
            path: str,
            query: bytes,
            endpoint: Endpoint,
            params: dict[str, str],
            keep_alive: bool,
        ) -> None:
            # RequestResponseCycle.__init__ is not called: it builds the ASGI state.
            self.transport = protocol.transport
            self.flow = protocol.flow
            self.logger = protocol.logger
            self.default_headers = protocol.server_state.default_headers
            self.message_event = asyncio.Event()
            self.on_response = protocol.on_response_complete
            self.disconnected = False
            self.keep_alive = keep_alive
            self.waiting_for_100_continue = protocol.expect_100_continue
            self.body = bytearray()
            self.more_body = True
            self.response_started = False
            self.response_complete = False
            self.path = path
            self.query_string = query
            self.headers: Iterable[tuple[bytes, bytes]] = protocol.headers
            self._endpoint = endpoint
            self._params = params
            self._state = protocol.lean_state
            self._observe = protocol.observe
            self._on_gone: Callable[[], None] | None = None
            self.peer = protocol.client[0] if protocol.client else None

        # -- Exchange ------------------------------------------------------------------------
        async def read_body(self, max_bytes: int) -> bytes:
            if self.waiting_for_100_continue and not self.transport.is_closing():
                self.transport.write(_CONTINUE)
            self.waiting_for_100_continue = False
            while True:
                if self.disconnected:
                    raise Disconnected
                if len(self.body) > max_bytes:
                    raise too_large(len(self.body), max_bytes)
                if not self.more_body:
                    return bytes(self.body)
                self.flow.resume_reading()  # the protocol pauses reading past 64 KiB held
                await self.message_event.wait()
                self.message_event.clear()

        def watch_gone(self, leave: Callable[[], None]) -> Callable[[], object]:
            if self.disconnected:
                leave()
                return _nothing
            self._on_gone = leave
            return self._unwatch

        def _unwatch(self) -> None:
            self._on_gone = None

        def client_gone(self) -> None:
            """The connection was lost before the answer (``LeanHttpProtocol``)."""
            leave, self._on_gone = self._on_gone, None
            if leave is not None:
                leave()

        # -- the cycle -----------------------------------------------------------------------
        async def run_asgi(self, app: Any) -> None:  # the name the protocol calls
            try:
                reply = await self._endpoint.respond(self._state, self._params, self)
                if reply is not None:
                    await self._write(*reply)
            except BaseException:
                # respond() renders every error: this is a failed write or a cancellation.
                self.transport.close()
                raise
            finally:
                self.on_response = _nothing  # no reference back to the protocol

        async def _write(
            self, status: int, headers: list[tuple[bytes, bytes]], body: bytes
        ) -> None:
            if self.flow.write_paused and not self.disconnected:
                await self.flow.drain()
            if self.disconnected:
                return
            content = [STATUS_LINE[status]]
            for name, value in self.default_headers:
                content += (name, b": ", value, b"\r\n")
            for name, value in headers:
                content += (name, b": ", value, b"\r\n")
            if not self.keep_alive:
                content.append(b"connection: close\r\n")
            content += (b"\r\n", body)
            self.transport.write(b"".join(content))
            self.response_started = self.response_complete = True
            self.message_event.set()
            if self._observe is not None:
                content_type = next((v for n, v in headers if n == b"content-type"), b"")
                method = self._endpoint.method
                self._observe(method, self.path, status, content_type.decode(), body)
            if not self.keep_alive:
                self.transport.close()
            self.on_response()


def _nothing() -> None:
    pass
