"""Writing one Spark partition: rows -> messages -> ordered batches -> one producer.

Runs on executors. Batches of a partition are sent strictly one after another and a batch
is sent only after the previous one was acknowledged, so the order in which a key's rows
arrive here is the order in which they are stored. The request runs on a sender thread
while the next batch is encoded, so the worker does not sit idle while the server stores a
batch.

Rows arrive in column form, a produce batch's worth at a time (:data:`Chunk`), and are
encoded that way: keys, ids, bodies and JSON in one pass over the chunk, the checks and the
per-key state once per run of a key. Per-row Python work was what bounded the sink's own
CPU; in this form a row costs a few C-level steps of comprehensions instead of method calls.

Message ids: ``<id_prefix><digest of the key><digest of the id columns>`` plus ``-<n>`` for
the n-th (n >= 1) identical row of a key (id scheme 1, of earlier sinks, has no key digest;
see ``rowjson.key_digest`` for why the key comes first). Counting identical rows per key
keeps genuine repeats as distinct messages while a task retry or a repeated write produces
exactly the same ids again. The count is only well defined when a key's rows are contiguous
in the task, which ``prepare()`` guarantees and the writer verifies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, fields
from itertools import groupby, islice, repeat
from time import perf_counter
from typing import Any, TypeVar

import httpx
import orjson

from spark_sink.columns import Chunk
from spark_sink.errors import (
    MessageTooLargeError,
    NullKeyError,
    OrderViolationError,
    UngroupedInputError,
)
from spark_sink.options import SinkOptions
from spark_sink.producer import Producer, ProduceResult
from spark_sink.rowjson import RowEncoder, key_digest

_T = TypeVar("_T")

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

    The ``*_ms`` fields say where the tasks' time went, summed over tasks (so more than the
    write's wall time when tasks ran side by side): waiting for Spark to hand over rows,
    converting and encoding them, and waiting for the server to acknowledge a batch beyond
    the time spent encoding the next one. They vary from run to run, so summaries compare
    equal without them.
    """

    rows: int = 0
    sent: int = 0
    stored: int = 0
    duplicates: int = 0
    skipped: int = 0
    batches: int = 0
    retries: int = 0
    partitions: int = 0
    input_ms: int = field(default=0, compare=False)
    encode_ms: int = field(default=0, compare=False)
    wait_ms: int = field(default=0, compare=False)

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
        #: Seconds spent waiting for input (Spark), encoding, and for acknowledgements.
        self._input_s = 0.0
        self._encode_s = 0.0
        self._wait_s = 0.0

    def write(self, rows: Iterable[Sequence[Any]]) -> WriteSummary:
        """Send every row; returns this partition's summary or raises on a fatal error."""
        return self.write_chunks(self._row_chunks(rows))

    def timed(self, source: Iterable[_T]) -> Iterator[_T]:
        """``source`` as it is, with the time spent waiting for its items counted as input
        time (``WriteSummary.input_ms``): wrap Spark's iterator in it."""
        items = iter(source)
        while True:
            started = perf_counter()
            item = next(items, _UNSET)
            self._input_s += perf_counter() - started
            if item is _UNSET:
                return
            yield item

    def _row_chunks(self, rows: Iterable[Sequence[Any]]) -> Iterator[Chunk]:
        # A produce batch's worth at a time: a full batch is sent as soon as its last row
        # is here, not when the next row arrives (which may take long to compute upstream).
        encoder, order_index = self._encoder, self._encoder.order_index
        items = iter(rows)
        while True:
            started = perf_counter()
            block = list(islice(items, self._options.batch_size))
            self._input_s += perf_counter() - started
            if not block:
                return
            converted = [encoder.convert(row) for row in block]
            order = None if order_index is None else [row[order_index] for row in block]
            yield list(zip(*converted, strict=True)), order

    def write_chunks(self, chunks: Iterable[Chunk]) -> WriteSummary:
        """Send rows given in column form (see :data:`Chunk`): what :meth:`write` does
        after converting, and what the Arrow path (:mod:`spark_sink.columns`) feeds."""
        stats = dict.fromkeys((f.name for f in fields(WriteSummary)), 0)
        stats["partitions"] = 1
        kwargs: dict[str, Any] = {"transport": self._transport}
        if self._sleep is not None:
            kwargs["sleep"] = self._sleep
        batch_size = self._options.batch_size
        #: Encoded messages not sent yet, in order.
        queued: list[bytes] = []
        items = iter(chunks)
        # One sender thread: a batch is sent while the next one is encoded here. Still one
        # request at a time, and a batch is sent only after the previous one was acknowledged
        # (and its on_batch hook ran), so order, retries and the hook's view are unchanged.
        with (
            Producer(self._options, **kwargs) as producer,
            ThreadPoolExecutor(1, thread_name_prefix="cproxy-sink-send") as sender,
        ):
            try:
                while True:
                    started, input_before = perf_counter(), self._input_s
                    chunk = next(items, None)
                    if chunk is not None:
                        columns, order = chunk
                        stats["rows"] += len(columns[0]) if columns else 0
                        queued += self._encode_chunk(columns, order, stats)
                    # Time in the chunk iterator that was not input is conversion: encoding.
                    spent = perf_counter() - started
                    self._encode_s += spent - (self._input_s - input_before)
                    if chunk is None:
                        break
                    while len(queued) >= batch_size:
                        self._flush(sender, producer, queued, stats)
                while queued:
                    self._flush(sender, producer, queued, stats)
                self._settle(stats)
            finally:
                # On an error here, let the batch in flight finish before the task fails, so
                # what is stored when the error surfaces no longer changes.
                pending, self._pending = self._pending, None
                if pending is not None:
                    wait([pending])
            stats["retries"] = producer.retries
        stats["input_ms"] = round(self._input_s * 1000)
        stats["encode_ms"] = round(self._encode_s * 1000)
        stats["wait_ms"] = round(self._wait_s * 1000)
        summary = WriteSummary(**stats)
        log.info("partition %d written: %s", self._partition_id, summary)
        return summary

    def _flush(
        self,
        sender: ThreadPoolExecutor,
        producer: Producer,
        queued: list[bytes],
        stats: dict[str, int],
    ) -> None:
        """Take the next batch off ``queued`` (at most ``batch_size`` messages and
        ``max_request_bytes``) and start sending it once the previous batch is
        acknowledged."""
        batch = queued[: self._options.batch_size]
        limit = self._options.max_request_bytes - _REQUEST_OVERHEAD
        if sum(map(len, batch)) + len(batch) > limit:
            size, taken = 0, 0
            for message in batch:
                size += len(message) + 1
                if taken and size > limit:
                    break
                taken += 1
            batch = batch[:taken]
        del queued[: len(batch)]
        self._settle(stats)
        self._pending = sender.submit(producer.send, batch)

    def _settle(self, stats: dict[str, int]) -> None:
        """Wait for the batch in flight, count it and run the ``on_batch`` hook."""
        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        started = perf_counter()
        try:
            results = pending.result()
        finally:
            self._wait_s += perf_counter() - started
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

    def _encode_chunk(
        self, columns: Sequence[Sequence[Any]], order: Sequence[Any] | None, stats: dict[str, int]
    ) -> list[bytes]:
        """The messages of a chunk's rows, in order (rows whose null key is skipped left out
        and counted). Checks and per-key state go a run of one key at a time; ids, bodies and
        JSON a whole chunk at a time."""
        encoder = self._encoder
        keys = encoder.keys(columns)
        digests = encoder.digests(columns)
        ids: list[str] = []
        kept: list[tuple[int, int]] = []
        start = 0
        for key, run in groupby(keys):
            end = start + len(list(run))
            if key is None and self._null_key_skipped():
                stats["skipped"] += end - start
                start = end
                continue
            if not self._started or key != self._current_key:
                self._start_key(key)
            if self._verify and order is not None:
                self._verify_run(key, order[start:end])
            ids += self._run_ids(digests[start:end])
            kept.append((start, end))
            start = end
        bodies = encoder.bodies(columns)
        if len(ids) != len(keys):  # rows with a null key were skipped
            keys = [k for s, e in kept for k in keys[s:e]]
            bodies = [b for s, e in kept for b in bodies[s:e]]
        dumps = orjson.dumps
        if self._headers is None:
            encoded = [
                dumps({"key": k, "body": b, "id": i})
                for k, b, i in zip(keys, bodies, ids, strict=True)
            ]
        else:
            headers = self._headers
            encoded = [
                dumps({"key": k, "body": b, "id": i, "headers": headers})
                for k, b, i in zip(keys, bodies, ids, strict=True)
            ]
        if encoded and max(map(len, encoded)) > self._max_message_bytes:
            index = next(n for n, m in enumerate(encoded) if len(m) > self._max_message_bytes)
            raise MessageTooLargeError(
                f"cproxy sink: a row with key {keys[index]!r} encodes to "
                f"{len(encoded[index])} bytes, over max_message_bytes={self._max_message_bytes}"
            )
        return encoded

    def _null_key_skipped(self) -> bool:
        """True when rows with a null key are skipped; raises when they are an error."""
        if self._options.null_keys == "error":
            raise NullKeyError(
                f"cproxy sink: null in key column {self._options.key_col!r} "
                f"(partition {self._partition_id}); filter such rows out or set "
                "null_keys='skip' or 'unkeyed'"
            )
        return self._options.null_keys == "skip"

    def _run_ids(self, digests: list[str]) -> list[str]:
        """The ids of consecutive rows of the current key, from their digests."""
        prefix = self._key_id_prefix
        if not self._check_groups:
            return [prefix + d for d in digests]
        seen = self._occurrences
        if seen.keys().isdisjoint(digests) and len(set(digests)) == len(digests):
            # No repeated row (the usual case): every row is its digest's first occurrence.
            seen.update(zip(digests, repeat(1)))
            return [prefix + d for d in digests]
        ids = []
        for digest in digests:
            count = seen.get(digest, 0)
            seen[digest] = count + 1
            ids.append(f"{prefix}{digest}-{count}" if count else prefix + digest)
        return ids

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

    def _verify_run(self, key: str | None, values: Sequence[Any]) -> None:
        """Check that the current key's next ``order_col`` values ascend (nulls first)."""
        previous = self._last_order
        for value in values:
            if previous is not _UNSET and previous is not None:
                try:
                    # Spark sorts nulls first, so a null after a non-null is out of order.
                    broken = value is None or previous > value
                except TypeError:
                    broken = False
                if broken:
                    raise OrderViolationError(
                        f"cproxy sink: rows of key {key!r} are not ascending in "
                        f"{self._options.order_col!r} ({previous!r} before {value!r}) in "
                        f"partition {self._partition_id}; call "
                        "spark_sink.prepare(df, key_col, order_col) first"
                    )
            previous = value
        self._last_order = previous
