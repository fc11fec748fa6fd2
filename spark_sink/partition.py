"""Writing one Spark partition: rows -> messages -> ordered batches -> one producer.

Runs on executors. Batches of a partition are sent strictly one after another and a batch
is sent only after the previous one was acknowledged, so the order in which a key's rows
arrive here is the order in which they are stored.

Message ids: ``<id_prefix><digest of the id columns>`` plus ``-<n>`` for the n-th (n >= 1)
identical row of a key. Counting identical rows per key keeps genuine repeats as distinct
messages while a task retry or a repeated write produces exactly the same ids again. The
count is only well defined when a key's rows are contiguous in the task, which
``prepare()`` guarantees and the writer verifies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import httpx
import orjson

from spark_sink.errors import (
    MessageTooLargeError,
    NullKeyError,
    OrderViolationError,
    UngroupedInputError,
)
from spark_sink.options import SinkOptions
from spark_sink.producer import Producer
from spark_sink.rowjson import RowEncoder

log = logging.getLogger(__name__)

#: Marks "no order value seen yet for this key" (``None`` is a real, null, order value).
_UNSET: Any = object()
#: Bytes of ``{"messages":[`` + ``]}`` around the joined messages.
_REQUEST_OVERHEAD = 16


@dataclass(frozen=True, slots=True)
class WriteSummary:
    """What a write did. ``stored + duplicates == sent``; ``rows == sent + skipped``.

    Counts come from successful task attempts only. Messages stored by a failed attempt
    show up as ``duplicates`` of its successful retry, never twice.
    """

    rows: int = 0
    sent: int = 0
    stored: int = 0
    duplicates: int = 0
    skipped: int = 0
    batches: int = 0
    retries: int = 0
    partitions: int = 0

    def __add__(self, other: WriteSummary) -> WriteSummary:
        return WriteSummary(
            *(getattr(self, f.name) + getattr(other, f.name) for f in fields(WriteSummary))
        )

    @classmethod
    def total(cls, parts: Iterable[WriteSummary | None]) -> WriteSummary:
        """Sum of partition summaries; ``None`` (a failed Data Source task) is skipped."""
        result = cls()
        for part in parts:
            if part is not None:
                result = result + part
        return result


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """Passed to the ``on_batch`` hook after a batch was acknowledged by the server."""

    partition_id: int
    batch_index: int
    messages: int
    stored: int
    duplicates: int


BatchHook = Callable[[BatchInfo], None]


class PartitionWriter:
    """Encodes the rows of one partition and sends them in order; use once per task."""

    def __init__(
        self,
        options: SinkOptions,
        encoder: RowEncoder,
        partition_id: int = 0,
        *,
        on_batch: BatchHook | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self._options = options
        self._encoder = encoder
        self._partition_id = partition_id
        self._on_batch = on_batch
        self._transport = transport
        self._sleep = sleep
        headers = dict(options.headers)
        self._headers = headers or None
        self._check_groups = encoder.ids_from_whole_row
        self._order_index = encoder.order_index if options.verify_order else None
        # Per-key state, reset when the key changes.
        self._started = False
        self._current_key: str | None = None
        self._occurrences: dict[str, int] = {}
        self._last_order: Any = _UNSET
        self._closed_keys: set[str | None] = set()

    def write(self, rows: Iterable[Sequence[Any]]) -> WriteSummary:
        """Send every row; returns this partition's summary or raises on a fatal error."""
        stats = dict.fromkeys((f.name for f in fields(WriteSummary)), 0)
        stats["partitions"] = 1
        batch: list[bytes] = []
        batch_bytes = _REQUEST_OVERHEAD
        kwargs: dict[str, Any] = {"transport": self._transport}
        if self._sleep is not None:
            kwargs["sleep"] = self._sleep
        with Producer(self._options, **kwargs) as producer:
            for row in rows:
                stats["rows"] += 1
                message = self._encode(row)
                if message is None:
                    stats["skipped"] += 1
                    continue
                if batch and batch_bytes + len(message) + 1 > self._options.max_request_bytes:
                    self._flush(producer, batch, stats)
                    batch, batch_bytes = [], _REQUEST_OVERHEAD
                batch.append(message)
                batch_bytes += len(message) + 1
                # Flush as soon as a batch is full rather than when the next row arrives:
                # the next row may take long to compute upstream.
                if len(batch) >= self._options.batch_size:
                    self._flush(producer, batch, stats)
                    batch, batch_bytes = [], _REQUEST_OVERHEAD
            if batch:
                self._flush(producer, batch, stats)
            stats["retries"] = producer.retries
        summary = WriteSummary(**stats)
        log.info("partition %d written: %s", self._partition_id, summary)
        return summary

    def _flush(self, producer: Producer, batch: list[bytes], stats: dict[str, int]) -> None:
        results = producer.send(batch)
        duplicates = sum(1 for r in results if r.duplicate)
        stats["sent"] += len(results)
        stats["duplicates"] += duplicates
        stats["stored"] += len(results) - duplicates
        stats["batches"] += 1
        if self._on_batch is not None:
            self._on_batch(
                BatchInfo(
                    self._partition_id,
                    stats["batches"] - 1,
                    len(results),
                    len(results) - duplicates,
                    duplicates,
                )
            )

    def _encode(self, row: Sequence[Any]) -> bytes | None:
        """One row as an encoded message, or ``None`` when a null key is skipped."""
        encoder = self._encoder
        converted = encoder.convert(row)
        key = encoder.key(converted)
        if key is None:
            if self._options.null_keys == "error":
                raise NullKeyError(
                    f"cproxy sink: null in key column {self._options.key_col!r} "
                    f"(partition {self._partition_id}); filter such rows out or set "
                    "null_keys='skip' or 'unkeyed'"
                )
            if self._options.null_keys == "skip":
                return None
        if not self._started or key != self._current_key:
            self._start_key(key)
        if self._order_index is not None:
            self._verify_order(key, row[self._order_index])
        digest = encoder.digest(converted)
        message_id = self._options.id_prefix + digest
        if self._check_groups:
            seen = self._occurrences.get(digest, 0)
            self._occurrences[digest] = seen + 1
            if seen:
                message_id = f"{message_id}-{seen}"
        message: dict[str, Any] = {"key": key, "body": encoder.body(converted), "id": message_id}
        if self._headers is not None:
            message["headers"] = self._headers
        encoded = orjson.dumps(message)
        if len(encoded) > self._options.max_message_bytes:
            raise MessageTooLargeError(
                f"cproxy sink: a row with key {key!r} encodes to {len(encoded)} bytes, over "
                f"max_message_bytes={self._options.max_message_bytes}"
            )
        return encoded

    def _start_key(self, key: str | None) -> None:
        if self._started:
            self._closed_keys.add(self._current_key)
        self._started = True
        if (self._check_groups or self._order_index is not None) and key in self._closed_keys:
            raise UngroupedInputError(
                f"cproxy sink: rows of key {key!r} are not contiguous in partition "
                f"{self._partition_id}; write through write_dataframe(), or call "
                "spark_sink.prepare(df, key_col, order_col) before df.write.format('cproxy')"
            )
        self._current_key = key
        self._occurrences.clear()
        self._last_order = _UNSET

    def _verify_order(self, key: str | None, value: Any) -> None:
        previous = self._last_order
        self._last_order = value
        if previous is _UNSET or previous is None:
            return
        try:
            # Spark sorts nulls first, so a null after a non-null is out of order.
            broken = value is None or previous > value
        except TypeError:
            return
        if broken:
            raise OrderViolationError(
                f"cproxy sink: rows of key {key!r} are not ascending in "
                f"{self._options.order_col!r} ({previous!r} before {value!r}) in partition "
                f"{self._partition_id}; call spark_sink.prepare(df, key_col, order_col) first"
            )
