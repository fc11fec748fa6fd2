# cproxy: compiled (mypyc), see cproxy/_native.py
"""Per-group filter and transform expressions (JMESPath), compiled once when a group is PUT.

Both see a message as ``{"key": ..., "headers": {...}, "body": ...}`` (``headers`` is ``{}``
when the message has none). A *filter* keeps messages for which it is truthy (JMESPath
truthiness: not null, false, an empty string, list or object); the others are finished
without delivery. A *transform* reshapes the delivered body. JMESPath is the AWS CLI's query
language, with a specification and a compliance suite; ``jmespath`` is a pure library, so it
is allowed in the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jmespath
import orjson
from jmespath.exceptions import JMESPathError

from cproxy.engine.work import Entry
from cproxy.errors import ConfigError
from cproxy.model import Record


class ExpressionFailed(Exception):
    """An expression raised on one message (that message is dead-lettered with the text)."""


def _document(message: Record) -> dict[str, Any]:
    headers = orjson.loads(message.headers_json) if message.headers_json else {}
    return {"key": message.key, "headers": headers, "body": orjson.loads(message.body_json)}


def _truthy(value: Any) -> bool:
    return value not in (None, False, "", [], {})


@dataclass(frozen=True, slots=True)
class Expression:
    """A compiled JMESPath expression; equal when their source texts are."""

    source: str
    _compiled: Any = field(compare=False, repr=False)

    @classmethod
    def compile(cls, where: str, source: object) -> Expression:
        if not isinstance(source, str) or not source.strip():
            raise ConfigError(f"{where} must be a non-empty JMESPath expression")
        try:
            return cls(source, jmespath.compile(source))
        except JMESPathError as exc:
            raise ConfigError(f"{where} is not valid JMESPath: {exc}") from exc

    def _search(self, message: Record) -> Any:
        try:
            return self._compiled.search(_document(message))
        except (JMESPathError, orjson.JSONDecodeError, TypeError, ValueError) as exc:
            raise ExpressionFailed(f"{self.source!r} failed: {exc}") from exc

    def keeps(self, message: Record) -> bool:
        """As a filter: deliver ``message``? Raises ``ExpressionFailed``."""
        return _truthy(self._search(message))

    def reshape(self, message: Record) -> bytes:
        """As a transform: the delivered body, JSON-encoded. Raises ``ExpressionFailed``."""
        return orjson.dumps(self._search(message))


class Screen:
    """Applies a group's filters and transforms to messages as they are read.

    ``entry_for(message, first_read)`` returns the ``Entry`` to hold, or None: filtered out
    (counted once, on the first read, by ``on_filtered(topic)``) or failing an expression
    (dead-lettered once by ``on_failed(message, error)``). A transformed body is computed here,
    once per read, and kept on the entry for delivery.
    """

    __slots__ = ("_filters", "_on_failed", "_on_filtered", "_transforms")

    def __init__(
        self,
        filters: Mapping[str, Expression],
        transforms: Mapping[str, Expression],
        on_filtered: Callable[[str], None],
        on_failed: Callable[[Record, str], None],
    ) -> None:
        self._filters = filters
        self._transforms = transforms
        self._on_filtered = on_filtered
        self._on_failed = on_failed

    def entry_for(self, message: Record, first_read: bool) -> Entry | None:
        topic = message.topic
        keep = self._filters.get(topic)
        reshape = self._transforms.get(topic)
        body: bytes | None = None
        try:
            if keep is not None and not keep.keeps(message):
                if first_read:
                    self._on_filtered(topic)
                return None
            if reshape is not None:
                body = reshape.reshape(message)
        except ExpressionFailed as exc:
            if first_read:
                self._on_failed(message, str(exc))
            return None
        entry = Entry(message)
        entry.body_json = body
        return entry
