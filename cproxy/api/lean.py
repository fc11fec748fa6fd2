"""The hot calls (produce, pull, ack) as plain ASGI endpoints.

A FastAPI route costs dependency solving, a pydantic pass over the parsed body, a ``Request``
and a ``Response`` object and six middleware layers per call, a third of the server's time at
small batches (docs/benchmarks.md). These endpoints do the same work directly:

1. refuse a declared ``Content-Length`` over ``max_request_bytes`` (413), authenticate
   (401), check the media type (415) and read the body within ``max_request_bytes`` (413),
   as ``BodyLimit`` and ``CproxyRoute`` do for the other routes;
2. decode and validate in one msgspec pass (``bodies``): 400 for a missing body or bytes
   that are not JSON, 403 for the path's topic/group (``auth.check_path``), 422 with the
   same one-line ``where: what`` messages for a body of the wrong shape;
3. call the broker and send the answer as bytes built once (no ``Response`` object).

``CproxyApp`` (``app.py``) sends ``POST`` requests for these paths here before its middleware
stack; the same endpoints are also in the router (``LeanRoute``), which answers other methods
with 405 and is what ``openapi.py`` documents. Errors are rendered by ``errors.render``, so
they look exactly like those of every other route.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar

import msgspec
import orjson
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from cproxy.broker import Broker, Output, WatchGone, watch_with_task
from cproxy.config import Limits
from cproxy.errors import CproxyError, TooLarge
from cproxy.tokens import Token

from . import errors, items, wire
from .auth import Action, Authorizer, check_path
from .bodies import Ack, Produce, Pull
from .errors import BadBody
from .limits import too_large_message
from .produced import new_messages
from .routing import check_media_type

logger = logging.getLogger(__name__)

B = TypeVar("B", bound=msgspec.Struct)

#: ``(app state, path parameters, token, decoded body, body bytes, watch_gone) -> JSON answer
#: bytes``; ``watch_gone`` tells a long poll that its client has gone (``Exchange``).
Handler = Callable[[Any, dict[str, str], Token | None, B, bytes, WatchGone], Awaitable[bytes]]
#: ``(status, headers, body)``: a whole answer; the headers include ``content-length``.
Reply = tuple[int, list[tuple[bytes, bytes]], bytes]

_JSON_HEADERS = [(b"content-type", b"application/json")]
_AT = re.compile(r"^(.*) - at `\$(.*)`$", re.DOTALL)
_INDEX = re.compile(r"\[(\d+)\]")


def describe(exc: msgspec.ValidationError) -> str:
    """msgspec's "Expected `int`, got `str` - at `$.messages[0].qid`" as the API's
    "messages.0.qid: Expected `int`, got `str`" (the path first, as for every 422)."""
    text = str(exc)
    found = _AT.match(text)
    if found is None:
        return f"body: {text}"
    where = _INDEX.sub(r".\1", found.group(2)).lstrip(".")
    return f"{where or 'body'}: {found.group(1)}"


class LeanEndpoint(Generic[B]):
    """One hot call as a raw ASGI app: checks in the order other routes make them, then
    ``handler``. Not a function, so Starlette's ``Route`` mounts it as ASGI as it is."""

    def __init__(self, name: str, action: Action, body: type[B], handler: Handler[B]) -> None:
        self.name = name
        self.action = action
        self.body = body
        self.handler = handler
        self._decoder = msgspec.json.Decoder(body)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        reply = await self.respond(scope["app"].state, scope["path_params"], _Asgi(scope, receive))
        if reply is not None:
            status, headers, body = reply
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})

    async def respond(self, state: Any, params: dict[str, str], request: Exchange) -> Reply | None:
        """The whole answer to ``request`` (errors rendered as every other route renders
        them); ``None`` when the client went away before its body was read."""
        try:
            answer = await self._answer(state, params, request)
        except (CproxyError, BadBody) as exc:
            return _reply(errors.render(exc, "POST", request.path))
        except Disconnected:
            return None
        except Exception:
            logger.exception("unhandled error on POST %s", request.path)
            return _reply(wire.error(500, "internal_error", "internal error; see the server log"))
        return 200, [*_JSON_HEADERS, (b"content-length", b"%d" % len(answer))], answer

    async def _answer(self, state: Any, params: dict[str, str], request: Exchange) -> bytes:
        authorization = content_type = length = None
        for name, value in request.headers:
            if name == b"authorization":
                authorization = value
            elif name == b"content-type":
                content_type = value
            elif name == b"content-length":
                length = value
        max_bytes = state.settings.limits.max_request_bytes
        if length is not None and length.isdigit() and int(length) > max_bytes:
            # Before authenticating, as the BodyLimit middleware of the other routes does.
            raise TooLarge(too_large_message(int(length), max_bytes))
        authorizer: Authorizer = state.authorizer
        token = authorizer.identify(
            authorization.decode("latin-1") if authorization is not None else None
        )
        check_media_type(content_type or b"")
        raw = await request.read_body(max_bytes)
        body: B | None = None
        problem: BadBody | None = None
        try:
            body = self._decoder.decode(raw)
        except msgspec.ValidationError as exc:
            problem = _shape_error(raw, exc)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            problem = _not_json(raw)
        if problem is not None and problem.status == 400:
            raise problem
        broker: Broker = state.broker
        check_path(authorizer, broker, token, self.action, params)
        if problem is not None:
            raise problem
        assert body is not None
        return await self.handler(state, params, token, body, raw, request.watch_gone)


