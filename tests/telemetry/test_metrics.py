"""Metrics, health endpoints, trace propagation and log hygiene, on real daemons and real tasks."""

from __future__ import annotations

import asyncio
import io
import json
import re
import signal
import urllib.request

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from busscrape.archive.storage import open_storage
from busscrape.bus import names
from busscrape.dispatch.dispatcher import Dispatcher
from busscrape.ingest.daemon import Ingester
from busscrape.telemetry import logs
from busscrape.telemetry.tracing import trace_id_of
from busscrape.worker.daemon import Worker
from tests.support import pages
from tests.support.bus import enqueue, results, stream_messages, wait_until
from tests.support.procs import env_for, listening_port, spawn

pytestmark = pytest.mark.browser


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""  # not listening (yet)


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in a Prometheus exposition (None when absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_metrics_and_health_of_a_running_worker_and_ingester(wbus, wsettings, site, tmp_path):
    pages.install(site)
    await enqueue(wbus.js, site.url("/static"))
    await enqueue(wbus.js, site.url("/js"))
    await enqueue(wbus.js, site.url("/status?code=404"))
    # Port 0: each picks a free port and logs it (a port the test picked could be taken first).
    base = env_for(wsettings, BUSSCRAPE_TELEMETRY__HTTP_HOST="127.0.0.1", BUSSCRAPE_TELEMETRY__HTTP_PORT="0",
                   BUSSCRAPE_ARCHIVE__DIR=str(tmp_path / "archive"))
    worker = spawn(["worker"], base, tmp_path / "w.log")
    ingester = spawn(["ingester"], base, tmp_path / "i.log")
    try:
        worker_port = await listening_port(tmp_path / "w.log", "health.listening", worker)
        ingester_port = await listening_port(tmp_path / "i.log", "health.listening", ingester)
        async def archived():
            status, text = await asyncio.to_thread(get, f"http://127.0.0.1:{ingester_port}/metrics")
            _, work = await asyncio.to_thread(get, f"http://127.0.0.1:{worker_port}/metrics")
            # Every message handled to its end (the counters move before a handler returns), and the
            # 404's dead letter archived too.
            letters = list((tmp_path / "archive").glob("deadletter/dt=*/*.json"))
            return (status == 200 and metric(text, "busscrape_results_archived_total") == 2
                    and metric(work, "busscrape_tasks_total", outcome="dead") == 1 and len(letters) == 1
                    and metric(work, "busscrape_in_flight", service="worker") == 0
                    and metric(text, "busscrape_in_flight", service="ingester") == 0
                    and metric(text, "busscrape_in_flight", service="archivist") == 0)

        await wait_until(archived, timeout=90)
        _, w = await asyncio.to_thread(get, f"http://127.0.0.1:{worker_port}/metrics")
        _, i = await asyncio.to_thread(get, f"http://127.0.0.1:{ingester_port}/metrics")
        assert metric(w, "busscrape_tasks_total", outcome="completed") == 2
        assert metric(w, "busscrape_tasks_total", outcome="dead") == 1
        assert metric(w, "busscrape_render_duration_seconds_count") == 2
        assert metric(w, "busscrape_dead_letters_total", stage="worker", reason="http_404") == 1
        assert metric(w, "busscrape_in_flight", service="worker") == 0
        assert metric(w, "busscrape_browser_restarts_total") == 0
        assert metric(w, "busscrape_consumer_lag", consumer="TASKS/workers") is not None
        assert metric(i, "busscrape_archived_bytes_total") > 1000
        assert metric(i, "busscrape_in_flight", service="ingester") == 0
        assert metric(i, "busscrape_in_flight", service="archivist") == 0
        assert metric(i, "busscrape_consumer_lag", consumer="RESULTS/ingesters") is not None
        for port in (worker_port, ingester_port):
            assert (await asyncio.to_thread(get, f"http://127.0.0.1:{port}/healthz"))[0] == 200
        status, body = await asyncio.to_thread(get, f"http://127.0.0.1:{worker_port}/readyz")
        assert status == 200 and json.loads(body)["checks"] == {"nats": True, "consumer": True, "browser": True}
    finally:
        for proc in (worker, ingester):
            proc.send_signal(signal.SIGTERM)
        for proc in (worker, ingester):
            assert await asyncio.to_thread(proc.wait, 60) == 0


@pytest.fixture(scope="session")
def spans():
    """A real SDK tracer provider with an in-memory exporter (set once: OTel allows one per process)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


async def test_one_trace_id_follows_a_task_from_dispatch_through_worker_and_ingester(
        wbus, wsettings, site, tmp_path, spans):
    pages.install(site)
    captured = io.StringIO()
    logs.configure("json", "info", stream=captured)
    urls = tmp_path / "urls.txt"
    urls.write_text(site.url("/static") + "\n")
    try:
        async with Dispatcher(wbus, wsettings) as dispatcher:
            summary = await dispatcher.dispatch(str(urls))
        assert summary.published == 1

        async def sourced():  # TASKS copies the new SEEN key a moment after the PubAck
            return (await wbus.js.stream_info(names.TASKS_STREAM)).state.messages == 1

        await wait_until(sourced, timeout=10)
        [queued] = await stream_messages(wbus.js, names.TASKS_STREAM)
        trace_id = trace_id_of(queued.headers)
        assert trace_id

        async with Worker(wbus, wsettings) as worker:
            await worker.run()
        [raw] = await stream_messages(wbus.js, names.RESULTS_STREAM)
        assert trace_id_of(raw.headers) == trace_id  # the result carries the same trace on
        storage = open_storage(wsettings, tmp_path / "archive")
        async with storage:
            ingester = Ingester(wbus, storage, wsettings.with_overrides(ingester={"exit_when_idle": 1.5}))
            async with ingester:
                await ingester.run()
    finally:
        logs.configure("json", "info")
    assert len(await results(wbus.js)) == 1

    ours = [s for s in spans.get_finished_spans() if format(s.context.trace_id, "032x") == trace_id]
    span_names = {s.name for s in ours}
    assert {"dispatch task", "render task", "navigate", "capture", "upload artifacts", "publish result",
            "archive result", "copy artifact"} <= span_names
    kinds = {s.name: s.kind.name for s in ours}
    assert kinds["dispatch task"] == "PRODUCER" and kinds["render task"] == "CONSUMER"
    assert kinds["archive result"] == "CONSUMER"
    render = next(s for s in ours if s.name == "render task")
    assert render.attributes["messaging.system"] == "nats" and render.attributes["busscrape.task_id"]

    lines = [json.loads(line) for line in captured.getvalue().splitlines() if line.startswith("{")]
    about_task = [line for line in lines if line.get("event") in ("task.done", "result.archived")]
    assert {line["event"] for line in about_task} == {"task.done", "result.archived"}
    for line in about_task:
        assert line["trace_id"] == trace_id and line["task_id"] and line["url"] and line["attempt"] == 1


UNEXPORTED = """
import sys
from busscrape.settings import TelemetrySettings
from busscrape.telemetry.metrics import Telemetry

t = Telemetry.of_daemon("worker", TelemetrySettings(http_port=None))
t.tasks.add(1, {"outcome": "done"})
t.render_duration.record(0.5)
t.gauge("in_flight", lambda: [(1.0, {"service": "worker"})])
t.close()
loaded = sorted(m for m in sys.modules if m.startswith(("prometheus_client", "opentelemetry.sdk")))
exported = Telemetry.of_daemon("worker", TelemetrySettings(http_port=9464))
exported.tasks.add(1, {"outcome": "done"})
print(loaded, b"busscrape_tasks_total" in exported.exposition())
"""


def test_a_daemon_without_a_metrics_port_records_into_no_ops_and_loads_no_sdk():
    # The daemons `busscrape run` starts serve no /metrics: the SDK and prometheus_client would
    # only cost their start-up (~0.1 s of CPU each, beside their Chromium on two cores).
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", UNEXPORTED], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]", "True"]
