"""Write Spark DataFrames into cproxy topics, in order per key, safe under task retries.

``import spark_sink`` works without PySpark; the Spark entry points import it when called,
and the Data Source names (``CproxyDataSource``, ``register``) load on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spark_sink.errors import (
    MessageTooLargeError,
    NullKeyError,
    OrderViolationError,
    ProduceRejectedError,
    SinkConfigError,
    SinkError,
    SinkUnavailableError,
    UngroupedInputError,
)
from spark_sink.options import SinkOptions
from spark_sink.partition import BatchInfo, WriteSummary
from spark_sink.writer import ForeachBatchWriter, foreach_batch_writer, prepare, write_dataframe

if TYPE_CHECKING:
    from spark_sink.datasource import CproxyDataSource, register

__all__ = [
    "BatchInfo",
    "CproxyDataSource",
    "ForeachBatchWriter",
    "MessageTooLargeError",
    "NullKeyError",
    "OrderViolationError",
    "ProduceRejectedError",
    "SinkConfigError",
    "SinkError",
    "SinkOptions",
    "SinkUnavailableError",
    "UngroupedInputError",
    "WriteSummary",
    "foreach_batch_writer",
    "prepare",
    "register",
    "write_dataframe",
]

_DATASOURCE_NAMES = frozenset(["CproxyDataSource", "register"])


def __getattr__(name: str) -> Any:
    # The Data Source subclasses pyspark classes, so it can only load with pyspark present.
    if name in _DATASOURCE_NAMES:
        from spark_sink.writer import require_pyspark

        require_pyspark()
        from spark_sink import datasource

        return getattr(datasource, name)
    raise AttributeError(f"module 'spark_sink' has no attribute {name!r}")
