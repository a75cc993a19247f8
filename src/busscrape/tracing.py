"""W3C trace context across the bus: dispatch → worker → ingester.

Each task starts a trace at dispatch; its ``traceparent`` travels in NATS headers and every
service continues it, so one trace id follows a task through every log line and span.
Spans are exported over OTLP only when the standard ``OTEL_*`` variables ask for it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .subjects import TRACEPARENT

_PROPAGATOR = TraceContextTextMapPropagator()

tracer = trace.get_tracer("busscrape")


def new_traceparent() -> str:
    """A fresh sampled trace context for a new task (cheap: no span object needed)."""
    trace_id = int.from_bytes(os.urandom(16), "big") or 1
    span_id = int.from_bytes(os.urandom(8), "big") or 1
    return f"00-{trace_id:032x}-{span_id:016x}-01"


def inject(headers: dict[str, str]) -> dict[str, str]:
    """Put the current span's context into ``headers`` (no-op without a recording span)."""
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
