"""What the sync and async clients share: building calls, parsing answers, mapping errors.

Nothing here does I/O (the HTTPX model: one base, two thin transports on top), so the contract
of docs/api.md is encoded exactly once: each operation is a :class:`Call` that knows its method,
path, body, whether it may be repeated, and how to parse its answer; :class:`Client` and
:class:`AsyncClient` only send it. Every ``httpx`` error is translated here, once, into the
:mod:`consumer_sdk.errors` hierarchy with ``raise ... from exc``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Generic, Self, TypeVar

import httpx
import orjson

from consumer_sdk._tls import Verify, certificate_error, certificate_failure, tls_verify
from consumer_sdk._wire import (
    HttpAnswer,
    api_error,
    as_object,
    list_field,
    mapping,
    outgoing_to_wire,
    parse_ack,
    parse_extend,
    parse_group,
    parse_ref,
    parse_send,
    parse_topic,
    produce_to_wire,
    query_params,
    results_to_wire,
    seg,
)
from consumer_sdk.config import RetryPolicy
from consumer_sdk.errors import (
    ApiError,
    ClientError,
    ConnectError,
    ProtocolError,
    RequestTimeout,
    ServiceUnavailable,
    Throttled,
    TransportError,
)
from consumer_sdk.models import (
    AckResult,
    ExtendResult,
    GroupInfo,
    MessageRef,
    OutgoingMessage,
    Produce,
    PullResult,
    QueueResult,
    SendResult,
    TopicInfo,
    message_from_wire,
)

T = TypeVar("T")

#: A blocked chain head: its order value, or ``(qid, offset)``.
BlockedHead = str | tuple[int, int]

_JSON: Final = {"content-type": "application/json", "accept": "application/json"}
#: Never wait longer than this on one ``Retry-After``, whatever the server asks.
MAX_RETRY_AFTER_MS: Final = 30_000


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One HTTP call, before it is sent, with the parser of its answer.

    ``body`` is sent as JSON; ``content`` (already encoded JSON bytes) instead when given.
    ``idempotent`` says whether repeating it after an ambiguous failure (sent, no answer) is
    harmless; calls that are not are retried only when the request provably was not applied.
    """

    method: str
    path: str
    parse: Callable[[Any], T]
    body: Any = None
    content: bytes | None = None
    params: Mapping[str, str] | None = None
    idempotent: bool = True
    timeout_s: float | None = None


