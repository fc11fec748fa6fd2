"""The one request path: every route of the API is an ``Endpoint``, a plain ASGI app under
the router (Starlette's design), and every one runs the same prologue in the same order
(DESIGN §4, Auth):

1. a declared ``Content-Length`` over ``max_request_bytes``: 413;
2. the token: exactly one ``Authorization`` header naming a configured bearer token, else
   401 (``Authorizer.identify``; skipped by the public routes: probes, metrics, console);
3. for a call with a body: the media type (415), the body read within
   ``max_request_bytes`` (413, chunked bodies too), decoded and validated in one msgspec
   pass against the endpoint's ``body`` type (400 not JSON or missing, 422 wrong shape);
   a ``query`` type likewise from the query string (422). ``errors.bad_body`` is the one
   translator of decoding errors;
4. the path's topic/group (403, ``auth.check_path``); the handler checks the topics and
   groups its body names (``Call.check_topics``);
5. the handler. Its answer (bytes: a 200 JSON answer; or a whole ``Reply``) and any error
   are rendered by ``errors``, the one renderer; anything unexpected is the one 500.

The router (``app.router``) is the one place that decides routing: through ASGI it
dispatches as it does for any route; the lean HTTP protocol (``lean_http``) looks requests
up in the same route table (``RouteTable``), without building an ASGI scope.

Adding a route: a handler ``async def h(call: Call[Body, Query]) -> bytes | Reply`` and one
``Endpoint(...)`` line in its module's ``ENDPOINTS`` (see ``groups.py``); ``app.py`` mounts
every module's list, ``openapi.py`` documents it from the same declaration.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from re import Pattern
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import parse_qsl

import msgspec
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from cproxy.access import Action, Authorizer
from cproxy.broker import Broker, WatchGone, watch_with_task
from cproxy.errors import CproxyError, TooLarge, UnsupportedMediaType
from cproxy.tokens import Token

from . import errors
from .errors import JSON, BadBody, Reply

logger = logging.getLogger(__name__)

B = TypeVar("B")
Q = TypeVar("Q")

#: Content types read as JSON besides JSON itself: none given, and curl's default for ``-d``
#: (refusing it would only trip up people trying the API).
_READ_AS_JSON = (b"", b"application/x-www-form-urlencoded")


class Call(Generic[B, Q]):
    """One request past the prologue: what a handler gets."""

    __slots__ = ("body", "params", "peer", "query", "raw", "state", "token", "watch_gone")

    def __init__(
        self,
        state: Any,
        params: dict[str, str],
        token: Token | None,
        body: B,
        raw: bytes,
        query: Q,
        watch_gone: WatchGone,
        peer: str | None = None,
    ) -> None:
        #: The app's state: ``settings``, ``broker``, ``authorizer``, ``metrics``, ``cluster``.
        self.state = state
        self.params = params
        self.token = token
        self.body = body
        #: The body's bytes as sent (produce stores message bodies from them).
        self.raw = raw
        self.query = query
        #: Tells a long poll that its client has gone (``Exchange.watch_gone``).
        self.watch_gone = watch_gone
        #: The client's address (group stats name a consumer by it when it sends no id).
        self.peer = peer

    @property
    def broker(self) -> Broker:
        broker: Broker = self.state.broker
        return broker

    @property
    def authorizer(self) -> Authorizer:
        authorizer: Authorizer = self.state.authorizer
        return authorizer

    def check_topics(self, topics: Iterable[str | None]) -> None:
        """403 for a topic named in the body or query outside the token's topic scope."""
        self.state.authorizer.check_topics(self.token, topics)


Handler = Callable[[Call[Any, Any]], Awaitable[bytes | Reply]]


class Disconnected(Exception):
    """The client went away before its body was read: nothing to answer."""


class Exchange(Protocol):
    """One request as an endpoint sees it: from ASGI (``_Asgi``) or straight from the HTTP
    protocol (``lean_http.LeanCycle``)."""

    @property
    def path(self) -> str: ...

    @property
    def headers(self) -> Iterable[tuple[bytes, bytes]]:
        """Names lower-cased, as ASGI gives them."""

    @property
    def query_string(self) -> bytes: ...

    @property
    def peer(self) -> str | None:
        """The client's host, when known."""

    async def read_body(self, max_bytes: int) -> bytes:
        """The whole body; ``TooLarge`` past ``max_bytes``, ``Disconnected`` if the client
        went away first."""

    def watch_gone(self, leave: Callable[[], None]) -> Callable[[], object]:
        """Have ``leave()`` called once the client has gone (only after the body was
        read); returns a function that stops watching (``cproxy.broker.waiters.WatchGone``)."""


