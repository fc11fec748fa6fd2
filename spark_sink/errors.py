"""Errors raised by the Spark sink.

Driver-side problems (bad options, missing columns, an unreachable service) are raised before
any Spark task runs. Executor-side errors end the task; Spark then retries it, which is safe
because every message carries a deterministic id (see ``docs/spark.md``).
"""

from __future__ import annotations


class SinkError(Exception):
    """Base of every error the sink raises on purpose."""


class SinkConfigError(SinkError, ValueError):
    """An option is invalid, or a column it names is missing from the DataFrame."""


class SinkUnavailableError(SinkError):
    """The cproxy service could not be reached, or kept failing transiently past all retries."""


class ProduceRejectedError(SinkError):
    """The service rejected a produce call with a non-retryable status (a 4xx)."""

    def __init__(self, message: str, status: int = 0, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code

    def __reduce__(self) -> tuple[type[ProduceRejectedError], tuple[str, int, str]]:
        # Keeps the extra attributes when Spark pickles the exception between processes.
        return (type(self), (str(self), self.status, self.code))


class MessageTooLargeError(SinkError):
    """One row encodes to a message larger than ``max_message_bytes``."""


class NullKeyError(SinkError):
    """A row has a null key while ``null_keys="error"`` (the default)."""


class UngroupedInputError(SinkError):
    """A key's rows are not contiguous within a task, so per-row ids would be ambiguous."""


class OrderViolationError(SinkError):
    """Within a task, a key's rows are not in ascending ``order_col`` order."""