def _reply(response: Response) -> Reply:
    return response.status_code, response.raw_headers, bytes(response.body)


class Disconnected(Exception):
    """The client went away before its body was read: nothing to answer."""


class Exchange(Protocol):
    """One request as a lean endpoint sees it: from ASGI (``_Asgi``) or straight from the
    HTTP protocol (``lean_http``)."""

    @property
    def path(self) -> str: ...

    @property
    def headers(self) -> Iterable[tuple[bytes, bytes]]:
        """Names lower-cased, as ASGI gives them."""

    async def read_body(self, max_bytes: int) -> bytes:
        """The whole body; ``TooLarge`` past ``max_bytes``, ``Disconnected`` if the client
        went away first."""

    def watch_gone(self, leave: Callable[[], None]) -> Callable[[], object]:
        """Have ``leave()`` called once the client has gone (only after the body was
        read); returns a function that stops watching (``cproxy.broker.waiters.WatchGone``)."""


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
                    raise TooLarge(too_large_message(size, max_bytes))
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


def _not_json(raw: bytes) -> BadBody:
    if not raw:
        return BadBody(400, "missing_body", "this call needs a JSON request body")
    return BadBody(400, "invalid_json", "the request body is not valid JSON")


def _shape_error(raw: bytes, exc: msgspec.ValidationError) -> BadBody:
    """msgspec stops at the first wrong field, possibly before bytes that are not JSON at
    all: the body is parsed once more (only on this error path) so that those stay a 400."""
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _not_json(raw)
    return BadBody(422, "validation_error", describe(exc))


# -- the three calls -----------------------------------------------------------------------------


def _check_count(count: int, limits: Limits) -> None:
    """413 for more messages in one call than ``max_messages_per_call``."""
    if count > limits.max_messages_per_call:
        raise TooLarge(f"{count} messages in one call; the limit is {limits.max_messages_per_call}")


async def _produce(
    state: Any,
    params: dict[str, str],
    token: Token | None,
    body: Produce,
    raw: bytes,
    watch_gone: WatchGone,
) -> bytes:
    limits: Limits = state.settings.limits
    _check_count(len(body.messages), limits)
    broker: Broker = state.broker
    messages, delays = new_messages(body.messages, limits, raw)
    stored = await broker.produce(params["topic"], messages, delays)
    return wire.produce_answer(stored)


