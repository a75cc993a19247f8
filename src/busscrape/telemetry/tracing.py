"""W3C trace context across the bus: dispatch → worker → ingester.

Each task starts a trace at dispatch; its ``traceparent`` travels in NATS headers and every
service continues it, so one trace id follows a task through every log line and span.
Spans (``messaging.*`` attributes, PRODUCER/CONSUMER kinds) are recorded and exported only
when a tracer provider is configured (``telemetry.configure_tracing``: the standard ``OTEL_*``
variables); without one the context still travels, so log lines keep their trace id.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from busscrape.bus.names import TRACEPARENT

_PROPAGATOR = TraceContextTextMapPropagator()

tracer = trace.get_tracer("busscrape")


def recording() -> bool:
    """Whether spans are being recorded (a real tracer provider is configured)."""
    return type(trace.get_tracer_provider()).__name__ not in ("ProxyTracerProvider", "NoOpTracerProvider")


_ZERO_TRACE_ID, _ZERO_SPAN_ID = "0" * 32, "0" * 16


def new_traceparent() -> str:
    """A fresh sampled trace context for a new task (cheap: no span object needed)."""
    ids = os.urandom(24).hex()
    if ids.startswith(_ZERO_TRACE_ID) or ids.endswith(_ZERO_SPAN_ID):  # invalid in W3C; about never
        return new_traceparent()
    return f"00-{ids[:32]}-{ids[32:]}-01"


def task_traceparent(task_id: str, url: str, *, record: bool | None = None) -> str:
    """The trace context a new task is published with: a PRODUCER span when tracing records,
    else just fresh ids (the dispatcher's hot path pays for spans only when they are kept).

    ``record`` is ``recording()`` asked once by a caller that publishes many tasks: asking it
    costs an environment lookup per call while no provider is set.
    """
    if not (recording() if record is None else record):
        return new_traceparent()
    attributes = {"messaging.system": "nats", "messaging.operation.type": "publish",
                  "messaging.destination.name": "SEEN", "busscrape.task_id": task_id, "url.full": url}
    with tracer.start_as_current_span("dispatch task", kind=SpanKind.PRODUCER, attributes=attributes):
        headers: dict[str, str] = {}
        _PROPAGATOR.inject(headers)
        return headers.get(TRACEPARENT) or new_traceparent()


def inject(headers: dict[str, str]) -> dict[str, str]:
    """Put the current context into ``headers`` (a no-op when there is none)."""
    _PROPAGATOR.inject(headers)
    return headers


def extract(headers: Mapping[str, str] | None) -> otel_context.Context:
    """The context carried by a message's headers (empty when it carries none)."""
    return _PROPAGATOR.extract(dict(headers or {}))


def trace_id_of(headers: Mapping[str, str] | None) -> str | None:
    """The 32-hex trace id in a message's ``traceparent`` header, for log lines."""
    value = (headers or {}).get(TRACEPARENT)
    if not value:
        return None
    parts = value.split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


@contextlib.contextmanager
def consuming(name: str, headers: Mapping[str, str] | None, stream: str, **attributes: Any) -> Iterator[Span]:
    """A CONSUMER span continuing the trace in ``headers``, current for the block."""
    attrs = {"messaging.system": "nats", "messaging.operation.type": "process",
             "messaging.destination.name": stream, **{k: v for k, v in attributes.items() if v is not None}}
    with tracer.start_as_current_span(name, context=extract(headers), kind=SpanKind.CONSUMER,
                                      attributes=attrs) as span:
        yield span


@contextlib.contextmanager
def span(name: str, kind: SpanKind = SpanKind.INTERNAL, /, **attributes: Any) -> Iterator[Span]:
    """A child span of the current one (``kind`` positional: an attribute may be called anything)."""
    attrs = {k: v for k, v in attributes.items() if v is not None}
    with tracer.start_as_current_span(name, kind=kind, attributes=attrs) as current:
        yield current
