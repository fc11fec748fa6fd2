"""A minimal produce client: one batch per call, in order, with retries on transient errors.

Deliberately independent of ``consumer_sdk``: executors only need the produce call, and a
small client keeps the sink's retry rules (which lean on produce dedup) in one place.
Messages arrive already encoded as JSON bytes and are spliced into the request body, so a
retry re-sends byte-identical content.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import quote

import httpx
import orjson

from spark_sink.errors import ProduceRejectedError, SinkConfigError, SinkUnavailableError
from spark_sink.options import SinkOptions

log = logging.getLogger(__name__)

#: Statuses worth retrying: store unavailable, throttled, or a gateway in front of cproxy.
RETRYABLE_STATUSES = frozenset([429, 502, 503, 504])
#: Never sleep longer than this on one Retry-After, whatever the server asks.
MAX_RETRY_AFTER_S = 30.0


@dataclass(frozen=True, slots=True)
class ProduceResult:
    qid: int
    offset: int
    duplicate: bool


class Producer:
    """Sends batches for one topic through one ``httpx.Client``; not thread-safe.

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
        headers = {"Content-Type": "application/json"}
        if options.token:
            headers["Authorization"] = f"Bearer {options.token}"
        self._client = httpx.Client(
            base_url=options.url,
            headers=headers,
            timeout=options.timeout_ms / 1000,
            transport=transport,
        )
        self._path = f"/v1/topics/{quote(options.topic, safe='')}/messages"
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
        body = b'{"messages":[' + b",".join(encoded) + b"]}"
        attempt = 0
        while True:
            problem, retry_after = self._attempt(body, len(encoded))
            if isinstance(problem, list):
                return problem
            if attempt >= self._options.max_retries:
                raise SinkUnavailableError(
                    f"cproxy sink: produce to {self._options.url}{self._path} failed after "
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

    def _attempt(self, body: bytes, count: int) -> tuple[list[ProduceResult] | str, float | None]:
        """One call: the results, or a description of a transient failure and Retry-After."""
        try:
            response = self._client.post(self._path, content=body)
        except httpx.TransportError as exc:
            return f"{type(exc).__name__}: {exc}", None
        if response.status_code == 200:
            return _parse_results(response, count), None
        if response.status_code in RETRYABLE_STATUSES:
            return f"HTTP {response.status_code} {_error_text(response)}", _retry_after(response)
        raise _rejected(response, self._options)

    def _backoff_s(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, MAX_RETRY_AFTER_S)
        ceiling = min(self._options.retry_max_ms, self._options.retry_initial_ms * 2**attempt)
        # Full jitter keeps many tasks that failed together from retrying in lockstep.
        return random.uniform(ceiling / 2, ceiling) / 1000


def _parse_results(response: httpx.Response, count: int) -> list[ProduceResult]:
    try:
        raw = orjson.loads(response.content)["results"]
        results = [
            ProduceResult(int(r["qid"]), int(r["offset"]), bool(r["duplicate"])) for r in raw
        ]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise SinkUnavailableError(
            f"cproxy sink: unexpected produce response {response.text[:200]!r}"
        ) from exc
    if len(results) != count:
        raise SinkUnavailableError(
            f"cproxy sink: sent {count} messages but got {len(results)} results"
        )
    return results


def _error_text(response: httpx.Response) -> str:
    try:
        error = orjson.loads(response.content)["error"]
        return f"{error['code']}: {error['message']}"
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return response.text[:200]


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _rejected(response: httpx.Response, options: SinkOptions) -> ProduceRejectedError:
    status = response.status_code
    text = _error_text(response)
    try:
        code = str(orjson.loads(response.content)["error"]["code"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        code = ""
    hint = ""
    if status == 413:
        hint = " (lower batch_size or max_request_bytes to fit the server's limits)"
    elif status == 404:
        hint = f" (does topic {options.topic!r} exist?)"
    elif status in (401, 403):
        hint = " (check the token option and its scope)"
    return ProduceRejectedError(
        f"cproxy sink: produce to topic {options.topic!r} rejected with HTTP {status} {text}{hint}",
        status=status,
        code=code,
    )


def check_service(options: SinkOptions, transport: httpx.BaseTransport | None = None) -> int:
    """Driver-side preflight: the service answers and the topic exists; returns its queues.

    Creates the topic when ``create_topic_queues`` is set. Runs before any Spark task so a
    wrong URL or topic fails in a second with a clear message instead of inside every task.
    """
    headers = {"Authorization": f"Bearer {options.token}"} if options.token else {}
    topic_path = f"/v1/topics/{quote(options.topic, safe='')}"
    timeout = min(options.timeout_ms / 1000, 10.0)
    with httpx.Client(
        base_url=options.url, headers=headers, timeout=timeout, transport=transport
    ) as client:
        try:
            response = client.get(topic_path)
            if response.status_code == 404 and options.create_topic_queues is not None:
                response = client.post(
                    "/v1/topics",
                    json={"name": options.topic, "queues": options.create_topic_queues},
                )
        except httpx.TransportError as exc:
            raise SinkUnavailableError(
                f"cproxy sink: cannot reach cproxy at {options.url}: {type(exc).__name__}: {exc}"
            ) from exc
    status = response.status_code
    if status in (200, 201):
        return int(response.json().get("queues", 0))
    if status == 404:
        raise SinkConfigError(
            f"cproxy sink: topic {options.topic!r} does not exist at {options.url}; create it "
            "first (POST /v1/topics) or pass create_topic_queues"
        )
    if status == 403:
        # A producer token may be scoped to produce only; it can still write.
        log.warning("cannot inspect topic %s (HTTP 403); assuming it exists", options.topic)
        return 0
    if status in RETRYABLE_STATUSES:
        raise SinkUnavailableError(
            f"cproxy sink: cproxy at {options.url} is unavailable: HTTP {status} "
            f"{_error_text(response)}"
        )
    raise _rejected(response, options)