async def _pull(
    state: Any,
    params: dict[str, str],
    token: Token | None,
    body: Pull,
    raw: bytes,
    watch_gone: WatchGone,
) -> bytes:
    authorizer: Authorizer = state.authorizer
    authorizer.check_topics(token, [*(body.topics or ()), *(r.topic for r in body.results)])
    broker: Broker = state.broker
    answer = await broker.pull(
        params["group"],
        body.max_messages,
        body.wait_ms,
        body.topics,
        items.results(body.results),
        body.max_per_key,
        gone=watch_gone,
    )
    return wire.pull_answer(answer, runs=body.max_per_key > 1)


async def _ack(
    state: Any,
    params: dict[str, str],
    token: Token | None,
    body: Ack,
    raw: bytes,
    watch_gone: WatchGone,
) -> bytes:
    authorizer: Authorizer = state.authorizer
    authorizer.check_topics(token, [r.topic for r in body.results])
    broker: Broker = state.broker
    if body.produce is not None:
        return await _ack_produce(state, params["group"], token, body, raw)
    return orjson.dumps(wire.outcome(broker.ack(params["group"], items.results(body.results))))


async def _ack_produce(state: Any, group: str, token: Token | None, body: Ack, raw: bytes) -> bytes:
    """An ack with outputs (guarantee 10): produce rights on every output topic, and the
    produce call's limits over all of its messages together."""
    assert body.produce is not None
    authorizer: Authorizer = state.authorizer
    for out in body.produce:
        authorizer.check(token, "produce", [out.topic])
    limits: Limits = state.settings.limits
    _check_count(sum(len(out.messages) for out in body.produce), limits)
    outputs = [Output(out.topic, *new_messages(out.messages, limits, raw)) for out in body.produce]
    broker: Broker = state.broker
    outcome, stored = await broker.ack_with_outputs(group, items.results(body.results), outputs)
    return wire.ack_produced(outcome, [out.topic for out in outputs], stored)


class LeanRoute(Route):
    """A router entry for a lean endpoint: 405 for other methods; documented by
    ``openapi.build`` with ``summary``, ``tags`` and the body's msgspec schema."""

    def __init__(self, path: str, endpoint: LeanEndpoint[Any], summary: str, tag: str) -> None:
        super().__init__(path, endpoint, methods=["POST"], name=summary)
        self.lean = endpoint
        self.summary = summary
        self.tag = tag


PRODUCE = LeanEndpoint("produce", "produce", Produce, _produce)
PULL = LeanEndpoint("pull", "use_group", Pull, _pull)
ACK = LeanEndpoint("ack", "use_group", Ack, _ack)

ROUTES = [
    LeanRoute(
        "/v1/topics/{topic}/messages", PRODUCE, "Produce messages (atomic per call)", "topics"
    ),
    LeanRoute("/v1/groups/{group}/pull", PULL, "Apply results, then pull (long poll)", "groups"),
    LeanRoute(
        "/v1/groups/{group}/ack",
        ACK,
        "Apply acks and fails; with produce, store outputs in the same transaction",
        "groups",
    ),
]


def match(scope: Scope) -> tuple[LeanEndpoint[Any], dict[str, str]] | None:
    """The lean endpoint for a ``POST`` to one of the hot paths, and its path parameters.

    Only plain paths are matched here (no root path); anything else goes through the
    router, which has the same endpoints."""
    if scope["method"] != "POST" or scope.get("root_path"):
        return None
    return match_path(scope["path"])


def match_path(path: str) -> tuple[LeanEndpoint[Any], dict[str, str]] | None:
    """The lean endpoint for a ``POST`` to ``path`` (already percent-decoded), if any."""
    parts = path.split("/")
    if len(parts) != 5 or parts[0] or parts[1] != "v1" or not parts[3]:
        return None
    if parts[2] == "topics" and parts[4] == "messages":
        return PRODUCE, {"topic": parts[3]}
    if parts[2] == "groups":
        if parts[4] == "pull":
            return PULL, {"group": parts[3]}
        if parts[4] == "ack":
            return ACK, {"group": parts[3]}
    return None
