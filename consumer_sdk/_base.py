"""What the sync and async clients share: building calls, parsing answers, mapping errors.

Nothing here does I/O (the HTTPX model: one base, two thin transports on top), so the contract
of docs/api.md is encoded exactly once. Every ``httpx`` error is translated here, once, into the
:mod:`consumer_sdk.errors` hierarchy with ``raise ... from exc``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

import httpx
import orjson

from consumer_sdk.config import RetryPolicy
from consumer_sdk.errors import (
    ApiError,
    ConnectError,
    CproxyError,
    ProtocolError,
    RequestTimeout,
    TransportError,
    api_error_class,
)
from consumer_sdk.models import (
    AckResult,
    ExtendResult,
    MessageRef,
    OutgoingMessage,
    PullResult,
    QueueResult,
    SendResult,
    TopicInfo,
    message_from_wire,
)

_OUTGOING_KEYS: Final = frozenset({"key", "body", "headers", "id", "qid"})
_JSON: Final = {"content-type": "application/json", "accept": "application/json"}


@dataclass(frozen=True, slots=True)
class Call:
    """One HTTP call, before it is sent.

    ``idempotent`` says whether repeating it after an ambiguous failure (sent, no answer) is
    harmless; calls that are not are retried only when the request provably was not applied.
    """

    method: str
    path: str
    body: Any = None
    params: Mapping[str, str] | None = None
    idempotent: bool = True
    timeout_s: float | None = None


class BaseClient:
    """State and pure helpers shared by :class:`Client` and :class:`AsyncClient`."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None,
        timeout_ms: int,
        retry: RetryPolicy,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"server URL must start with http:// or https://, got {url!r}")
        if timeout_ms < 1:
            raise ValueError("timeout_ms must be >= 1")
        self.url = url.rstrip("/")
        self.retry = retry
        self._timeout_s = timeout_ms / 1000
        self._headers = dict(_JSON)
        if token:
            self._headers["authorization"] = f"Bearer {token}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- transport boundary ------------------------------------------------------------------
    def _request_args(self, call: Call) -> dict[str, Any]:
        args: dict[str, Any] = {"timeout": call.timeout_s or self._timeout_s}
        if call.body is not None:
            args["content"] = orjson.dumps(call.body)
        if call.params:
            args["params"] = call.params
        return args

    def _translate(self, exc: httpx.HTTPError, call: Call) -> CproxyError:
        where = f"{call.method} {self.url}{call.path}"
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
            return ConnectError(f"{where}: cannot connect: {exc}")
        if isinstance(exc, httpx.TimeoutException):
            return RequestTimeout(f"{where}: no answer in time: {exc!r}")
        return TransportError(f"{where}: {type(exc).__name__}: {exc}")

    def _decode(self, response: httpx.Response, call: Call) -> Any:
        try:
            data = orjson.loads(response.content) if response.content else None
        except orjson.JSONDecodeError as exc:
            if response.status_code >= 400:
                raise api_error_class(response.status_code)(
                    response.status_code, "http_error", response.text[:200] or "no body"
                ) from exc
            raise ProtocolError(f"{call.method} {call.path}: answer is not JSON") from exc
        if response.status_code >= 400:
            error = data.get("error") if isinstance(data, dict) else None
            if not isinstance(error, dict):
                error = {}
            raise api_error_class(response.status_code)(
                response.status_code,
                str(error.get("code", "http_error")),
                str(error.get("message", response.reason_phrase)),
            )
        return data

    def _retry_delay_ms(
        self, exc: CproxyError, call: Call, attempt: int, policy: RetryPolicy
    ) -> float | None:
        """How long to wait before trying ``call`` again, or None to give up."""
        if attempt >= policy.max_attempts or not exc.retryable:
            return None
        # A refused connection or a 503 means nothing was applied; anything else (timeout,
        # reset mid-answer, other 5xx) may have been, so only idempotent calls repeat then.
        provably_unapplied = isinstance(exc, ConnectError) or (
            isinstance(exc, ApiError) and exc.status == 503
        )
        if not (provably_unapplied or call.idempotent):
            return None
        return policy.backoff_ms(attempt)

    # -- calls -------------------------------------------------------------------------------
    @staticmethod
    def _create_topic_call(name: str, queues: int) -> Call:
        return Call("POST", "/v1/topics", {"name": name, "queues": queues})

    @staticmethod
    def _topic_call(name: str) -> Call:
        return Call("GET", f"/v1/topics/{_seg(name)}")

    @staticmethod
    def _group_call(method: str, group: str, suffix: str = "", body: Any = None) -> Call:
        return Call(method, f"/v1/groups/{_seg(group)}{suffix}", body)

    @staticmethod
    def _produce_call(topic: str, messages: Iterable[OutgoingMessage]) -> Call:
        wire = [outgoing_to_wire(m) for m in messages]
        if not wire:
            raise ValueError("send_batch needs at least one message")
        # Retrying a produce that may have been applied stores it twice, unless every message
        # has an id: then the server's dedup turns the repeat into "duplicate": true.
        all_ids = all(m.get("id") is not None for m in wire)
        return Call(
            "POST", f"/v1/topics/{_seg(topic)}/messages", {"messages": wire}, idempotent=all_ids
        )

    def _pull_call(
        self,
        group: str,
        max_messages: int,
        wait_ms: int,
        topics: Sequence[str] | None,
        results: Sequence[QueueResult],
    ) -> Call:
        body: dict[str, Any] = {"max_messages": max_messages, "wait_ms": wait_ms}
        if topics is not None:
            body["topics"] = list(topics)
        if results:
            body["results"] = results_to_wire(results)
        # Never repeated blindly: a pull whose answer was lost has handed messages out, and
        # repeating it would hand out others while those wait for their ack timeout.
        return Call(
            "POST",
            f"/v1/groups/{_seg(group)}/pull",
            body,
            idempotent=False,
            timeout_s=wait_ms / 1000 + self._timeout_s,
        )

    @staticmethod
    def _ack_call(group: str, results: Sequence[QueueResult]) -> Call:
        return Call("POST", f"/v1/groups/{_seg(group)}/ack", {"results": results_to_wire(results)})

    @staticmethod
    def _extend_call(group: str, refs: Iterable[MessageRef], ack_timeout_ms: int) -> Call:
        messages = [{"topic": t, "qid": q, "offset": o} for t, q, o in refs]
        return Call(
            "POST",
            f"/v1/groups/{_seg(group)}/extend",
            {"messages": messages, "ack_timeout_ms": ack_timeout_ms},
        )

    # -- answers -----------------------------------------------------------------------------
    @staticmethod
    def _parse_topic(data: Any) -> TopicInfo:
        obj = _obj(data)
        try:
            return TopicInfo(name=str(obj["name"]), queues=int(obj["queues"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed topic in answer: {exc!r}") from exc

    @staticmethod
    def _parse_send(data: Any, expected: int) -> list[SendResult]:
        rows = _obj(data).get("results")
        if not isinstance(rows, list) or len(rows) != expected:
            raise ProtocolError(f"produce answered {rows!r} for {expected} message(s)")
        try:
            return [
                SendResult(
                    qid=int(r["qid"]),
                    offset=int(r["offset"]),
                    duplicate=bool(r.get("duplicate", False)),
                )
                for r in rows
            ]
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed produce result: {exc!r}") from exc

    def _parse_pull(self, data: Any) -> PullResult:
        obj = _obj(data)
        raw = obj.get("messages") or []
        server = self.url
        try:
            messages = tuple(message_from_wire(m, server) for m in raw)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ProtocolError(f"malformed message in pull answer: {exc!r}") from exc
        return PullResult(messages, _parse_ack(obj.get("results")))

    @staticmethod
    def _parse_ack(data: Any) -> AckResult:
        return _parse_ack(data)

    @staticmethod
    def _parse_extend(data: Any) -> ExtendResult:
        ack = _parse_ack(data)
        return ExtendResult(applied=ack.applied, unknown=ack.unknown)


def outgoing_to_wire(message: OutgoingMessage) -> dict[str, Any]:
    """Check one message mapping for :meth:`Producer.send_batch` and return its wire form."""
    extra = set(message) - _OUTGOING_KEYS
    if extra:
        raise ValueError(
            f"unknown message field(s) {sorted(extra)}; allowed: {sorted(_OUTGOING_KEYS)}"
        )
    if "body" not in message:
        raise ValueError("every message needs a 'body' (any JSON value)")
    return {k: v for k, v in message.items() if v is not None or k == "body"}


def results_to_wire(results: Iterable[QueueResult]) -> list[dict[str, Any]]:
    """Results in the pull/ack shape; fails in the extended form that carries the error."""
    out: list[dict[str, Any]] = []
    for r in results:
        fails: list[dict[str, Any]] = []
        for offset, error in r.fails:
            fail: dict[str, Any] = {"offset": offset}
            if error is not None:
                fail["error"] = error
            fails.append(fail)
        out.append({"topic": r.topic, "qid": r.qid, "acks": list(r.acks), "fails": fails})
    return out


def _parse_ack(data: Any) -> AckResult:
    if data is None:
        return AckResult()
    obj = _obj(data)
    try:
        unknown = tuple(
            (str(u["topic"]), int(u["qid"]), int(u["offset"])) for u in obj.get("unknown") or ()
        )
        return AckResult(applied=int(obj.get("applied", 0)), unknown=unknown)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed results in answer: {exc!r}") from exc


def _obj(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ProtocolError(f"expected a JSON object, got {type(data).__name__}")
    return data


def _seg(name: str) -> str:
    return quote(name, safe="")
