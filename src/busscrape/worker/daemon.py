"""``busscrape worker``: renders tasks from TASKS and publishes results to RESULTS.

Per task: decode (poison -> DEADLETTER), policy check, per-host politeness, render in an
isolated tab (a reused page wiped between tasks, or a fresh context: ``worker.isolation``),
artifacts into the ARTIFACTS object store, the result (claim checks only) to RESULTS with
``Nats-Msg-Id = result-<task_id>-<task_seq>``, wait for the PubAck, and only then
``ack_sync()`` the task. So a worker killed at any point leaves either no result (the task is
redelivered) or exactly one (a redelivered attempt's publish is a duplicate; it then drops its
own artifacts and acks).

Failures follow the error tree: retryable ones are recorded in ATTEMPTS and nak'ed with
exponential backoff and jitter (honouring Retry-After); on the last allowed delivery, and for
permanent errors at once, the task goes to DEADLETTER with its whole attempt history.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import structlog
from nats.aio.msg import Msg
from opentelemetry.trace import SpanKind

from busscrape.artifacts import leftovers
from busscrape.artifacts.store import ArtifactStore, object_name
from busscrape.bus import names
from busscrape.bus.connection import Bus
from busscrape.bus.consumer import PullService
from busscrape.bus.retry import TRANSIENT, backoff
from busscrape.deadletters import filing
from busscrape.errors import (
    BusscrapeError,
    InvalidTask,
    MessageDecodeError,
    NavigationTimeout,
    PermanentError,
    RetryableError,
    StorageUnavailable,
)
from busscrape.model.messages import (
    ArtifactRef,
    AttemptRecord,
    DeadLetter,
    ScrapeResult,
    ScrapeTask,
    decode,
    encode,
    utcnow,
)
from busscrape.model.steps import Evaluate
from busscrape.net.egress import EgressProxy
from busscrape.net.policy import NetworkPolicy
from busscrape.settings import Settings
from busscrape.status.records import StatusBoard, Transitions
from busscrape.telemetry import tracing
from busscrape.telemetry.metrics import Telemetry
from busscrape.worker.attempts import AttemptLog
from busscrape.worker.browser.pool import BrowserPool
from busscrape.worker.capture import Rendered
from busscrape.worker.politeness import HostGate
from busscrape.worker.reaper import Reaper
from busscrape.worker.render import Renderer

log = structlog.get_logger("busscrape.worker")


class Worker(PullService):
    kind = "worker"
    stream = names.TASKS_STREAM
    durable = names.WORKERS_CONSUMER

    def __init__(self, bus: Bus, settings: Settings, telemetry: Telemetry | None = None) -> None:
        w = settings.worker
        super().__init__(bus, concurrency=w.concurrency, max_items=w.max_tasks, exit_when_idle=w.exit_when_idle,
                         grace_period=w.grace_period, telemetry=telemetry)
        self.settings = settings
        self.policy = NetworkPolicy.from_settings(settings.network.allow)
        self.gate = HostGate(w.host_concurrency, w.host_delay)
        self.attempts = AttemptLog(bus.js)
        self.artifacts = ArtifactStore(bus.js, timeout=settings.nats.request_timeout)
        self.board = StatusBoard(bus.js)
        self.max_deliver = settings.streams.worker_max_deliver
        self.pool: BrowserPool | None = None
        self.renderer: Renderer | None = None
        self._stack = AsyncExitStack()

    # -- lifecycle --------------------------------------------------------------------------

    async def setup(self) -> None:
        egress = await self._stack.enter_async_context(EgressProxy(self.policy))
        w = self.settings.worker
        self.pool = await self._stack.enter_async_context(
            BrowserPool(self.settings.browser, proxy_url=egress.url, recycle_after_tasks=w.recycle_after_tasks,
                        recycle_rss=w.recycle_rss, isolation=w.isolation, tab_max_uses=w.tab_max_uses,
                        tab_wipe_delay=w.tab_wipe_delay))
        self.renderer = Renderer(self.pool, self.policy, egress, w, self.gate)
        await self.pool.prewarm(w.concurrency)
        if self.telemetry is not None:
            pool = self.pool
            self.telemetry.gauge("browser_restarts", lambda: [(pool.restarts, {})])

    def counted(self, outcome: str) -> None:
        if self.telemetry is not None and outcome != "duplicate_results":
            self.telemetry.tasks.add(1, {"outcome": outcome})

    async def checks(self) -> dict[str, bool]:
        return {**await super().checks(), "browser": self.pool is not None and self.pool.up}

    async def teardown(self) -> None:
        await self.artifacts.close()
        await self._stack.aclose()

    def companions(self) -> list[PullService]:
        if not self.settings.worker.reaper:
            return []
        return [Reaper(self.bus, self.attempts, self.artifacts, grace_period=self.grace_period,
                       telemetry=self.telemetry)]

    async def background(self) -> list[asyncio.Task[Any]]:
        info = await self.bus.js.consumer_info(self.stream, self.durable)
        self.max_deliver = info.config.max_deliver or -1
        tasks = []
        if (interval := self.settings.worker.stray_chunk_interval) > 0:
            strays = leftovers.StrayChunks(self.artifacts)
            tasks.append(asyncio.create_task(strays.run(self._stopping, interval), name="stray-chunks"))
        return tasks

    # -- one task ---------------------------------------------------------------------------

    async def handle(self, msg: Msg) -> None:
        headers = msg.headers or {}
        if headers.get(names.KV_OPERATION) in ("DEL", "PURGE"):
            # A delete marker from the SEEN bucket, sourced into TASKS: not work.
            self.count("skipped")
            await msg.ack_sync(timeout=self.settings.nats.request_timeout)
            return
        try:
            task = decode(ScrapeTask, msg.data)
        except MessageDecodeError as exc:
            await self._poison(msg, exc)
            return
        attempt = msg.metadata.num_delivered
        with structlog.contextvars.bound_contextvars(task_id=task.task_id, url=task.url, attempt=attempt,
                                                     trace_id=tracing.trace_id_of(headers)), \
                tracing.consuming("render task", headers, self.stream, **{
                    "busscrape.task_id": task.task_id, "url.full": task.url,
                    "messaging.message.delivery_count": attempt}) as span:
            story = Transitions(self.board, task_id=task.task_id, url=task.url, dispatched_at=task.dispatched_at,
                                attempt=attempt, worker=self.settings.worker.name)
            await self._work(msg, task, story, span)

    async def _work(self, msg: Msg, task: ScrapeTask, story: Transitions, span: Any) -> None:
        """Render, store, publish, ack; or hand the failure to its path (retry or dead letter)."""
        seq, attempt = msg.metadata.sequence.stream, story.attempt
        started = time.perf_counter()
        # Stored while the page renders, not before: one round trip less per task. It is awaited
        # before any later record of the task (and before the result), so STATUS keeps its order.
        running = asyncio.ensure_future(story.start())
        try:
            self._validate(task)
            scraped_at = utcnow()
            rendered = await self._render(task)
            result = await self._result(task, seq, attempt, rendered, scraped_at)
            await running
            # Sent beside the result, so it costs no round trip, and on top of `running`: should
            # the ingester record `archived` first, this is left out rather than stored after it.
            recorded = asyncio.ensure_future(story.step("rendered", status=result.status))
            try:
                await self._publish(task, result)
            finally:
                await recorded
            await msg.ack_sync(timeout=self.settings.nats.request_timeout)
        except RetryableError as exc:
            span.set_attribute("busscrape.outcome", f"retry:{exc.reason}")
            await running
            await self._failed(msg, story, task, seq, exc)
            return
        except PermanentError as exc:
            span.set_attribute("busscrape.outcome", f"dead:{exc.reason}")
            await running
            await self._dead(msg, story, task, seq, exc)
            return
        self.count("completed")
        span.set_attribute("http.response.status_code", result.status or 0)
        if self.telemetry is not None:
            self.telemetry.render_duration.record(time.perf_counter() - started)
        log.info("task.done", status=result.status, ms=result.timings.get("total"))
        if attempt > 1:
            await self.attempts.clear(task.task_id, seq)

    def _validate(self, task: ScrapeTask) -> None:
        if len(task.steps) > self.settings.worker.max_steps:
            raise InvalidTask(f"{len(task.steps)} steps, over max_steps {self.settings.worker.max_steps}",
                              reason="too_many_steps")
        if not self.settings.worker.allow_evaluate and any(isinstance(s, Evaluate) for s in task.steps):
            raise InvalidTask("the evaluate step is disabled on this worker (BUSSCRAPE_WORKER__ALLOW_EVALUATE)",
                              reason="evaluate_disabled")

    async def _render(self, task: ScrapeTask) -> Rendered:
        """The page rendered and captured, within ``task_timeout`` and the host's politeness."""
        assert self.renderer is not None
        host = urlsplit(task.url).hostname or ""
        try:
            async with asyncio.timeout(self.settings.worker.task_timeout):
                async with self.gate.enter(host):
                    return await self.renderer.render(task)
        except TimeoutError:
            raise NavigationTimeout(f"task took longer than task_timeout {self.settings.worker.task_timeout:.0f}s",
                                    reason="task_timeout") from None

    async def _result(self, task: ScrapeTask, seq: int, attempt: int, rendered: Rendered,
                      scraped_at: datetime) -> ScrapeResult:
        """The captures stored in ARTIFACTS, and the result that points at them."""
        with tracing.span("upload artifacts", count=len(rendered.captures)):
            # All at once: a task's latency pays one object-store round trip, not one per artifact.
            stored = await asyncio.gather(*(
                self.artifacts.put(object_name(task.task_id, seq, attempt, c.file), c.data, c.content_type,
                                   kind=c.kind, file=c.file) for c in rendered.captures), return_exceptions=True)
        refs = [r for r in stored if isinstance(r, ArtifactRef)]
        failed = [r for r in stored if isinstance(r, BaseException)]
        if failed:
            await self._drop(refs)
            raise failed[0] if isinstance(failed[0], StorageUnavailable) else StorageUnavailable(repr(failed[0]))
        return ScrapeResult(
            task_id=task.task_id, task_seq=seq, url=task.url, original_url=task.original_url,
            final_url=rendered.final_url, status=rendered.status, redirect_chain=rendered.redirect_chain,
            response_headers=rendered.response_headers, title=rendered.title, timings=rendered.timings,
            artifacts=tuple(refs), labels=task.labels, worker=self.settings.worker.name, attempt=attempt,
            scraped_at=scraped_at, blocked_requests=tuple(rendered.blocked_requests),
            dispatched_at=task.dispatched_at,
        )

    async def _publish(self, task: ScrapeTask, result: ScrapeResult) -> None:
        try:
            with tracing.span("publish result", SpanKind.PRODUCER, **{
                    "messaging.system": "nats", "messaging.destination.name": names.RESULTS_STREAM}):
                out = tracing.inject({names.MSG_ID: names.result_msg_id(task.task_id, result.task_seq)})
                ack = await self.bus.js.publish(names.result_subject(task.task_id), encode(result),
                                                stream=names.RESULTS_STREAM, headers=out,
                                                timeout=self.settings.nats.request_timeout)
        except TRANSIENT as exc:
            await self._drop(result.artifacts)
            raise StorageUnavailable(f"RESULTS did not take the result: {exc!r}",
                                     reason="results_unavailable") from None
        keep = None
        if ack.duplicate:
            # An earlier delivery of this task already published its result (and was killed
            # before its ack): that result stands; these artifacts would be orphans.
            self.count("duplicate_results")
            await self._drop(result.artifacts)
        else:
            keep = {ref.object for ref in result.artifacts}
        if result.attempt > 1:
            await self._sweep(task, result.task_seq, range(1, result.attempt), keep)

    async def _sweep(self, task: ScrapeTask, seq: int, attempts: range, keep: set[str] | None = None) -> None:
        """Before the ack, so a kill leaves the task (and this) to the next delivery."""
        found = await leftovers.sweep(self.bus.js, self.artifacts, task, seq, attempts, keep)
        if found:  # objects, not tasks: kept out of the task metric
            self.counters["leftovers_discarded"] += found

    async def _drop(self, refs: tuple[ArtifactRef, ...] | list[ArtifactRef]) -> None:
        for ref in refs:
            try:
                await self.artifacts.release(ref)
            except TRANSIENT:
                pass  # the bucket's TTL collects it

    # -- failure paths ----------------------------------------------------------------------

    def _record(self, attempt: int, exc: BusscrapeError) -> AttemptRecord:
        status = None
        if exc.reason.startswith("http_") and exc.reason[5:].isdigit():
            status = int(exc.reason[5:])
        return AttemptRecord(attempt=attempt, worker=self.settings.worker.name, at=utcnow(), reason=exc.reason,
                             error=str(exc)[:2000], retryable=isinstance(exc, RetryableError), status=status)

    async def _failed(self, msg: Msg, story: Transitions, task: ScrapeTask, seq: int, exc: RetryableError) -> None:
        attempt = story.attempt
        history = await self.attempts.record(task.task_id, seq, self._record(attempt, exc))
        if 0 < self.max_deliver <= attempt:
            await self._file(msg, story, task, seq, history, exc, last=True)
            return
        delay = self.retry_delay(attempt, exc.retry_after)
        self.count("retried")
        await story.step("retrying", reason=exc.reason, error=str(exc)[:500])
        log.warning("task.retry", reason=exc.reason, error=str(exc)[:300], delay=round(delay, 2))
        await msg.nak(delay=delay)

    async def _dead(self, msg: Msg, story: Transitions, task: ScrapeTask, seq: int, exc: PermanentError) -> None:
        history = await self.attempts.record(task.task_id, seq, self._record(story.attempt, exc))
        await self._file(msg, story, task, seq, history, exc, last=False)

    async def _file(self, msg: Msg, story: Transitions, task: ScrapeTask, seq: int,
                    history: tuple[AttemptRecord, ...], exc: BusscrapeError, *, last: bool) -> None:
        attempt = story.attempt
        error = str(exc) if not last else f"gave up after {len(history)} attempts; last: {exc}"
        letter = DeadLetter(task_id=task.task_id, stage="worker", reason=exc.reason, error=error[:4000],
                            url=task.url, host=filing.host_of(task.url), attempts=history, task=task,
                            source=filing.source_of(msg))
        try:
            await filing.file(self.bus.js, letter, msg_id=names.task_letter_id(task.task_id, seq),
                                   telemetry=self.telemetry)
        except TRANSIENT as err:
            # Not filed, so not removed: try again later.
            log.warning("deadletter.unavailable", error=repr(err))
            await msg.nak(delay=self.retry_delay(1, None))
            return
        if attempt > 1:  # this attempt's own objects too, should its clean-up have failed
            await self._sweep(task, seq, range(1, attempt + 1))
        # Recorded before the ack, and the task kept until it is: `busscrape run` waits for this
        # record. A redelivery files the same letter again (deduplicated) and records again; the
        # last delivery's goes to the reaper, which does the same.
        if not await story.outcome("dead", attempt=len(history), reason=exc.reason, error=error[:500]):
            await msg.nak(delay=self.retry_delay(1, None))
            return
        await msg.ack_sync(timeout=self.settings.nats.request_timeout)
        await self.attempts.clear(task.task_id, seq)
        self.count("dead")

    async def _poison(self, msg: Msg, exc: MessageDecodeError) -> None:
        letter = filing.poison("worker", msg, exc)
        seq = msg.metadata.sequence.stream
        try:
            await filing.file(self.bus.js, letter, msg_id=names.poison_letter_id(self.stream, seq),
                                   telemetry=self.telemetry)
        except TRANSIENT:
            await msg.nak(delay=self.retry_delay(1, None))
            return
        await msg.ack_sync(timeout=self.settings.nats.request_timeout)
        self.count("poison")

    def retry_delay(self, attempt: int, retry_after: float | None) -> float:
        """The worker's backoff: ``retry_base_delay`` doubling up to ``retry_max_delay``, at least
        what Retry-After asked (capped the same)."""
        w = self.settings.worker
        return backoff(attempt, w.retry_base_delay, w.retry_max_delay, at_least=retry_after)
