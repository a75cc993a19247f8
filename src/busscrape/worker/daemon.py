"""``busscrape worker``: renders tasks from TASKS and publishes results to RESULTS.

Per task: decode (poison -> DEADLETTER); on a redelivery, first whether an earlier delivery
already finished it (``status.standing``: its result stored, or its outcome recorded); policy
check, per-host politeness, render in an isolated tab (a reused page wiped between tasks, or a
fresh context: ``worker.isolation``), artifacts into the ARTIFACTS object store, the result
(claim checks only) to RESULTS (``results``), wait for the PubAck, and only then ``ack_sync()``
the task. So a worker killed at any point leaves either no result (the task is redelivered) or
exactly one (the redelivery finds it and acks).

Failures follow the error tree (``failures``): retryable ones are recorded in ATTEMPTS and
nak'ed with backoff; on the last allowed attempt, and for permanent errors at once, the task
goes to DEADLETTER with its whole attempt history. An attempt is a delivery that reached the
page (``attempts``: marked before navigating). A full RESULTS is neither: the worker stops
fetching and holds what it rendered until there is room (``backpressure``); nor is anything on
the bus unavailable (an outage: no attempt spent, the worker stops fetching until it answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from contextlib import AsyncExitStack
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import structlog
from nats.aio.msg import Msg

from busscrape.artifacts import leftovers
from busscrape.artifacts.store import ArtifactStore, object_name
from busscrape.bus import names
from busscrape.bus.connection import Bus
from busscrape.bus.consumer import PullService
from busscrape.bus.retry import TRANSIENT, patiently, transient_or
from busscrape.errors import (
    InvalidTask,
    MessageDecodeError,
    NavigationTimeout,
    PermanentError,
    RetryableError,
    StorageUnavailable,
    said,
)
from busscrape.extract import records
from busscrape.extract.pool import ExtractionPool
from busscrape.extract.registry import Registry
from busscrape.model.messages import ArtifactRef, Extraction, ScrapeResult, ScrapeTask, decode, utcnow
from busscrape.model.steps import Evaluate
from busscrape.net.proxies import Proxies
from busscrape.settings import Settings
from busscrape.status.records import StatusBoard, Transitions
from busscrape.status.standing import objects_of, standing_results
from busscrape.telemetry import tracing
from busscrape.telemetry.metrics import Telemetry
from busscrape.worker import deadline
from busscrape.worker.attempts import AttemptLog, Ledger, Tally
from busscrape.worker.backpressure import ResultsRoom
from busscrape.worker.browser.pool import BrowserPool
from busscrape.worker.capture import Rendered
from busscrape.worker.failures import Failures
from busscrape.worker.fleet_gate import FleetGate, Slot, Unlimited
from busscrape.worker.host_rules import HostRules, Limit
from busscrape.worker.leases import Deferred, Wait
from busscrape.worker.reaper import Reaper
from busscrape.worker.render import Renderer
from busscrape.worker.results import ResultPublisher
from busscrape.worker.sessions import Sessions
from busscrape.worker.sessions import read_rules as read_sessions
from busscrape.worker.startup import BrowserStart

if TYPE_CHECKING:
    from busscrape.crawl.frontier import Frontier

log = structlog.get_logger("busscrape.worker")


class Worker(PullService):
    kind = "worker"
    stream = names.TASKS_STREAM
    durable = names.WORKERS_CONSUMER

    def __init__(self, bus: Bus, settings: Settings, telemetry: Telemetry | None = None,
                 browser: BrowserStart | None = None) -> None:
        w = settings.worker
        super().__init__(bus, concurrency=w.concurrency, max_items=w.max_tasks, exit_when_idle=w.exit_when_idle,
                         grace_period=w.grace_period, telemetry=telemetry)
        self.settings = settings
        # The browser side, perhaps already coming up (started before NATS was connected).
        self.browser = browser or BrowserStart(settings)
        self.policy = self.browser.policy
        self.attempts = AttemptLog(bus.js)
        # Loaded here, before anything connects: an invalid politeness file stops the worker at start.
        self.gate = FleetGate(bus.js, HostRules.load(Limit(w.host_concurrency, w.host_delay, w.host_jitter),
                                                      w.host_rules),
                              holder=w.name, busy_retry=w.host_busy_retry, ttl=settings.streams.host_lease_ttl)
        self.artifacts = ArtifactStore(bus.js, timeout=settings.nats.request_timeout)
        self.board = StatusBoard(bus.js)
        self.room = ResultsRoom(bus.js)
        self.results = ResultPublisher(bus, self.artifacts, self.room, self.counters,
                                       timeout=settings.nats.request_timeout,
                                       max_msg_size=settings.streams.max_msg_size)
        self.failures = Failures(bus, settings, self.attempts, self.results, self.room, self.count, telemetry)
        self._stack = AsyncExitStack()
        # Read here: a bad proxy pool or route stops the worker at start.
        self.proxies = Proxies(settings.proxy)
        self.browser.egresses.on_upstream = self.proxies.report  # proxy health, from the listeners
        self.sessions = (Sessions(bus.js, read_sessions(w.sessions_file), holder=w.name, login_wait=w.host_busy_retry)
                         if w.sessions_file is not None else None)
        self.pool: BrowserPool | None = None
        self.renderer: Renderer | None = None
        # Loaded here, before anything connects: an invalid extractor file stops the worker at start.
        self.extractors = Registry.with_bundled(settings.extract.dir)
        self.extraction: ExtractionPool | None = None

    @functools.cached_property
    def frontier(self) -> Frontier:
        """Made for the first crawl task: a worker that renders no crawl does not import the crawl's
        modules (tldextract, requests, robots.txt parsing: a tenth of a second and more of its start)."""
        from busscrape.crawl.frontier import Frontier

        return Frontier(self.bus.js, self.settings, self.policy, self.telemetry)

    # -- lifecycle --------------------------------------------------------------------------

    async def setup(self) -> None:
        egresses, pool = await self._stack.enter_async_context(self.browser)
        self.pool = pool
        w = self.settings.worker
        await self._stack.enter_async_context(self.results)
        if self.extractors:
            x = self.settings.extract
            self.extraction = await self._stack.enter_async_context(
                ExtractionPool(self.extractors, processes=x.processes, timeout=x.timeout, max_memory=x.max_memory))
        log.info("worker.extractors", folder=str(self.settings.extract.dir), names=sorted(self.extractors))
        self.renderer = Renderer(self.pool, self.policy, egresses, w, self.proxies, self.sessions)
        if self.telemetry is not None:
            pool, room = self.pool, self.room
            self.telemetry.gauge("browser_restarts", lambda: [(pool.restarts, {})])
            self.telemetry.gauge("results_full", lambda: [(1 if room.full else 0, {})])
            gate = self.gate
            self.telemetry.gauge("host_cooling", lambda: [(round(c.until - time.time(), 1), {"host": c.host})
                                                          for c in gate.cooling_now()])

    def counted(self, outcome: str) -> None:
        if self.telemetry is not None:
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
                       telemetry=self.telemetry, frontier=lambda: self.frontier)]

    async def background(self) -> list[asyncio.Task[Any]]:
        info = await patiently(lambda: self.bus.js.consumer_info(self.stream, self.durable), what="TASKS/workers")
        # The consumer's max_deliver leaves room for deferrals on top of the attempts (an older
        # consumer, provisioned without that room, counts attempts alone).
        deliveries, room = info.config.max_deliver or -1, self.settings.streams.worker_max_deferrals
        self.failures.max_deliver = deliveries - room if deliveries > room else deliveries
        tasks = [asyncio.create_task(self.room.run(self._stopping), name="results-room"),
                 asyncio.create_task(self.gate.watch_cooling(), name="cooling-watch")]
        if (interval := self.settings.worker.stray_chunk_interval) > 0:
            strays = leftovers.StrayChunks(self.artifacts)
            tasks.append(asyncio.create_task(strays.run(self._stopping, interval), name="stray-chunks"))
        return tasks

    def paused(self) -> bool:
        """No new task while RESULTS is full (it could not take the result), nor while the bus
        is unavailable (the task could not reach its page): back-pressure."""
        return self.room.closed

    async def before_fetch(self) -> None:
        await self.room.wait()

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
            await self.failures.poison(msg, exc)
            return
        seq, delivered = msg.metadata.sequence.stream, msg.metadata.num_delivered
        tally = Tally(task.task_id, seq, delivered, Ledger() if delivered == 1 else None)
        if tally.ledger is None:
            try:
                tally.ledger = await self.attempts.ledger(task.task_id, seq)
            except StorageUnavailable as exc:  # without its count, the task must not reach the page
                self.handed_on(await self.failures.outage(msg, None, task, tally, exc))
                return
        ledger, attempt = tally.ledger, tally.attempt
        with structlog.contextvars.bound_contextvars(task_id=task.task_id, url=task.url, attempt=attempt,
                                                     trace_id=tracing.trace_id_of(headers)), \
                tracing.consuming("render task", headers, self.stream, **{
                    "busscrape.task_id": task.task_id, "url.full": task.url,
                    "messaging.message.delivery_count": attempt}) as span:
            story = Transitions(self.board, task_id=task.task_id, url=task.url, dispatched_at=task.dispatched_at,
                                attempt=attempt, worker=self.settings.worker.name, resumed=delivered > attempt)
            if (attempt > 1 or ledger.outages) and await self._done_before(msg, task, story):
                return
            if 0 < self.failures.max_deliver < attempt:
                await self.failures.exhausted(msg, story, task, tally)
                return
            if ledger.outage_seconds() > self.settings.worker.outage_budget:
                await self.failures.outage_exceeded(msg, story, task, tally)
                return
            try:
                slot = await self._enter_host(msg, task)
            except StorageUnavailable as exc:
                self.handed_on(await self.failures.outage(msg, story, task, tally, exc))
                return
            if slot is None:
                return
            try:
                await self._work(msg, task, story, span, slot, tally)
            except Deferred as deferred:
                await slot.release()
                if tally.counted and tally.ledger is not None:  # marked, then deferred: no attempt
                    await self.failures.rewrite(tally, tally.ledger.withdraw(tally.delivery))
                await self._defer(msg, deferred.wait)
            finally:
                await slot.release()

    async def _enter_host(self, msg: Msg, task: ScrapeTask) -> Slot | Unlimited | None:
        """The host's slot and start (``fleet_gate``), or None when the task was deferred: nak'ed
        for when the host may take it, spending no attempt (it did not reach the page). The task
        holds no browser or worker slot meanwhile, and this worker goes on with other tasks.
        ``StorageUnavailable`` when HOSTS (or CRAWLS) did not answer: an outage."""
        if not self.settings.worker.fleet_politeness:
            return Unlimited()
        host = urlsplit(task.url).hostname or ""
        try:
            await self._obey_crawl_delay(task, host)
            entered = await self.gate.enter(host)
        except StorageUnavailable:
            raise
        except TRANSIENT as exc:
            log.warning("host.gate_unavailable", error=repr(exc))
            raise StorageUnavailable(f"cannot take a slot on {host} in {names.HOSTS_BUCKET}: {exc!r}",
                                     what=names.HOSTS_BUCKET) from None
        except RetryableError as exc:  # robots.txt unreachable: the host's, not the page's, so a deferral
            log.warning("host.robots_unavailable", error=repr(exc))
            entered = Wait(self.failures.retry_delay(1), "robots_unavailable")
        if isinstance(entered, Slot):
            return entered
        await self._defer(msg, entered)
        return None

    async def _obey_crawl_delay(self, task: ScrapeTask, host: str) -> None:
        """robots.txt's ``Crawl-delay`` raises the host's delay (never lowers it) before the gate
        is entered, where the slot reads its limit; every worker reads the same cached robots.txt."""
        if task.crawl is not None and (delay := await self.frontier.crawl_delay(task)):
            self.gate.rules.raise_delay(host, delay)

    async def _defer(self, msg: Msg, wait: Wait) -> None:
        self.count("deferred")
        self.handed_on(wait.seconds)  # not a task taken; not idle before it is due back
        log.debug("task.deferred", why=wait.why, seconds=round(wait.seconds, 3))
        await msg.nak(delay=wait.seconds)

    async def _done_before(self, msg: Msg, task: ScrapeTask, story: Transitions) -> bool:
        """A redelivery of a task an earlier delivery finished (it died before its ack, or its
        PubAck was lost): its outcome is recorded, or its result stands in RESULTS. Then this
        delivery only cleans up and acks, and renders nothing (a second result would be a
        duplicate for the archive)."""
        seq = msg.metadata.sequence.stream
        await story.start()
        standing = None if story.settled else await standing_results(self.bus.js, task.task_id, seq)
        if not story.settled and not standing:
            return False
        if standing:
            await self.results.sweep(task, seq, range(1, story.attempt), keep=objects_of(standing))
        # The links kept before the result, if they were not followed.
        if task.crawl is not None and not await self._follow_or_later(msg, task, story.attempt):
            return True
        await msg.ack_sync(timeout=self.settings.nats.request_timeout)
        await self.attempts.clear(task.task_id, seq)
        self.count("already_done")
        log.info("task.already_done", settled=story.settled, standing=len(standing or ()))
        return True

    async def _work(self, msg: Msg, task: ScrapeTask, story: Transitions, span: Any, slot: Slot | Unlimited,
                    tally: Tally) -> None:
        """Render (holding ``slot`` on the task's host), store, publish, ack; or hand the failure
        to its path (an outage, a retry or a dead letter)."""
        seq, attempt = tally.seq, story.attempt
        started = time.perf_counter()
        # Stored while the page renders, not before: one round trip less per task (a redelivery
        # has stored it already). Awaited before any later record of the task (and before the
        # result), so STATUS keeps its order.
        running = asyncio.ensure_future(story.start() if attempt == 1 else asyncio.sleep(0))
        try:
            self._validate(task)
            scraped_at = utcnow()
            async with slot:
                try:
                    rendered = await self._render(task, slot, tally)
                except RetryableError as exc:
                    await self._cool(task, exc)  # before the slot goes: no one else starts there first
                    raise
            extraction = await self._extract(task, rendered)
            # Kept beside the uploads (before the result, which a redelivery finds them by).
            keeping = asyncio.ensure_future(self._keep_links(task, rendered)) if task.crawl is not None else None
            result = await self._result(task, seq, attempt, rendered, scraped_at, extraction, beside=keeping)
            await running
            # Sent beside the result, so it costs no round trip, and on top of `running`: should
            # the ingester record `archived` first, this is left out rather than stored after it.
            recorded = asyncio.ensure_future(story.step("rendered", status=result.status))
            try:
                stands = await self.results.publish(task, result)
            finally:
                await recorded
            if stands and self.renderer is not None:  # its WARC will be archived: later pages may refer to it
                self.renderer.payloads.add(rendered.warc_payloads)
            # After the result stands: a page's links never outrun the page itself.
            acked = task.crawl is None or await self._follow_or_later(msg, task, attempt, rendered)
            if acked:
                await msg.ack_sync(timeout=self.settings.nats.request_timeout)
        except Deferred:
            span.set_attribute("busscrape.outcome", "deferred")
            await running
            raise
        except transient_or(StorageUnavailable) as exc:  # the page's deeds are not in question
            span.set_attribute("busscrape.outcome", "outage")
            with contextlib.suppress(*TRANSIENT):
                await running
            self.handed_on(await self.failures.outage(msg, story, task, tally, exc))
            return
        except RetryableError as exc:
            span.set_attribute("busscrape.outcome", f"retry:{exc.reason}")
            await running
            await self.failures.retry(msg, story, task, tally, exc)
            return
        except PermanentError as exc:
            span.set_attribute("busscrape.outcome", f"dead:{exc.reason}")
            await running
            await self.failures.dead(msg, story, task, tally, exc)
            return
        except asyncio.CancelledError:
            if self.stopping:  # the service hands the message back (PullService._process): say why
                span.set_attribute("busscrape.outcome", "retry:shutting_down")
                await self.failures.handed_back(running, story, task, tally)
            raise
        self.count("completed" if stands else "already_done")
        span.set_attribute("http.response.status_code", result.status or 0)
        if self.telemetry is not None:
            self.telemetry.render_duration.record(time.perf_counter() - started)
        log.info("task.done", status=result.status, ms=result.timings.get("total"))
        if acked:  # else its links come back: the next delivery must count this one (``_done_before``)
            await self.attempts.clear(task.task_id, seq, history=tally.delivery > 1)

    async def _cool(self, task: ScrapeTask, exc: RetryableError) -> None:
        """A 429 or 503 cools its host for the whole fleet: for Retry-After, else ``cool_default``."""
        if exc.reason not in ("http_429", "http_503"):
            return
        seconds = exc.retry_after if exc.retry_after is not None else self.settings.worker.cool_default
        seconds = min(seconds, self.settings.worker.retry_max_delay)
        with contextlib.suppress(*TRANSIENT):
            await self.gate.cool(urlsplit(task.url).hostname or "", seconds,
                                 status=int(exc.reason[5:]), worker=self.settings.worker.name)

    def _validate(self, task: ScrapeTask) -> None:
        if len(task.steps) > self.settings.worker.max_steps:
            raise InvalidTask(f"{len(task.steps)} steps, over max_steps {self.settings.worker.max_steps}",
                              reason="too_many_steps")
        if not self.settings.worker.allow_evaluate and any(isinstance(s, Evaluate) for s in task.steps):
            raise InvalidTask("the evaluate step is disabled on this worker (BUSSCRAPE_WORKER__ALLOW_EVALUATE)",
                              reason="evaluate_disabled")
        if task.options.extractor is not None and task.options.extractor not in self.extractors:
            raise InvalidTask(f"this worker has no extractor {task.options.extractor!r} in "
                              f"{self.extractors.where()} (it has: {', '.join(sorted(self.extractors)) or 'none'})",
                              reason="unknown_extractor")

    async def _extract(self, task: ScrapeTask, rendered: Rendered) -> Extraction | None:
        """The task's extractor on the rendered DOM, in the extraction processes (``extract.pool``)."""
        name = task.options.extractor
        if name is None:
            return None
        assert self.extraction is not None and rendered.html is not None
        extractor = self.extractors[name]
        with tracing.span("extract", **{"busscrape.extractor": name}):
            outcome = await self.extraction.extract(name, rendered.html, rendered.final_url, rendered.status,
                                                    rendered.response_headers)
        rendered.html = None  # not kept while the result is uploaded and published
        return records.extraction(extractor, outcome, max_bytes=self.settings.extract.max_record_bytes)

    async def _keep_links(self, task: ScrapeTask, rendered: Rendered) -> None:
        try:
            await self.frontier.keep(task, rendered.final_url, rendered.links)
        except TRANSIENT as exc:
            raise StorageUnavailable(f"{names.CRAWLS_BUCKET}: {said(exc)}",
                                     what=names.CRAWLS_BUCKET) from None

    async def _follow_or_later(self, msg: Msg, task: ScrapeTask, attempt: int,
                               rendered: Rendered | None = None) -> bool:
        """Follow a page's links once its result stands; True when the task may be acked.
        Failing here is the links' failure, never the page's (which is archived, or will be):
        the task is nak'ed for its links alone (the redelivery finds the result and only
        follows, ``_done_before``), and its last delivery records ``follow_failed`` in the crawl
        (``Frontier.give_up``) and acks; no dead letter. A permanent failure (a record over a
        bound, a rule that cannot be read) is recorded at once: another delivery cannot help."""
        try:
            await self._follow(task, rendered)
            return True
        except (RetryableError, PermanentError) as exc:
            if isinstance(exc, RetryableError) and not 0 < self.failures.max_deliver <= attempt:
                await self.retry_later(msg, exc, "task.links_later", reason=exc.reason)
                return False
            try:
                await self.frontier.give_up(task, exc)
            except transient_or(RetryableError) as err:
                await self.retry_later(msg, err, "task.links_unrecorded", reason=exc.reason)
                return False
            except PermanentError as err:  # not even the failure can be recorded: the page stands
                log.error("crawl.follow_unrecorded", reason=exc.reason, error=str(err)[:500])
            return True

    async def _follow(self, task: ScrapeTask, rendered: Rendered | None = None) -> None:
        """The crawl's next tasks from this page's links (``crawl.frontier``)."""
        try:
            if rendered is None:
                await self.frontier.follow(task)
            else:
                await self.frontier.follow(task, rendered.final_url, rendered.links)
        except TRANSIENT as exc:
            raise StorageUnavailable(f"following links: {said(exc)}",
                                     what=names.CRAWLS_BUCKET) from None

    async def _render(self, task: ScrapeTask, slot: Slot | Unlimited, tally: Tally) -> Rendered:
        """The page rendered and captured within ``task_timeout``, which starts once the host's
        politeness let the task in (``_enter_host``): waiting for a busy host is not rendering.
        Before it navigates, the delivery marks its attempt (``attempts``): should that not be
        stored, it does not navigate (an outage)."""
        assert self.renderer is not None

        async def before_navigation() -> None:
            # The mark first: the host's start is then followed by the navigation at once (a
            # deferral takes the mark back, ``handle``).
            await self.attempts.reach(tally)
            await slot.start_or_defer()

        follow = None
        if task.crawl is not None:
            try:
                follow = (await self.frontier.state.spec(task.crawl.crawl_id)).follow
            except TRANSIENT as exc:
                raise StorageUnavailable(f"{names.CRAWLS_BUCKET}: {said(exc)}",
                                     what=names.CRAWLS_BUCKET) from None
        try:
            # The slot's lease lost (expired while NATS was away, taken by another worker): the
            # render stops, and the task comes back later (LeaseLost is a deferral). Its clean-up
            # is bounded too (``deadline``): the slot goes however the render ends.
            rendering = self.renderer.render(task, before_navigation, follow=follow, sent=slot.sent)
            return await deadline.within(slot.guard(rendering),
                                         self.settings.worker.task_timeout, grace=deadline.CLEANUP_GRACE, what="render")
        except TimeoutError:
            raise NavigationTimeout(f"task took longer than task_timeout "
                                    f"{self.settings.worker.task_timeout:.0f}s", reason="task_timeout") from None

    async def _result(self, task: ScrapeTask, seq: int, attempt: int, rendered: Rendered,
                      scraped_at: datetime, extraction: Extraction | None = None, *,
                      beside: asyncio.Future[None] | None = None) -> ScrapeResult:
        """The captures stored in ARTIFACTS, and the result that points at them; ``beside``
        (a crawl page's links being kept) done too before the result is made."""
        with tracing.span("upload artifacts", count=len(rendered.captures)):
            # All at once: a task's latency pays one object-store round trip, not one per artifact.
            stored = await asyncio.gather(*(
                self.artifacts.put(object_name(task.task_id, seq, attempt, c.file), c.data, c.content_type,
                                   kind=c.kind, file=c.file) for c in rendered.captures), return_exceptions=True)
        refs = [r for r in stored if isinstance(r, ArtifactRef)]
        failed = [r for r in stored if isinstance(r, BaseException)]
        if beside is not None:
            waited = time.perf_counter()
            kept = (await asyncio.gather(beside, return_exceptions=True))[0]
            # Only what keeping the links took beyond the uploads is their cost (bench/crawl.py).
            rendered.timings["links_kept"] = round((time.perf_counter() - waited) * 1000, 2)
            if isinstance(kept, BaseException):
                failed.append(kept)
        if failed:
            await self.results.drop(refs)
            if isinstance(failed[0], StorageUnavailable | PermanentError):  # too large is never a retry
                raise failed[0]
            raise StorageUnavailable(repr(failed[0]))
        return ScrapeResult(
            task_id=task.task_id, task_seq=seq, url=task.url, original_url=task.original_url,
            final_url=rendered.final_url, status=rendered.status, redirect_chain=rendered.redirect_chain,
            response_headers=rendered.response_headers, title=rendered.title, timings=rendered.timings,
            artifacts=tuple(refs), labels=task.labels, worker=self.settings.worker.name, attempt=attempt,
            scraped_at=scraped_at, blocked_requests=tuple(rendered.blocked_requests),
            dispatched_at=task.dispatched_at, extraction=extraction, crawl=task.crawl,
            proxy=rendered.proxy,
        )
