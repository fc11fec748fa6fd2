"""Small immutable settings objects. Every duration is in milliseconds and says so."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, fields
from typing import TypedDict


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter for transient errors.

    The n-th retry (1-based) waits ``initial_backoff_ms * multiplier ** (n - 1)``, capped at
    ``max_backoff_ms``, then spread by ``±jitter`` (a fraction) so that many clients that failed
    together do not retry together. ``max_attempts`` bounds the tries of one call (the first
    included) for :class:`~consumer_sdk.Client` and the producers; the consumer loops ignore it
    and retry until stopped, because giving up there would only stall the group.
    """

    max_attempts: int = 5
    initial_backoff_ms: int = 100
    max_backoff_ms: int = 5_000
    multiplier: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if not 0 <= self.initial_backoff_ms <= self.max_backoff_ms:
            raise ValueError("need 0 <= initial_backoff_ms <= max_backoff_ms")
        if self.multiplier < 1:
            raise ValueError("multiplier must be >= 1")
        if not 0 <= self.jitter < 1:
            raise ValueError("jitter must be in [0, 1)")

    def backoff_ms(self, retry: int) -> float:
        """Milliseconds to wait before the ``retry``-th retry (1-based)."""
        exponent = min(max(retry, 1) - 1, 64)  # bounded: float overflow past ~1000
        base = min(self.initial_backoff_ms * self.multiplier**exponent, self.max_backoff_ms)
        return base * (1 + random.uniform(-self.jitter, self.jitter))


#: Retry nothing: one try per call.
NO_RETRY = RetryPolicy(max_attempts=1)


class ConsumerOptions(TypedDict, total=False):
    """The tuning keywords that :class:`~consumer_sdk.Consumer` and ``AsyncConsumer`` share.

    Each is a field of :class:`ConsumerConfig` (same name, same default and meaning; durations
    in milliseconds); ``retry=None`` means the default :class:`RetryPolicy`. Both consumers
    take them as ``**options`` and turn them into their ``config`` with
    :meth:`ConsumerConfig.from_options`, so there is one list of options, not one per consumer.
    """

    concurrency: int
    max_messages: int
    max_per_key: int
    wait_ms: int
    max_outstanding: int | None
    ack_linger_ms: int
    extend_after_ms: int | None
    extend_lease_ms: int | None
    idle_backoff_ms: int
    max_idle_backoff_ms: int
    request_timeout_ms: int
    drain_timeout_ms: int | None
    flush_timeout_ms: int
    discover_interval_ms: int
    retry: RetryPolicy | None
    name: str | None


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    """Validated settings of a :class:`~consumer_sdk.Consumer` / ``AsyncConsumer``.

    Built from the consumer's keyword arguments (see their docstrings for the meaning of each);
    read it back as ``consumer.config``.
    """

    concurrency: int = 8
    max_messages: int = 32
    #: > 1: pull same-key runs of up to this many messages, handled in order (a fail stops
    #: the run; the server sends the rest back behind the failed message).
    max_per_key: int = 1
    wait_ms: int = 1_000
    max_outstanding: int | None = None
    ack_linger_ms: int = 10
    extend_after_ms: int | None = None
    extend_lease_ms: int | None = None
    idle_backoff_ms: int = 50
    max_idle_backoff_ms: int = 1_000
    request_timeout_ms: int = 10_000
    drain_timeout_ms: int | None = None
    flush_timeout_ms: int = 10_000
    #: with ``discover=True``: how often ``GET /v1/cluster`` is asked again for the live proxies
    discover_interval_ms: int = 10_000
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: How this consumer is named in the group's stats, after its host and process id
    #: (``host/pid/name``; default: the group's name).
    name: str | None = None

    def __post_init__(self) -> None:
        checks = [
            (self.concurrency >= 1, "concurrency must be >= 1"),
            (1 <= self.max_messages <= 1000, "max_messages must be in 1..1000"),
            (1 <= self.max_per_key <= 1000, "max_per_key must be in 1..1000"),
            (0 <= self.wait_ms <= 30_000, "wait_ms must be in 0..30000"),
            (
                self.max_outstanding is None or self.max_outstanding >= 1,
                "max_outstanding must be >= 1",
            ),
            (self.ack_linger_ms >= 0, "ack_linger_ms must be >= 0"),
            (
                self.extend_after_ms is None or self.extend_after_ms >= 1,
                "extend_after_ms must be >= 1",
            ),
            (
                self.extend_lease_ms is None or self.extend_lease_ms >= 10,
                "extend_lease_ms must be >= 10",
            ),
            (
                0 <= self.idle_backoff_ms <= self.max_idle_backoff_ms,
                "need 0 <= idle_backoff_ms <= max_idle_backoff_ms",
            ),
            (self.request_timeout_ms >= 1, "request_timeout_ms must be >= 1"),
            (
                self.drain_timeout_ms is None or self.drain_timeout_ms >= 0,
                "drain_timeout_ms must be >= 0",
            ),
            (self.flush_timeout_ms >= 0, "flush_timeout_ms must be >= 0"),
            (self.discover_interval_ms >= 100, "discover_interval_ms must be >= 100"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @classmethod
    def from_options(cls, options: ConsumerOptions) -> ConsumerConfig:
        """Validated settings from a consumer's keyword options (absent ones take defaults).

        An unknown keyword is a ``TypeError`` naming it, as for any misspelt argument.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unexpected consumer option(s): {', '.join(unknown)}")
        values = {k: v for k, v in options.items() if v is not None or k != "retry"}
        return cls(**values)  # type: ignore[arg-type]

    @property
    def outstanding_limit(self) -> int:
        """Messages pulled but not yet finished, per consumer (soft: see ``max_outstanding``)."""
        if self.max_outstanding is not None:
            return self.max_outstanding
        # Four per worker: enough that a pull can refill the pool while handlers still run.
        return max(self.max_messages, 4 * self.concurrency)
