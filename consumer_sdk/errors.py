"""One rooted exception hierarchy for the SDK.

Everything the SDK raises on purpose derives from :class:`ClientError`. HTTPX errors are
translated exactly once, at the transport boundary (``consumer_sdk._base``), with
``raise ... from exc`` so the original stays available as ``__cause__``. The names are the
client's own: none repeats a class of the service's ``cproxy.errors`` (whose root is
``CproxyError``), so a traceback or an ``except`` clause always says which side it means::

    ClientError
    ├── TransportError            the server could not be reached or did not answer
    │   ├── ConnectError          the request was never sent: always safe to retry
    │   │   └── CertificateError  the server's TLS certificate failed verification: not retried
    │   └── RequestTimeout        sent, but no answer in time: it may have been applied
    ├── ProtocolError             the answer was not the JSON the contract promises
    ├── ApiError                  the server answered {"error": {"code", "message"}}
    │   ├── BadRequest (400)  ValidationFailed (422)  PayloadTooLarge (413)
    │   ├── NotAuthenticated (401)  PermissionDenied (403)
    │   ├── ResourceNotFound (404)  ResourceConflict (409)
    │   ├── Throttled (429)
    │   └── ServerError (5xx)
    │       └── ServiceUnavailable (503)
    ├── ConsumerError             a consumer was misused or stopped on a fatal error
    └── DuplicateInProgress       the idempotency helper saw the key claimed elsewhere
"""

from __future__ import annotations

from typing import ClassVar


class ClientError(Exception):
    """Base of every error the SDK raises on purpose."""

    #: True when repeating the same call later may succeed (the consumer loops retry these).
    retryable: ClassVar[bool] = False


class TransportError(ClientError):
    """The server could not be reached or did not answer (wraps an ``httpx`` error)."""

    retryable = True


class ConnectError(TransportError):
    """The connection failed before the request was sent, so nothing was applied."""


class CertificateError(ConnectError):
    """The server's TLS certificate could not be verified (unknown CA, wrong host name,
    expired), so nothing was sent. Not retried: it fails the same way until the client is
    given the right CA (``verify=`` / ``--ca-file``) or the server a valid certificate."""

    retryable = False


class RequestTimeout(TransportError):
    """No answer in time. The request may have been applied: retry only idempotent calls."""


class ProtocolError(ClientError):
    """The server answered something that is not the JSON the contract promises."""


class ApiError(ClientError):
    """The server rejected a request with ``{"error": {"code", "message"}}``.

    ``status`` is the HTTP status, ``code`` the stable snake_case error code (use it rather than
    the message to branch on), ``message`` the human sentence. ``retry_after_ms`` is the
    answer's ``Retry-After`` header in milliseconds (None when absent or not a number of
    seconds).
    """

    def __init__(
        self, status: int, code: str, message: str, *, retry_after_ms: int | None = None
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retry_after_ms = retry_after_ms

    def __reduce__(self) -> tuple[object, ...]:
        # Keeps status/code/message when the error crosses a process (e.g. a Spark executor).
        return (_rebuild, (type(self), self.status, self.code, self.message, self.retry_after_ms))


def _rebuild(
    cls: type[ApiError], status: int, code: str, message: str, retry_after_ms: int | None
) -> ApiError:
    return cls(status, code, message, retry_after_ms=retry_after_ms)


class BadRequest(ApiError):
    """400: the request is malformed."""


class NotAuthenticated(ApiError):
    """401: missing or unknown token."""


class PermissionDenied(ApiError):
    """403: the token's role or scope does not allow this call."""


class ResourceNotFound(ApiError):
    """404: unknown topic or group (``code`` tells which, e.g. ``topic_not_found``)."""


class ResourceConflict(ApiError):
    """409: e.g. a topic exists with a different queue count."""


class PayloadTooLarge(ApiError):
    """413: too many messages in one call, or too many bytes."""


class ValidationFailed(ApiError):
    """422: well-formed but invalid (bad group config, bad order_by...)."""


class Throttled(ApiError):
    """429: a rate limit (usually a gateway in front of cproxy); nothing was applied.

    Retried after ``retry_after_ms`` when the answer says, else after the usual backoff.
    """

    retryable = True


class ServerError(ApiError):
    """5xx other than 503. Retried by the consumer loops like a transport error."""

    retryable = True


class ServiceUnavailable(ServerError):
    """503: the store is unavailable or the server is shutting down; nothing was applied."""


class ConsumerError(ClientError):
    """A consumer was used wrongly (e.g. started twice) or stopped on a fatal error."""


class DuplicateInProgress(ClientError):
    """Another delivery of the same business key holds the idempotency claim.

    Raised by handlers wrapped with :func:`consumer_sdk.idempotent`; the message is failed and
    delivered again after the group's retry backoff, by which time the other delivery is done.
    """

    retryable = True

    def __init__(self, key: str) -> None:
        super().__init__(f"business key {key!r} is being processed by another delivery")
        self.key = key


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: NotAuthenticated,
    403: PermissionDenied,
    404: ResourceNotFound,
    409: ResourceConflict,
    413: PayloadTooLarge,
    422: ValidationFailed,
    429: Throttled,
    503: ServiceUnavailable,
}


def api_error_class(status: int) -> type[ApiError]:
    """The :class:`ApiError` subclass for an HTTP status."""
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return ServerError if status >= 500 else BadRequest
