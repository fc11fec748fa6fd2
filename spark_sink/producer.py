"""The sink's produce path: one batch per call, in order, with the sink's own retry rules.

Calls go through the SDK's client core (:class:`consumer_sdk.Client`), which owns the HTTP
contract; this module adds only what is the sink's: retries that lean on produce dedup (every
message has an id, so repeating a call that may have been stored is safe), a backoff driven by
the sink options, and errors of the sink's own hierarchy. SDK errors are translated here, once.
Messages arrive already encoded as JSON bytes and are spliced into the request body, so a
retry re-sends byte-identical content.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence

import httpx

from consumer_sdk import (
    NO_RETRY,
    ApiError,
    CertificateError,
    Client,
    ClientError,
    ProtocolError,
    SendResult,
    TransportError,
)
from consumer_sdk.errors import PermissionDenied, ResourceNotFound
from spark_sink.errors import ProduceRejectedError, SinkConfigError, SinkUnavailableError
from spark_sink.options import SinkOptions

log = logging.getLogger(__name__)

#: Statuses worth retrying: store unavailable, throttled, or a gateway in front of cproxy.
RETRYABLE_STATUSES = frozenset([429, 502, 503, 504])
#: Never sleep longer than this on one Retry-After, whatever the server asks.
MAX_RETRY_AFTER_S = 30.0
#: The preflight never waits longer than this per call, whatever ``timeout_ms`` says.
MAX_PREFLIGHT_TIMEOUT_MS = 10_000


#: Where a message of a batch was stored (``duplicate``: it was already there).
ProduceResult = SendResult


def _client(options: SinkOptions, transport: httpx.BaseTransport | None, timeout_ms: int) -> Client:
    # NO_RETRY: the sink retries itself (see Producer.send), with its own options and rules.
    return Client(
        options.url,
        token=options.token,
        timeout_ms=timeout_ms,
        retry=NO_RETRY,
        transport=transport,
        verify=options.ca_file if options.ca_file is not None else True,
    )


def _untrusted(exc: CertificateError, options: SinkOptions) -> SinkConfigError:
    # Never retried: it fails the same way until the sink is told which CA to trust.
    return SinkConfigError(
        f"cproxy sink: cannot trust the certificate of {options.url} ({exc}); set the ca_file "
        "option to the PEM bundle of the CA that signed it"
    )


class Producer:
    """Sends batches for one topic through one SDK :class:`~consumer_sdk.Client`; not
    thread-safe.

    ``sleep`` is injectable so retry tests run without real waiting.
    """

    def __init__(
        self,
        options: SinkOptions,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._options = options
        self._sleep = sleep
        self._client = _client(options, transport, options.timeout_ms)
        self._where = f"{options.url}/v1/topics/{options.topic}/messages"
        #: Retries performed so far (all batches), reported in the write summary.
        self.retries = 0

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def send(self, encoded: Sequence[bytes]) -> list[ProduceResult]:
        """Produce one batch atomically; returns one result per message, in order.

        Transient failures are retried with exponential backoff. Retrying is safe even when
        the first attempt was stored but its response was lost: every message has an id, so
        the server answers the retry with ``duplicate: true`` instead of storing it again.
        """
        attempt = 0
        while True:
            problem, retry_after = self._attempt(encoded)
            if isinstance(problem, list):
                return problem
            if attempt >= self._options.max_retries:
                raise SinkUnavailableError(
                    f"cproxy sink: produce to {self._where} failed after "
                    f"{attempt + 1} attempt(s): {problem}"
                )
            delay = self._backoff_s(attempt, retry_after)
            log.warning(
                "produce to topic %s failed (%s); retry %d/%d in %.2fs",
                self._options.topic,
                problem,
                attempt + 1,
                self._options.max_retries,
                delay,
            )
            self._sleep(delay)
            attempt += 1
            self.retries += 1

    def _attempt(self, encoded: Sequence[bytes]) -> tuple[list[ProduceResult] | str, float | None]:
        """One call: the results, or a description of a transient failure and Retry-After."""
        try:
            sent = self._client.produce_encoded(self._options.topic, encoded, with_ids=True)
        except CertificateError as exc:
            raise _untrusted(exc, self._options) from exc
        except TransportError as exc:
            return str(exc), None
        except ApiError as exc:
            if exc.status not in RETRYABLE_STATUSES:
                raise _rejected(exc, self._options) from exc
            retry_after = exc.retry_after_ms / 1000 if exc.retry_after_ms is not None else None
            return f"HTTP {exc.status} {_error_text(exc)}", retry_after
        except ProtocolError as exc:
            raise SinkUnavailableError(f"cproxy sink: unexpected produce response: {exc}") from exc
        return sent, None

    def _backoff_s(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, MAX_RETRY_AFTER_S)
        ceiling = min(self._options.retry_max_ms, self._options.retry_initial_ms * 2**attempt)
        # Full jitter keeps many tasks that failed together from retrying in lockstep.
        return random.uniform(ceiling / 2, ceiling) / 1000


def _error_text(exc: ApiError) -> str:
    return f"{exc.code}: {exc.message}"


def _rejected(exc: ApiError, options: SinkOptions) -> ProduceRejectedError:
    status = exc.status
    hint = ""
    if status == 413:
        hint = " (lower batch_size or max_request_bytes to fit the server's limits)"
    elif status == 404:
        hint = f" (does topic {options.topic!r} exist?)"
    elif status in (401, 403):
        hint = " (check the token option and its scope)"
    return ProduceRejectedError(
        f"cproxy sink: produce to topic {options.topic!r} rejected with HTTP {status} "
        f"{_error_text(exc)}{hint}",
        status=status,
        code=exc.code,
    )


def check_service(options: SinkOptions, transport: httpx.BaseTransport | None = None) -> int:
    """Driver-side preflight: the service answers and the topic exists; returns its queues.

    Creates the topic when ``create_topic_queues`` is set. Runs before any Spark task so a
    wrong URL or topic fails in a second with a clear message instead of inside every task.
    """
    timeout_ms = min(options.timeout_ms, MAX_PREFLIGHT_TIMEOUT_MS)
    with _client(options, transport, timeout_ms) as client:
        try:
            try:
                return int(client.get_topic(options.topic).get("queues", 0))
            except ResourceNotFound:
                if options.create_topic_queues is None:
                    raise
                return client.create_topic(options.topic, options.create_topic_queues).queues
        except CertificateError as exc:
            raise _untrusted(exc, options) from exc
        except TransportError as exc:
            raise SinkUnavailableError(
                f"cproxy sink: cannot reach cproxy at {options.url}: {exc}"
            ) from exc
        except ResourceNotFound as exc:
            raise SinkConfigError(
                f"cproxy sink: topic {options.topic!r} does not exist at {options.url}; create "
                "it first (POST /v1/topics) or pass create_topic_queues"
            ) from exc
        except PermissionDenied:
            # A producer token may be scoped to produce only; it can still write.
            log.warning("cannot inspect topic %s (HTTP 403); assuming it exists", options.topic)
            return 0
        except ApiError as exc:
            if exc.status in RETRYABLE_STATUSES:
                raise SinkUnavailableError(
                    f"cproxy sink: cproxy at {options.url} is unavailable: HTTP {exc.status} "
                    f"{_error_text(exc)}"
                ) from exc
            raise _rejected(exc, options) from exc
        except ClientError as exc:  # a malformed answer
            raise SinkUnavailableError(f"cproxy sink: unexpected answer: {exc}") from exc
