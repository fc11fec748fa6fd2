"""W3C trace context (``traceparent``/``tracestate``) in message headers, when OpenTelemetry
is installed (``pip install 'cproxy[otel]'``).

Nothing here imports OpenTelemetry until a message is sent or a consumer is made, and only
when the package is present (one failed import the first time): without it every function
is a no-op and the SDK behaves, and costs, exactly as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from ._trace_otel import Otel

H = TypeVar("H", bound=Callable[..., Any])

#: The headers of the W3C Trace Context format, as messages and push requests carry them.
TRACE_HEADERS = ("traceparent", "tracestate")


@functools.cache
def _otel() -> Otel | None:
    """The OpenTelemetry pieces used here, or None when the package is not installed."""
    try:
        from ._trace_otel import Otel  # only when used: importing the SDK imports nothing
    except ImportError:
        return None
    return Otel()


def traced(handler: H) -> H:
    """``handler`` run in a consumer span per message (see :func:`handler_span`); the
    handler itself, unwrapped, without OpenTelemetry. Use it only while :func:`recording`."""
    otel = _otel()
    return handler if otel is None else otel.wrap(handler)


def recording() -> bool:
    """Whether spans are recorded now (the program set a tracer provider): without that a
    span is a no-op that would still cost ~13 µs per message."""
    otel = _otel()
    return otel is not None and otel.recording()


class Handlers(Generic[H]):
    """A handler and its :func:`traced` twin; :meth:`choose` picks the one to run now.

    Choosing once per pull answer, not per message, saves the ~1 µs the question costs on
    every message; a tracer provider set while the consumer runs applies from the next pull.
    """

    def __init__(self, handler: H) -> None:
        self._plain = handler
        self._traced = traced(handler)
        #: the handler to run now (set by :meth:`choose`)
        self.current = handler

    def choose(self) -> None:
        self.current = (
            self._traced if self._traced is not self._plain and recording() else self._plain
        )


def inject(headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """``headers`` plus the current span's trace context; unchanged without an active span
    (or without OpenTelemetry). Headers the caller set win."""
    otel = _otel()
    if otel is None:
        return headers
    carrier = otel.inject()
    if not carrier:
        return headers
    if headers:
        carrier.update(headers)
    return carrier


def handler_span(topic: str, headers: Mapping[str, str] | None) -> AbstractContextManager[object]:
    """A context manager that runs a handler in a consumer span whose parent is the
    message's trace context (a root span when it has none); a no-op without OpenTelemetry."""
    otel = _otel()
    if otel is None:
        return nullcontext()
    return otel.span(topic, headers)
