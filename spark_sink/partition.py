"""Writing one Spark partition: rows -> messages -> ordered batches -> one producer.

Runs on executors. Batches of a partition are sent strictly one after another and a batch
is sent only after the previous one was acknowledged, so the order in which a key's rows
arrive here is the order in which they are stored. The request runs on a sender thread
while the next batch is encoded, so the worker does not sit idle while the server stores a
batch.

Message ids: ``<id_prefix><digest of the key><digest of the id columns>`` plus ``-<n>`` for
the n-th (n >= 1) identical row of a key (id scheme 1, of earlier sinks, has no key digest;
see ``rowjson.key_digest`` for why the key comes first). Counting identical rows per key
keeps genuine repeats as distinct messages while a task retry or a repeated write produces
exactly the same ids again. The count is only well defined when a key's rows are contiguous
in the task, which ``prepare()`` guarantees and the writer verifies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
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
from spark_sink.producer import Producer, ProduceResult
from spark_sink.rowjson import RowEncoder, key_digest

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
        self._verify = options.verify_order and encoder.order_index is not None
        self._id_prefix = options.id_prefix
        self._keyed_ids = options.id_scheme >= 2
        #: ``id_prefix`` plus, in id scheme 2, the current key's digest.
        self._key_id_prefix = options.id_prefix
        self._max_message_bytes = options.max_message_bytes
        self._pending: Future[list[ProduceResult]] | None = None
        # Per-key state, reset when the key changes.
        self._started = False
        self._current_key: str | None = None
        self._occurrences: dict[str, int] = {}
        self._last_order: Any = _UNSET
        self._closed_keys: set[str | None] = set()

    def write(self, rows: Iterable[Sequence[Any]]) -> WriteSummary:
        """Send every row; returns this partition's summary or raises on a fatal error."""
        encoder, order_index = self._encoder, self._encoder.order_index
        if order_index is None:
            return self.write_converted((encoder.convert(row), None) for row in rows)
        return self.write_converted((encoder.convert(row), row[order_index]) for row in rows)

    def write_converted(self, items: Iterable[tuple[Sequence[Any], Any]]) -> WriteSummary:
        """Send rows given as (every column converted by the encoder's rules, the raw
        ``order_col`` value or None): what :meth:`write` does after converting, and what the
        Arrow path (:mod:`spark_sink.columns`) feeds directly."""
        stats = dict.fromkeys((f.name for f in fields(WriteSummary)), 0)
        stats["partitions"] = 1
        batch: list[bytes] = []
        batch_bytes = _REQUEST_OVERHEAD
        kwargs: dict[str, Any] = {"transport": self._transport}
        if self._sleep is not None:
            kwargs["sleep"] = self._sleep
        max_request_bytes, batch_size = self._options.max_request_bytes, self._options.batch_size
        encode = self._encode
        # One sender thread: a batch is sent while the next one is encoded here. Still one
        # request at a time, and a batch is sent only after the previous one was acknowledged
        # (and its on_batch hook ran), so order, retries and the hook's view are unchanged.
        with (
            Producer(self._options, **kwargs) as producer,
            ThreadPoolExecutor(1, thread_name_prefix="cproxy-sink-send") as sender,
        ):
            try:
                for converted, order_value in items:
                    stats["rows"] += 1
                    message = encode(converted, order_value)
                    if message is None:
                        stats["skipped"] += 1
                        continue
                    if batch and batch_bytes + len(message) + 1 > max_request_bytes:
                        self._flush(sender, producer, batch, stats)
                        batch, batch_bytes = [], _REQUEST_OVERHEAD
                    batch.append(message)
                    batch_bytes += len(message) + 1
                    # Flush as soon as a batch is full rather than when the next row arrives:
                    # the next row may take long to compute upstream.
                    if len(batch) >= batch_size:
                        self._flush(sender, producer, batch, stats)
                        batch, batch_bytes = [], _REQUEST_OVERHEAD
                if batch:
                    self._flush(sender, producer, batch, stats)
                self._settle(stats)
            finally:
                # On an error here, let the batch in flight finish before the task fails, so
                # what is stored when the error surfaces no longer changes.
                pending, self._pending = self._pending, None
                if pending is not None:
                    wait([pending])
            stats["retries"] = producer.retries
        summary = WriteSummary(**stats)
        log.info("partition %d written: %s", self._partition_id, summary)
        return summary

    def _flush(
        self,
        sender: ThreadPoolExecutor,
        producer: Producer,
        batch: list[bytes],
        stats: dict[str, int],
    ) -> None:
        """Start sending ``batch`` once the previous batch is acknowledged."""
        self._settle(stats)
        self._pending = sender.submit(producer.send, batch)

    def _settle(self, stats: dict[str, int]) -> None:
        """Wait for the batch in flight, count it and run the ``on_batch`` hook."""
        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        results = pending.result()
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

    def _encode(self, converted: Sequence[Any], order_value: Any) -> bytes | None:
        """One converted row as an encoded message, or ``None`` when a null key is skipped."""
        encoder = self._encoder
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
        if self._verify:
            self._verify_order(key, order_value)
        digest = encoder.digest(converted)
        message_id = self._key_id_prefix + digest
        if self._check_groups:
            seen = self._occurrences.get(digest, 0)
            self._occurrences[digest] = seen + 1
            if seen:
                message_id = f"{message_id}-{seen}"
        message: dict[str, Any] = {"key": key, "body": encoder.body(converted), "id": message_id}
        if self._headers is not None:
            message["headers"] = self._headers
        encoded = orjson.dumps(message)
        if len(encoded) > self._max_message_bytes:
            raise MessageTooLargeError(
                f"cproxy sink: a row with key {key!r} encodes to {len(encoded)} bytes, over "
                f"max_message_bytes={self._max_message_bytes}"
            )
        return encoded

    def _start_key(self, key: str | None) -> None:
        if self._started:
            self._closed_keys.add(self._current_key)
        self._started = True
        if (self._check_groups or self._verify) and key in self._closed_keys:
            raise UngroupedInputError(
                f"cproxy sink: rows of key {key!r} are not contiguous in partition "
                f"{self._partition_id}; write through write_dataframe(), or call "
                "spark_sink.prepare(df, key_col, order_col) before df.write.format('cproxy')"
            )
        self._current_key = key
        if self._keyed_ids:
            self._key_id_prefix = self._id_prefix + key_digest(key)
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