def too_large(size: int, max_bytes: int) -> TooLarge:
    """The 413 of a request body of at least ``size`` bytes."""
    return TooLarge(f"request body of {size}+ bytes; the limit is {max_bytes}")


def check_media_type(content_type: bytes) -> None:
    """415 unless the body is declared as JSON (or not declared, or as curl's default)."""
    media = content_type.split(b";")[0].strip().lower()
    if media != b"application/json" and not media.endswith(b"+json") and media not in _READ_AS_JSON:
        raise UnsupportedMediaType(
            f"send JSON (Content-Type: application/json), not {media.decode(errors='replace')}"
        )


class Endpoint:
    """One route: its declaration (method, path, action, body and query types, answers for
    the OpenAPI document) and the one prologue in front of its handler."""

    def __init__(
        self,
        method: str,
        path: str,
        handler: Handler,
        *,
        action: Action | None,
        summary: str,
        answers: dict[int, Any],
        body: Any = None,
        optional_body: bool = False,
        query: type[msgspec.Struct] | None = None,
        errors: tuple[int, ...] = (),
        content_type: str = "application/json",
    ) -> None:
        """``action``: what the token must be allowed on the path (None: a public route);
        ``body``: the request body's type (None: no body is read); ``answers``: status ->
        answer type, and ``errors`` the statuses besides those every call may answer
        (``openapi.py``)."""
        self.method = method
        self.path = path
        self.handler = handler
        self.action = action
        self.summary = summary
        self.answers = answers
        self.body = body
        self.optional_body = optional_body
        self.query = query
        self.errors = errors
        self.content_type = content_type
        self._decoder = None if body is None else msgspec.json.Decoder(body)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """As an ASGI app (mounted by ``route``)."""
        exchange = _Asgi(scope, receive)
        answer = await self.respond(scope["app"].state, scope["path_params"], exchange)
        if answer is not None:
            status, headers, body = answer
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})

    async def respond(self, state: Any, params: dict[str, str], exchange: Exchange) -> Reply | None:
        """The whole answer to the request; None when the client went away first."""
        try:
            answer = await self._answer(state, params, exchange)
        except (CproxyError, BadBody) as exc:
            return errors.render(exc, self.method, exchange.path)
        except Disconnected:
            return None
        except Exception:
            return errors.internal(self.method, exchange.path)
        if type(answer) is bytes:
            return 200, [(b"content-type", JSON), (b"content-length", b"%d" % len(answer))], answer
        assert isinstance(answer, tuple)
        return answer

    async def _answer(
        self, state: Any, params: dict[str, str], exchange: Exchange
    ) -> bytes | Reply:
        authorization = content_type = length = None
        repeated = False
        for name, value in exchange.headers:
            if name == b"authorization":
                repeated = repeated or authorization is not None
                authorization = value
            elif name == b"content-type":
                content_type = value
            elif name == b"content-length":
                length = value
        max_bytes: int = state.settings.limits.max_request_bytes
        if length is not None and length.isdigit() and int(length) > max_bytes:
            raise too_large(int(length), max_bytes)
        authorizer: Authorizer = state.authorizer
        token = None
        if self.action is not None:
            token = authorizer.identify(authorization, repeated)
        body: Any = None
        raw = b""
        if self._decoder is not None:
            check_media_type(content_type or b"")
            raw = await exchange.read_body(max_bytes)
            if raw or not self.optional_body:
                try:
                    body = self._decoder.decode(raw)
                except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
                    raise errors.bad_body(exc, raw) from None
        query: Any = None
        if self.query is not None:
            query = _query(self.query, exchange.query_string)
        if self.action is not None:
            check_path(authorizer, state.broker, token, self.action, params)
        call = Call(state, params, token, body, raw, query, exchange.watch_gone, exchange.peer)
        return await self.handler(call)


