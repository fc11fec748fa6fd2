"""Trace context (DESIGN §6): a trace around ``submit`` is the parent of the handler's span,
for pull consumers and push endpoints; without OpenTelemetry nothing changes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from consumer_sdk import AsyncConsumer, Client, Consumer, Message, Producer
from tests.conftest import ServerFactory
from tests.push_receiver import Receiver
from tests.support import RunningServer, wait_until

ROOT = Path(__file__).resolve().parents[2]
_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    # A global provider can be set once per process: the first test sets it, all share it.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def produce_in_a_trace(url: str, topic: str) -> trace.SpanContext:
    with Producer(url) as producer:
        producer.create_topic(topic, 1)
        with trace.get_tracer("test").start_as_current_span("checkout") as span:
            producer.submit(topic, {"order": 7}, key="o-7").result(timeout=10)
        producer.send(topic, {"order": 8}, key="o-8")  # no active span: no trace headers
        return span.get_span_context()


def handler_spans(exporter: InMemorySpanExporter, topic: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == f"{topic} process"]


def test_a_pulled_message_is_handled_in_a_child_of_the_producers_span(
    server: RunningServer, spans: InMemorySpanExporter
) -> None:
    parent = produce_in_a_trace(server.url, "orders")
    seen: list[Message] = []
    done = threading.Event()

    def handle(msg: Message) -> None:
        seen.append(msg)
        if len(seen) == 2:
            done.set()

    with Client(server.url) as client:
        client.put_group("billing", {"topics": {"orders": {}}})
    consumer = Consumer(server.url, group="billing", topics=["orders"], handler=handle)
    consumer.start()
    try:
        assert done.wait(10)
    finally:
        consumer.stop()
    traced, plain = sorted(seen, key=lambda m: m.offset)
    assert traced.headers["traceparent"].split("-")[1] == format(parent.trace_id, "032x")
    assert "traceparent" not in plain.headers
    handled = sorted(handler_spans(spans, "orders"), key=lambda s: s.start_time or 0)
    assert len(handled) == 2
    child = next(s for s in handled if s.parent is not None)
    assert child.parent is not None
    assert (child.context.trace_id, child.parent.span_id) == (parent.trace_id, parent.span_id)
    assert child.kind == trace.SpanKind.CONSUMER
    other = next(s for s in handled if s is not child)
    assert other.parent is None and other.context.trace_id != parent.trace_id


def test_an_async_handler_runs_in_the_child_span(
    server: RunningServer, spans: InMemorySpanExporter
) -> None:
    parent = produce_in_a_trace(server.url, "orders")
    inside: list[int] = []

    async def main() -> None:
        both = asyncio.Event()

        async def handle(msg: Message) -> None:
            await asyncio.sleep(0)  # the span stays current across awaits
            inside.append(trace.get_current_span().get_span_context().trace_id)
            if len(inside) == 2:
                both.set()

        consumer = AsyncConsumer(server.url, group="g", topics=["orders"], handler=handle)
        await consumer.start()
        try:
            await asyncio.wait_for(both.wait(), 10)
        finally:
            await consumer.stop()

    with Client(server.url) as client:
        client.put_group("g", {"topics": {"orders": {}}})
    asyncio.run(main())
    assert parent.trace_id in inside
    assert len(handler_spans(spans, "orders")) == 2


def test_a_push_request_carries_the_trace_context(
    server_factory: ServerFactory, spans: InMemorySpanExporter
) -> None:
    receiver = Receiver().start()
    try:
        # On loopback: pushing there takes the operator's listing.
        server = server_factory(push_allowed_urls=(receiver.url,))
        parent = produce_in_a_trace(server.url, "orders")
        with Client(server.url) as client:
            client.put_group("pushed", {"topics": {"orders": {"push": {"url": receiver.url}}}})
        wait_until(lambda: len(receiver.requests) >= 2, 10, message="two pushes")
        requests = sorted(receiver.requests, key=lambda r: r.messages[0]["offset"])
        # An instrumented endpoint continues the trace from the HTTP headers.
        context = TraceContextTextMapPropagator().extract(requests[0].headers)
        with trace.get_tracer("endpoint").start_as_current_span("handle", context=context):
            pass
        (endpoint,) = [s for s in spans.get_finished_spans() if s.name == "handle"]
        assert endpoint.parent is not None
        assert (endpoint.context.trace_id, endpoint.parent.span_id) == (
            parent.trace_id,
            parent.span_id,
        )
        assert "traceparent" not in requests[1].headers
    finally:
        receiver.stop()


def test_without_opentelemetry_nothing_is_imported_and_nothing_changes() -> None:
    script = """
import sys
import consumer_sdk
assert not any(m.startswith("opentelemetry") for m in sys.modules), "imported at import time"
sys.modules["opentelemetry"] = None  # not installed: every import of it fails
from consumer_sdk._trace import inject, traced
def handler(msg): return None
assert traced(handler) is handler
assert inject({"a": "b"}) == {"a": "b"} and inject(None) is None
from consumer_sdk import Producer
producer = Producer("http://127.0.0.1:9")
producer.close()
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
