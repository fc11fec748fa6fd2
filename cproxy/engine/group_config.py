# cproxy: compiled (mypyc), see cproxy/_native.py
"""A consumer group's settings: validated once, immutable afterwards."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from cproxy.engine.expressions import Expression
from cproxy.engine.orderkey import OrderBy
from cproxy.engine.push_config import PushConfig
from cproxy.errors import ConfigError, InvalidOrderBy

MAX_BACKOFF_MS: Final = 86_400_000
MAX_ACK_TIMEOUT_MS: Final = 43_200_000
#: Upper bound of ``stuck_after_ms`` (a day) and of ``dead_letter_retention_ms`` (~100 years).
MAX_STUCK_AFTER_MS: Final = 86_400_000
MAX_RETENTION_MS: Final = 3_153_600_000_000
MAX_PER_SECOND: Final = 1_000_000

Start = Literal["earliest", "latest"]
OnExhausted = Literal["dead_letter", "block"]


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Settings of one consumer group (docs/api.md, ``PUT /v1/groups/{group}``).

    Defaults: 5 attempts, backoff 1 s / 5 s / 30 s (the last repeating), 30 s ack timeout,
    start at the earliest offset, dead-letter when attempts run out, 10,000 messages buffered,
    a head in flight for a minute counts as stuck, dead letters kept until deleted.
    """

    topics: Mapping[str, OrderBy]
    max_attempts: int = 5
    retry_backoff_ms: tuple[int, ...] = (1000, 5000, 30000)
    ack_timeout_ms: int = 30_000
    start: Start = "earliest"
    on_exhausted: OnExhausted = "dead_letter"
    max_buffered: int = 10_000
    #: Topic -> push delivery settings, for topic entries that have ``push``.
    push: Mapping[str, PushConfig] = field(default_factory=dict)
    #: Topic -> filter (messages for which it is not truthy are finished undelivered).
    filters: Mapping[str, Expression] = field(default_factory=dict)
    #: Topic -> transform of the delivered body.
    transforms: Mapping[str, Expression] = field(default_factory=dict)
    #: A head in flight this long counts as a blocked (stuck) key; shorter is just working.
    stuck_after_ms: int = 60_000
    #: Dead letters older than this are deleted by the retention pass; None keeps them.
    dead_letter_retention_ms: int | None = None
    #: Deliveries per second of the whole group (pull and push); None: unlimited. The broker
    #: enforces it (``cproxy.broker.rate``): the engine has no clock.
    max_per_second: int | None = None

    def backoff_ms(self, attempt: int) -> int:
        """Backoff after the ``attempt``-th delivery failed (1-based; the last value repeats)."""
        backoff = self.retry_backoff_ms
        return backoff[min(attempt, len(backoff)) - 1]

    def to_dict(self) -> dict[str, Any]:
        topics: dict[str, dict[str, Any]] = {
            name: {"order_by": ob.spec} for name, ob in self.topics.items()
        }
        for name, push in self.push.items():
            topics[name]["push"] = push.to_dict()
        for name, expression in self.filters.items():
            topics[name]["filter"] = expression.source
        for name, expression in self.transforms.items():
            topics[name]["transform"] = expression.source
        return {
            "topics": topics,
            "max_attempts": self.max_attempts,
            "retry_backoff_ms": list(self.retry_backoff_ms),
            "ack_timeout_ms": self.ack_timeout_ms,
            "start": self.start,
            "on_exhausted": self.on_exhausted,
            "max_buffered": self.max_buffered,
            "stuck_after_ms": self.stuck_after_ms,
            "dead_letter_retention_ms": self.dead_letter_retention_ms,
            "max_per_second": self.max_per_second,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GroupConfig:
        """Validate a JSON-shaped config; missing fields take their defaults."""
        unknown = set(data) - _KNOWN
        if unknown:
            raise ConfigError(f"unknown group setting(s): {', '.join(sorted(unknown))}")
        topics = data.get("topics")
        if not isinstance(topics, Mapping) or not topics:
            raise ConfigError("'topics' must be a non-empty object of topic -> {order_by}")
        parsed: dict[str, OrderBy] = {}
        push: dict[str, PushConfig] = {}
        filters: dict[str, Expression] = {}
        transforms: dict[str, Expression] = {}
        for name, sub in topics.items():
            if not isinstance(sub, Mapping):
                raise ConfigError(f"topics.{name} must be an object like {{'order_by': 'key'}}")
            extra = set(sub) - {"order_by", "push", "filter", "transform"}
            if extra:
                raise ConfigError(f"topics.{name}: unknown setting(s) {', '.join(sorted(extra))}")
            spec = sub.get("order_by", "key")
            if not isinstance(spec, str):
                raise ConfigError(f"topics.{name}.order_by must be a string")
            try:
                parsed[str(name)] = OrderBy.parse(spec)
            except InvalidOrderBy as exc:
                raise InvalidOrderBy(f"topics.{name}.order_by: {exc.message}") from exc
            if "push" in sub:
                push[str(name)] = PushConfig.from_dict(f"topics.{name}", sub["push"])
            if sub.get("filter") is not None:
                filters[str(name)] = Expression.compile(f"topics.{name}.filter", sub["filter"])
            if sub.get("transform") is not None:
                transforms[str(name)] = Expression.compile(
                    f"topics.{name}.transform", sub["transform"]
                )
        defaults = cls(topics={})
        backoff = data.get("retry_backoff_ms", list(defaults.retry_backoff_ms))
        if (
            not isinstance(backoff, list | tuple)
            or not backoff
            or len(backoff) > 100
            or not all(_is_int(v) and 0 <= v <= MAX_BACKOFF_MS for v in backoff)
        ):
            raise ConfigError(
                f"retry_backoff_ms must be a list of 1..100 integers in 0..{MAX_BACKOFF_MS}"
            )
        start = data.get("start", defaults.start)
        if start not in ("earliest", "latest"):
            raise ConfigError("start must be 'earliest' or 'latest'")
        on_exhausted = data.get("on_exhausted", defaults.on_exhausted)
        if on_exhausted not in ("dead_letter", "block"):
            raise ConfigError("on_exhausted must be 'dead_letter' or 'block'")
        dead_retention = data.get("dead_letter_retention_ms")
        if dead_retention is not None:
            dead_retention = _int(data, "dead_letter_retention_ms", 0, 1, MAX_RETENTION_MS)
        return cls(
            topics=parsed,
            max_attempts=_int(data, "max_attempts", defaults.max_attempts, 1, 1000),
            retry_backoff_ms=tuple(backoff),
            ack_timeout_ms=_int(
                data, "ack_timeout_ms", defaults.ack_timeout_ms, 10, MAX_ACK_TIMEOUT_MS
            ),
            start=start,
            on_exhausted=on_exhausted,
            max_buffered=_int(data, "max_buffered", defaults.max_buffered, 1, 10_000_000),
            max_per_second=(
                None
                if data.get("max_per_second") is None
                else _int(data, "max_per_second", 0, 1, MAX_PER_SECOND)
            ),
            push=push,
            filters=filters,
            transforms=transforms,
            stuck_after_ms=_int(
                data, "stuck_after_ms", defaults.stuck_after_ms, 1, MAX_STUCK_AFTER_MS
            ),
            dead_letter_retention_ms=dead_retention,
        )


_KNOWN: Final = frozenset(
    {
        "topics",
        "max_attempts",
        "retry_backoff_ms",
        "ack_timeout_ms",
        "start",
        "on_exhausted",
        "max_buffered",
        "stuck_after_ms",
        "dead_letter_retention_ms",
        "max_per_second",
    }
)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(data: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = data.get(name, default)
    if not _is_int(value) or not low <= value <= high:
        raise ConfigError(f"{name} must be an integer in {low}..{high}, got {value!r}")
    return int(value)