def _query(kind: type[msgspec.Struct], query_string: bytes) -> Any:
    pairs = dict(parse_qsl(query_string.decode("latin-1"), keep_blank_values=True))
    try:
        return msgspec.convert(pairs, kind, strict=False)
    except msgspec.ValidationError as exc:
        raise errors.bad_body(exc, None) from None


class _Asgi:
    """An ``Exchange`` over an ASGI scope and receive."""

    __slots__ = ("_receive", "_scope")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self._scope = scope
        self._receive = receive

    @property
    def path(self) -> str:
        path: str = self._scope["path"]
        return path

    @property
    def headers(self) -> Iterable[tuple[bytes, bytes]]:
        headers: Iterable[tuple[bytes, bytes]] = self._scope["headers"]
        return headers

    @property
    def query_string(self) -> bytes:
        query: bytes = self._scope.get("query_string", b"")
        return query

    @property
    def peer(self) -> str | None:
        client = self._scope.get("client")
        return str(client[0]) if client else None

    async def read_body(self, max_bytes: int) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self._receive()
            if message["type"] != "http.request":
                raise Disconnected
            chunk = message.get("body", b"")
            if chunk:
                chunks.append(chunk)
                size += len(chunk)
                if size > max_bytes:
                    raise too_large(size, max_bytes)
            if not message.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def watch_gone(self, leave: Callable[[], None]) -> Callable[[], object]:
        # ASGI says "gone" only to ``receive``: a task waits on it while a pull waits.
        return watch_with_task(self._gone)(leave)

    async def _gone(self) -> None:
        # The body was read: the next message is the end.
        while (await self._receive())["type"] != "http.disconnect":
            pass


def route(endpoint: Endpoint) -> Route:
    """The router's entry for ``endpoint`` (other methods on its path: 405)."""
    return Route(endpoint.path, endpoint, methods=[endpoint.method], name=endpoint.summary)


class RouteTable:
    """The endpoints of a router, for a protocol that looks a request up without an ASGI
    scope (``lean_http``): the router's own routes and path patterns, in its order, so the
    answer is the router's. Recent answers are remembered (a few topics and groups take
    nearly all calls), so a hot call costs a dict lookup, not a regex per route."""

    _REMEMBERED = 4096

    def __init__(self, routes: Iterable[Any]) -> None:
        self._by_method: dict[str, list[tuple[Pattern[str], Endpoint]]] = {}
        for entry in routes:
            endpoint = getattr(entry, "endpoint", None)
            if isinstance(endpoint, Endpoint) and isinstance(entry, Route):
                pair = (entry.path_regex, endpoint)
                self._by_method.setdefault(endpoint.method, []).append(pair)
        self._seen: dict[tuple[bytes, str], tuple[Endpoint, dict[str, str]] | None] = {}

    def find(self, method: bytes, path: str) -> tuple[Endpoint, dict[str, str]] | None:
        """The endpoint for ``method`` (as parsed) on ``path`` and its path parameters (a
        copy: the caller may keep it)."""
        key = (method, path)
        try:
            found = self._seen[key]
        except KeyError:
            if len(self._seen) >= self._REMEMBERED:
                self._seen.clear()
            found = self._seen[key] = self._search(method.decode("ascii"), path)
        if found is None:
            return None
        return found[0], dict(found[1])

    def _search(self, method: str, path: str) -> tuple[Endpoint, dict[str, str]] | None:
        for pattern, endpoint in self._by_method.get(method, ()):
            match = pattern.match(path)
            if match is not None:
                return endpoint, match.groupdict()
        return None


def check_path(
    authorizer: Authorizer,
    broker: Broker,
    token: Token | None,
    action: Action,
    params: Mapping[str, str],
) -> None:
    """Raise ``Forbidden`` unless ``token`` may do ``action`` on the path's topic/group (the
    prologue of every endpoint, below)."""
    if token is None:
        return
    topics: list[str] = [params["topic"]] if "topic" in params else []
    group = params.get("group")
    if group is not None and action == "use_group":
        # A group hands out every topic it reads: the token must cover all of them.
        topics += broker.group_topics(group) or []
    authorizer.check(token, action, topics, group)
