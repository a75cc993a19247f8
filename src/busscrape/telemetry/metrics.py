"""Metrics (Prometheus on ``/metrics``) and tracing (OTLP when ``OTEL_*`` asks) for one process.

Metrics are OpenTelemetry instruments exported in Prometheus format; the names are part of
the operations contract (the Grafana dashboard and alerts use them):

==================================  =========  ================================================
``busscrape_tasks_total``           counter    tasks a worker finished, by ``outcome``
``busscrape_render_duration_seconds`` histogram  time from fetch to result published
``busscrape_results_archived_total``  counter    results an ingester archived
``busscrape_archived_bytes_total``  counter    bytes written to the archive
``busscrape_in_flight``             gauge      messages being worked on, by ``service``
``busscrape_dead_letters_total``    counter    dead letters filed, by ``stage`` and ``reason``
``busscrape_browser_restarts_total``  counter    Chromium relaunches (crash or recycle)
``busscrape_consumer_lag``          gauge      ``num_pending + num_ack_pending``, by ``consumer``
``busscrape_results_full``          gauge      1 while a worker is paused because RESULTS is full
==================================  =========  ================================================

The Prometheus registry is per process by nature; a ``Telemetry`` registers its collector
there and ``close()`` removes it, so services created one after another in one process (the
tests) do not report each other's numbers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from opentelemetry.metrics import CallbackOptions, Meter, NoOpMeterProvider, Observation

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider

    from busscrape.settings import TelemetrySettings

RENDER_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)


class Telemetry:
    """The instruments of one busscrape process."""

    def __init__(self, service: str, *, exported: bool = True) -> None:
        """With ``exported=False`` (a process that serves no ``/metrics``: the daemons ``busscrape
        run`` starts) the instruments are the OpenTelemetry API's no-ops, and neither the SDK nor
        prometheus_client is imported: ~0.1 s of CPU in the start of such a process, which
        competes with its Chromium for two cores."""
        self.service = service
        self.provider: MeterProvider | None = None
        meter: Meter
        if exported:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.resources import Resource

            self.provider = MeterProvider(metric_readers=[PrometheusMetricReader(disable_target_info=True)],
                                          resource=Resource.create({"service.name": f"busscrape-{service}"}))
            meter = self.provider.get_meter("busscrape")
        else:
            meter = NoOpMeterProvider().get_meter("busscrape")
        self.tasks = meter.create_counter("busscrape_tasks", description="Tasks a worker finished, by outcome")
        self.render_duration = meter.create_histogram(
            "busscrape_render_duration", unit="s", description="Time from fetching a task to its result published",
            explicit_bucket_boundaries_advisory=list(RENDER_BUCKETS))
        self.results_archived = meter.create_counter("busscrape_results_archived",
                                                     description="Results an ingester archived")
        self.archived_bytes = meter.create_counter("busscrape_archived_bytes",
                                                   description="Bytes written to the archive")
        self.dead_letters = meter.create_counter("busscrape_dead_letters",
                                                 description="Dead letters filed, by stage and reason")
        self.crawl_links = meter.create_counter(
            "busscrape_crawl_links", description="Links a worker read on crawl pages, by crawl_id and outcome "
            "(queued, duplicate, out_of_scope, robots_disallowed, budget_cut, depth_cut, follow_failed …)")
        self.crawl_pages = meter.create_counter(
            "busscrape_crawl_pages", description="Crawl pages whose links a worker handled, by crawl_id and how "
            "(followed, or why not: depth, not_html, redirected_out_of_scope, follow_failed)")
        self._gauges: dict[str, list[Callable[[], Iterable[tuple[float, dict[str, str]]]]]] = {}
        meter.create_observable_gauge("busscrape_in_flight", [self._observe("in_flight")],
                                      description="Messages being worked on, by service")
        meter.create_observable_gauge("busscrape_consumer_lag", [self._observe("lag")],
                                      description="num_pending + num_ack_pending of a durable consumer")
        meter.create_observable_counter("busscrape_browser_restarts", [self._observe("browser_restarts")],
                                        description="Chromium relaunches after a crash or for recycling")
        meter.create_observable_gauge("busscrape_results_full", [self._observe("results_full")],
                                      description="1 while this worker fetches no tasks because RESULTS is full")
        meter.create_observable_gauge("busscrape_host_cooling", [self._observe("host_cooling")], unit="s",
                                      description="Seconds a host still cools for the whole fleet (a 429/503), by host")

    @classmethod
    def of_daemon(cls, service: str, settings: TelemetrySettings) -> Telemetry:
        """A daemon's: exported when it serves ``/metrics`` (``BUSSCRAPE_TELEMETRY__HTTP_PORT``)."""
        return cls(service, exported=settings.http_port is not None)

    def _observe(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(_: CallbackOptions) -> Iterable[Observation]:
            return [Observation(value, attrs) for source in self._gauges.get(name, []) for value, attrs in source()]

        return callback

    def gauge(self, name: str, source: Callable[[], Iterable[tuple[float, dict[str, str]]]]) -> None:
        """Report ``in_flight``, ``lag``, ``browser_restarts``, ``results_full`` or ``host_cooling`` from
        ``source`` at each scrape (several sources may report one gauge, with different attributes)."""
        self._gauges.setdefault(name, []).append(source)

    def exposition(self) -> bytes:
        """The Prometheus text exposition of this process."""
        if self.provider is None:
            raise RuntimeError(f"the {self.service}'s metrics are not exported (Telemetry(exported=False))")
        import prometheus_client

        return prometheus_client.generate_latest(prometheus_client.REGISTRY)

    def close(self) -> None:
        """Stop exporting (the reader takes its collector out of the process registry)."""
        if self.provider is not None:
            with contextlib.suppress(Exception):  # shutting down twice is not worth a crash at exit
                self.provider.shutdown()


def configure_tracing(service: str) -> bool:
    """Export spans over OTLP when the standard variables ask for it; returns whether it does.

    ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
    ``OTEL_TRACES_EXPORTER=otlp`` turn it on; everything else (sampler, headers, timeouts) the
    SDK reads from the environment itself. Off by default: trace context still travels in the
    message headers, so log lines carry the same trace id either way.
    """
    wanted = (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
              or os.environ.get("OTEL_TRACES_EXPORTER", "").lower() == "otlp")
    if not wanted or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": f"busscrape-{service}"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True
