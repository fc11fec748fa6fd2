"""The OpenTelemetry side of :mod:`consumer_sdk._trace`, imported only when it is installed."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, TypeVar, cast

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_TRACER = "consumer_sdk"
H = TypeVar("H", bound=Callable[..., Any])


class Otel:
    def __init__(self) -> None:
        # W3C Trace Context whatever global propagator the program set: the headers are
        # part of the message format (DESIGN §6), read by consumers in other languages too.
        self._propagator = TraceContextTextMapPropagator()
        # A proxy: it follows the provider the program sets, also after this is made.
        self._tracer = trace.get_tracer(_TRACER)

    @staticmethod
    def recording() -> bool:
        """Whether the program set a tracer provider: without one every span is a no-op, and
        making it (parsing the context, attaching it) would cost ~13 µs per message. Asking
        costs ~1 µs itself (an environment lookup), so consumers ask once per pull answer."""
        provider = trace.get_tracer_provider()
        return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)

    def inject(self) -> dict[str, str]:
        if not trace.get_current_span().get_span_context().is_valid:
            return {}
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)
        return carrier

    def span(
        self, topic: str, headers: Mapping[str, str] | None
    ) -> AbstractContextManager[trace.Span]:
        parent = self._propagator.extract(dict(headers)) if headers else None
        return self._tracer.start_as_current_span(
            f"{topic} process",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes={"messaging.system": "cproxy", "messaging.destination.name": topic},
        )

    def wrap(self, handler: H) -> H:
        """The handler, run in :meth:`span` of each message (``async`` kept ``async``).
        Whether to use it (:meth:`recording`) is the caller's choice, made per pull answer."""
        if inspect.iscoroutinefunction(handler):

            @functools.wraps(handler)
            async def run_async(message: Any) -> Any:
                with self.span(message.topic, message.headers):
                    return await handler(message)

            return cast(H, run_async)

        @functools.wraps(handler)
        def run(message: Any) -> Any:
            with self.span(message.topic, message.headers):
                return handler(message)

        return cast(H, run)