class Closing:
    """``with`` support for anything with a ``close()``: the clients and the producers."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncClosing:
    """``async with`` support for anything with an ``aclose()``."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class BaseClient:
    """State and pure helpers shared by :class:`Client` and :class:`AsyncClient`."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None,
        timeout_ms: int,
        retry: RetryPolicy,
        verify: Verify = True,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"server URL must start with http:// or https://, got {url!r}")
        if timeout_ms < 1:
            raise ValueError("timeout_ms must be >= 1")
        self.url = url.rstrip("/")
        self.retry = retry
        #: What the HTTPX client gets as ``verify`` (see :data:`Verify`).
        self._verify = tls_verify(url, verify)
        self._timeout_s = timeout_ms / 1000
        self._headers = dict(_JSON)
        if token:
            self._headers["authorization"] = f"Bearer {token}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- transport boundary ------------------------------------------------------------------
    def _request_args(self, call: Call[Any]) -> dict[str, Any]:
        args: dict[str, Any] = {"timeout": call.timeout_s or self._timeout_s}
        content = self._content(call)
        if content is not None:
            args["content"] = content
        if call.params:
            args["params"] = call.params
        return args

    @staticmethod
    def _content(call: Call[Any]) -> bytes | None:
        if call.content is not None:
            return call.content
        return orjson.dumps(call.body) if call.body is not None else None

    def _translate(self, exc: httpx.HTTPError, call: Call[Any]) -> ClientError:
        where = f"{call.method} {self.url}{call.path}"
        failure = certificate_failure(exc)
        if failure is not None:
            return certificate_error(where, failure)
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
            return ConnectError(f"{where}: cannot connect: {exc}")
        if isinstance(exc, httpx.TimeoutException):
            return RequestTimeout(f"{where}: no answer in time: {exc!r}")
        return TransportError(f"{where}: {type(exc).__name__}: {exc}")

    def _decode(self, response: HttpAnswer, call: Call[Any]) -> Any:
        try:
            data = orjson.loads(response.content) if response.content else None
        except orjson.JSONDecodeError as exc:
            if response.status_code >= 400:
                raise api_error(response, "http_error", response.text[:200] or "no body") from exc
            raise ProtocolError(f"{call.method} {call.path}: answer is not JSON") from exc
        if response.status_code >= 400:
            error = data.get("error") if isinstance(data, dict) else None
            if not isinstance(error, dict):
                error = {}
            raise api_error(
                response,
                str(error.get("code", "http_error")),
                str(error.get("message", response.reason_phrase)),
            )
        return data

    def _retry_delay_ms(
        self, exc: ClientError, call: Call[Any], attempt: int, policy: RetryPolicy
    ) -> float | None:
        """How long to wait before trying ``call`` again, or None to give up."""
        if attempt >= policy.max_attempts or not exc.retryable:
            return None
        # A refused connection, a 503 or a 429 means nothing was applied; anything else
        # (timeout, reset mid-answer, other 5xx) may have been, so only idempotent calls repeat.
        provably_unapplied = isinstance(exc, ConnectError | ServiceUnavailable | Throttled)
        if not (provably_unapplied or call.idempotent):
            return None
        if isinstance(exc, ApiError) and exc.retry_after_ms is not None:
            return min(exc.retry_after_ms, MAX_RETRY_AFTER_MS)
        return policy.backoff_ms(attempt)

    # -- topics ------------------------------------------------------------------------------
    @staticmethod
    def _create_topic(name: str, queues: int) -> Call[TopicInfo]:
        return Call("POST", "/v1/topics", parse_topic, {"name": name, "queues": queues})

    @staticmethod
    def _get_topic(name: str) -> Call[dict[str, Any]]:
        return Call("GET", f"/v1/topics/{seg(name)}", mapping)

    @staticmethod
    def _list_topics() -> Call[list[TopicInfo]]:
        return Call(
            "GET", "/v1/topics", lambda d: [parse_topic(t) for t in list_field(d, "topics")]
        )

    @staticmethod
    def _produce(topic: str, messages: Iterable[OutgoingMessage]) -> Call[list[SendResult]]:
        wire = [outgoing_to_wire(m) for m in messages]
        if not wire:
            raise ValueError("send_batch needs at least one message")
        # Retrying a produce that may have been applied stores it twice, unless every message
        # has an id: then the server's dedup turns the repeat into "duplicate": true.
        all_ids = all(m.get("id") is not None for m in wire)
        count = len(wire)
        return Call(
            "POST",
            f"/v1/topics/{seg(topic)}/messages",
            lambda d: parse_send(d, count),
            # Encoded once, here: a repeat sends the same bytes, also where ``wire`` holds the
            # caller's own dicts (``outgoing_to_wire`` does not copy what needs no change).
            content=orjson.dumps({"messages": wire}),
            idempotent=all_ids,
        )

    @staticmethod
    def _produce_encoded(
        topic: str, encoded: Sequence[bytes], with_ids: bool
    ) -> Call[list[SendResult]]:
        if not encoded:
            raise ValueError("produce_encoded needs at least one message")
        # Spliced, not re-encoded: a repeat sends byte-identical content.
        content = b'{"messages":[' + b",".join(encoded) + b"]}"
        count = len(encoded)
        return Call(
            "POST",
            f"/v1/topics/{seg(topic)}/messages",
            lambda d: parse_send(d, count),
            content=content,
            idempotent=with_ids,
        )

    # -- groups ------------------------------------------------------------------------------
    @staticmethod
    def _group(
        method: str,
        group: str,
        suffix: str = "",
        body: Any = None,
        parse: Callable[[Any], Any] = mapping,
        **kwargs: Any,
    ) -> Call[Any]:
        return Call(method, f"/v1/groups/{seg(group)}{suffix}", parse, body, **kwargs)

    @staticmethod
    def _list_groups() -> Call[list[GroupInfo]]:
        return Call(
            "GET", "/v1/groups", lambda d: [parse_group(g) for g in list_field(d, "groups")]
        )

    def _pull(
        self,
        group: str,
        max_messages: int,
        wait_ms: int,
        topics: Sequence[str] | None,
        results: Sequence[QueueResult],
        max_per_key: int = 1,
        consumer: str | None = None,
    ) -> Call[PullResult]:
        body: dict[str, Any] = {"max_messages": max_messages, "wait_ms": wait_ms}
        if max_per_key > 1:
            body["max_per_key"] = max_per_key
        if consumer is not None:
            body["consumer"] = consumer
        if topics is not None:
            body["topics"] = list(topics)
        if results:
            body["results"] = results_to_wire(results)
        # Never repeated blindly: a pull whose answer was lost has handed messages out, and
        # repeating it would hand out others while those wait for their ack timeout.
        return self._group(
            "POST",
            group,
            "/pull",
            body,
            self._parse_pull,
            idempotent=False,
            timeout_s=wait_ms / 1000 + self._timeout_s,
        )

    def _ack(
        self, group: str, results: Sequence[QueueResult], produce: Sequence[Produce] | None = None
    ) -> Call[AckResult]:
        body: dict[str, Any] = {"results": results_to_wire(results)}
        if produce is not None:
            # Repeating it is harmless: once it applied, a repeat names stale results (409).
            body["produce"] = produce_to_wire(produce)
        return self._group("POST", group, "/ack", body, parse_ack)

    def _extend(
        self,
        group: str,
        refs: Iterable[MessageRef],
        ack_timeout_ms: int,
        attempts: Mapping[MessageRef, int] | None = None,
    ) -> Call[ExtendResult]:
        fence = attempts or {}
        messages: list[dict[str, Any]] = []
        for t, q, o in refs:
            item: dict[str, Any] = {"topic": t, "qid": q, "offset": o}
            if (t, q, o) in fence:
                item["attempt"] = fence[(t, q, o)]
            messages.append(item)
        body = {"messages": messages, "ack_timeout_ms": ack_timeout_ms}
        return self._group("POST", group, "/extend", body, parse_extend)

    def _seek(
        self, group: str, topic: str, to: str | int | Mapping[str, int], qid: int | None
    ) -> Call[dict[str, Any]]:
        return self._group("POST", group, "/seek", {"topic": topic, "qid": qid, "to": to})

    def _replay(
        self, group: str, topic: str, order_value: str, start: str | int | Mapping[str, int]
    ) -> Call[dict[str, Any]]:
        body = {"topic": topic, "order_value": order_value, "from": start}
        return self._group("POST", group, "/replay", body)

    def _dead_letters(
        self, group: str, topic: str | None, limit: int | None
    ) -> Call[list[dict[str, Any]]]:
        params = query_params(topic=topic, limit=limit)
        return self._group(
            "GET",
            group,
            "/dead-letters",
            parse=lambda d: list_field(d, "dead_letters"),
            params=params,
        )

    def _browse(
        self,
        topic: str,
        qid: int | None,
        start: int | None,
        from_ms: int | None,
        last: int | None,
        limit: int | None,
    ) -> Call[dict[str, Any]]:
        params = query_params(qid=qid, from_ms=from_ms, last=last, limit=limit)
        if start is not None:
            params["from"] = str(start)
        return Call("GET", f"/v1/topics/{seg(topic)}/messages", mapping, params=params)

    def _delete_dead_letters(
        self, group: str, topic: str | None, messages: Sequence[MessageRef] | None
    ) -> Call[int]:
        body = None if messages is None else {"messages": _refs(messages)}
        return self._group(
            "DELETE",
            group,
            "/dead-letters",
            body,
            lambda d: int(mapping(d).get("deleted", 0)),
            params=query_params(topic=topic),
        )

    def _redrive(
        self, group: str, topic: str | None, messages: Sequence[MessageRef] | None = None
    ) -> Call[int]:
        body: dict[str, Any] = {"topic": topic} if topic is not None else {}
        if messages is not None:
            body["messages"] = _refs(messages)
        return self._group(
            "POST",
            group,
            "/dead-letters/redrive",
            body,
            lambda d: int(mapping(d).get("redriven", 0)),
            idempotent=False,
        )

    def _blocked_keys(
        self, group: str, topic: str | None, min_blocked_ms: int | None, limit: int | None
    ) -> Call[list[dict[str, Any]]]:
        params = query_params(topic=topic, min_blocked_ms=min_blocked_ms, limit=limit)
        return self._group(
            "GET",
            group,
            "/blocked-keys",
            parse=lambda d: list_field(d, "blocked_keys"),
            params=params,
        )

    def _blocked_key_action(
        self, action: str, group: str, topic: str, head: BlockedHead
    ) -> Call[MessageRef]:
        """``skip`` or ``release`` a blocked head, named by order value or by (qid, offset)."""
        body: dict[str, Any] = {"topic": topic}
        if isinstance(head, str):
            body["order_value"] = head
        else:
            qid, offset = head
            body.update(qid=qid, offset=offset)
        word = "skipped" if action == "skip" else "released"
        # Not repeated blindly: a second skip would dead-letter the next head of the chain.
        return self._group(
            "POST",
            group,
            f"/blocked-keys/{action}",
            body,
            lambda d: parse_ref(mapping(d).get(word)),
            idempotent=False,
        )

    # -- health ------------------------------------------------------------------------------
    @staticmethod
    def _health() -> Call[dict[str, Any]]:
        return Call("GET", "/healthz", mapping)

    @staticmethod
    def _ready() -> Call[dict[str, Any]]:
        return Call("GET", "/readyz", mapping)

    def _parse_pull(self, data: Any) -> PullResult:
        obj = as_object(data)
        raw = obj.get("messages") or []
        server = self.url
        try:
            messages = tuple(message_from_wire(m, server) for m in raw)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ProtocolError(f"malformed message in pull answer: {exc!r}") from exc
        return PullResult(messages, parse_ack(obj.get("results")))


def _refs(refs: Iterable[MessageRef]) -> list[dict[str, Any]]:
    return [{"topic": t, "qid": q, "offset": o} for t, q, o in refs]
