"""The dispatcher: input lines in, one task per new piece of work into TASKS, every line accounted for.

For each line: parse (``inputs``), normalise the URL (``urls``), compute the task id
(``messages.task_key``), then three layers of de-duplication:

1. within the input: a compact set of 64-bit task-id prefixes (``FingerprintSet``);
2. across runs: the task is *created* as key ``<task_id>`` in SEEN with
   ``Nats-Expected-Last-Subject-Sequence: 0`` (first writer wins) and ``Nats-TTL`` = the recrawl
   window. TASKS sources SEEN, so creating the key IS the enqueue: "marked seen" and "queued"
   cannot come apart, and a re-run after a crash finds everything it published already there;
3. per publish: a retried create lands once because it is a create. "Wrong last sequence" on a
   first attempt means already seen; on a retry it may be our own lost first attempt, so the
   stored value is read back and compared with ours (equal: published by this run).

``--force`` drops the expected-sequence header: a plain put replaces the key and queues the task
again. Only there does a publish carry ``Nats-Msg-Id: <task_id>-<run_id>``
(``names.dispatch_msg_id``), so that a retried put lands (and is queued) once. A create carries
none: the id would buy nothing the create does not already settle, and each one cost SEEN and
TASKS a de-duplication entry for their duplicate windows (~224 B of server RAM per task
dispatched, issue #19). TASKS needs no id to source each SEEN message once: nats-server tracks
the last SEEN sequence it sourced (and keeps it across restarts and an emptied TASKS).
Nothing counts as published before its PubAck.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import nats.errors
import nats.js.errors
import structlog

from busscrape.bus import names, provision, topology
from busscrape.bus.compat import encode_headers
from busscrape.bus.connection import Bus
from busscrape.bus.publisher import ABANDONED, WRONG_LAST_SEQUENCE, Publication, Publisher, PublishFailed
from busscrape.bus.retry import TRANSIENT, patiently
from busscrape.dispatch.fingerprints import FingerprintSet
from busscrape.dispatch.inputs import (
    InputFormat,
    InputReader,
    Rejection,
    Source,
    TaskDefaults,
    TaskSpec,
    open_reader,
    preview,
)
from busscrape.dispatch.template import TaskTemplate
from busscrape.dispatch.urls import UrlNormaliser, UrlRules
from busscrape.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PARTIAL,
    ConfigurationError,
    InputError,
    StreamConflict,
    StreamsMissing,
    said,
)
from busscrape.model.messages import ScrapeTask, encode, task_key
from busscrape.settings import Settings
from busscrape.telemetry import tracing
from busscrape.units import format_duration

log = structlog.get_logger("busscrape.dispatcher")

MIN_TTL = 1.0  # Nats-TTL counts whole seconds


@dataclass(slots=True)
class Counts:
    """Live counters (the progress bar reads them while ``dispatch`` runs)."""

    read: int = 0
    duplicate_in_input: int = 0
    already_seen: int = 0
    published: int = 0
    failed: int = 0
    unconfirmed: int = 0
    invalid: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class DispatchSummary:
    """What one dispatch did with every line it read.

    ``read == invalid + duplicate_in_input + already_seen + published + failed + unconfirmed``;
    ``unconfirmed`` are publishes whose PubAck never came because the run was interrupted (a
    re-run settles them: each is either in TASKS already or will be published then).
    """

    read: int
    invalid: int
    invalid_by_reason: dict[str, int]
    duplicate_in_input: int
    already_seen: int
    published: int
    failed: int
    unconfirmed: int
    interrupted: bool
    seconds: float

    def exit_code(self, strict: bool = False) -> int:
        """0 all good; 1 failed or unconfirmed publishes, or rejected lines under ``strict``; 130 interrupted."""
        if self.interrupted:
            return EXIT_INTERRUPTED
        if self.failed or self.unconfirmed or (strict and self.invalid):
            return EXIT_PARTIAL
        return EXIT_OK

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Dispatcher:
    """``async with Dispatcher(bus, settings, defaults) as d: summary = await d.dispatch("urls.txt")``.

    ``on_published(task_id)`` runs for every task whose PubAck arrived (how ``busscrape run``
    learns what to wait for); ``on_already_seen(task_id)`` for every task SEEN already held (what
    a resumed run still waits for); ``on_rejected(rejection)`` for every rejected line, after it is
    logged. ``stop()`` once: stop reading, wait ``settings.dispatch.drain_timeout`` for PubAcks in
    flight; twice: stop waiting.
    """

    def __init__(
        self,
        bus: Bus,
        settings: Settings,
        defaults: TaskDefaults | None = None,
        *,
        force: bool = False,
        on_published: Callable[[str], None] | None = None,
        on_rejected: Callable[[Rejection], None] | None = None,
        on_already_seen: Callable[[str], None] | None = None,
        on_crawl: Callable[[str], None] | None = None,
    ) -> None:
        self.bus = bus
        self.settings = settings
        self.defaults = defaults or TaskDefaults()
        self.force = force
        self.on_published = on_published
        self.on_rejected = on_rejected
        self.on_already_seen = on_already_seen
        self.on_crawl = on_crawl
        """Called with the id of every crawl a line's ``crawl`` block started (or resumed)."""
        self.drain_timeout = settings.dispatch.drain_timeout
        self.run_id = secrets.token_hex(6)
        self.recrawl_after = settings.dispatch.recrawl_after
        self.counts = Counts()
        self.reader: InputReader | None = None
        self._normalise = UrlNormaliser(UrlRules.from_settings(settings.dispatch))
        self._template = TaskTemplate(self.defaults)
        self._seen_here = FingerprintSet()
        self._traced = tracing.recording()
        self._header_block = self._header_template()
        self._publisher: Publisher | None = None
        self._resolving: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self._abort = asyncio.Event()
        self._entered = self._started = False

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> Dispatcher:
        if self._entered:
            raise RuntimeError("a Dispatcher can be entered only once")
        self._entered = True
        await self._check_streams()
        cfg = self.settings
        self._publisher = Publisher(self.bus.nc, window=cfg.dispatch.window, timeout=cfg.nats.request_timeout,
                                    retries=cfg.dispatch.publish_retries, close_timeout=0,
                                    outage_wait=cfg.dispatch.publish_outage_wait)
        await self._publisher.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._publisher is not None:
            await self._publisher.close()

    async def _check_streams(self) -> None:
        await provision.require(self.bus.js, topology.load(self.settings), names.DISPATCH_NEEDS)
        seen = (await patiently(lambda: self.bus.js.stream_info(names.SEEN_STREAM))).config
        tasks = (await patiently(lambda: self.bus.js.stream_info(names.TASKS_STREAM))).config
        apply, after = "run `busscrape streams apply` against this server", format_duration(self.recrawl_after)
        if not seen.allow_msg_ttl:
            raise StreamConflict(f"the {names.SEEN_BUCKET} bucket does not allow per-key TTLs (allow_msg_ttl): "
                                 f"`busscrape streams apply --recreate {names.SEEN_BUCKET}`")
        if not any(s.name == names.SEEN_STREAM for s in tasks.sources or ()):
            raise StreamsMissing(f"{names.TASKS_STREAM} does not source {names.SEEN_STREAM}, so nothing "
                                 f"dispatched would reach the workers; {apply}")
        if self.recrawl_after < MIN_TTL:
            raise ConfigurationError(f"--recrawl-after {after} is too short: per-key TTLs count whole seconds "
                                     "(at least 1s)")
        if seen.max_age and self.recrawl_after > seen.max_age:
            raise ConfigurationError(
                f"--recrawl-after {after} is longer than the {names.SEEN_BUCKET} bucket keeps anything "
                f"({format_duration(seen.max_age)}); use a shorter one, or raise "
                f"BUSSCRAPE_STREAMS__RECRAWL_WINDOW and {apply}")

    def stop(self) -> None:
        """First call: stop reading and drain briefly. Second call: stop waiting now."""
        if self._stopping.is_set():
            self._abort.set()
            return
        self._stopping.set()
        log.info("dispatch.stopping", in_flight=self._publisher.in_flight if self._publisher else 0)

    # -- the run ------------------------------------------------------------------------------

    async def dispatch(self, source: Source, fmt: InputFormat = "auto") -> DispatchSummary:
        """Read ``source`` to the end (or until ``stop()``) and publish every new task in it."""
        publisher = self._publisher
        if publisher is None:
            raise RuntimeError("use `async with Dispatcher(...)` before dispatch()")
        if self._started:
            raise RuntimeError("dispatch() runs once per Dispatcher")
        self._started = True
        started = time.monotonic()
        self.reader = reader = open_reader(source, fmt, self.defaults)
        log.info("dispatch.started", run_id=self.run_id, force=self.force, recrawl_after=format_duration(
            self.recrawl_after), input=str(source) if isinstance(source, str | os.PathLike) else "iterable")
        feeding = asyncio.create_task(self._feed(reader), name="dispatch-feed")
        try:
            await _first(feeding, self._stopping.wait(), cancel=False)
            if not self._stopping.is_set():
                # All read: every publication ends by itself (PubAck, error, or timeout × retries).
                await _first(publisher.wait(), self._stopping.wait())
            if self._stopping.is_set():
                # Interrupted: what is in flight gets drain_timeout (a second stop() cuts it short).
                await _first(publisher.wait(), self._abort.wait(), limit=self.drain_timeout)
            await publisher.close()  # still unacknowledged: unconfirmed; a feeder waiting for a slot returns
            await feeding
        finally:
            feeding.cancel()
            reader.close()
        if self._resolving:
            await asyncio.wait(set(self._resolving), timeout=self.drain_timeout if self._stopping.is_set() else None)
        summary = self.summary(time.monotonic() - started)
        log.info("dispatch.done", run_id=self.run_id, **summary.as_dict())
        return summary

    async def _feed(self, reader: InputReader) -> None:
        """Take every item of every batch until the input ends or ``stop()``."""
        batches = aiter(reader)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            while True:
                # Race the next batch against stop(): an idle stdin must not hold up an interrupt.
                nxt = asyncio.ensure_future(anext(batches, None))
                await asyncio.wait({nxt, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not nxt.done():
                    nxt.cancel()
                    return
                batch = nxt.result()
                if batch is None:
                    return
                for item in batch:
                    if self._stopping.is_set() or not await self._take(item):
                        return
        finally:
            stopping.cancel()

    async def _take(self, item: TaskSpec | Rejection) -> bool:
        """Reject, skip or publish one item; False when the publisher closed before it was sent."""
        counts = self.counts
        if isinstance(item, Rejection):
            counts.read += 1
            self._reject(item)
            return True
        try:
            url = self._normalise(item.url)
        except InputError as exc:
            counts.read += 1
            self._reject(Rejection(item.line, exc.reason, exc.message, preview(item.url)))
            return True
        if item.crawl is not None:
            await self._crawl(item, url)
            return True
        template = self._template
        fits = template.fits(item)
        task_id = template.key(url) if fits else task_key(url, item.steps, item.options)
        if not self._seen_here.add(int(task_id[:16], 16)):
            counts.read += 1
            counts.duplicate_in_input += 1
            return True
        if fits:
            payload = template.payload(task_id, url, item.url)
        else:
            payload = encode(ScrapeTask(task_id=task_id, url=url, original_url=item.url, steps=item.steps,
                                        options=item.options, labels=item.labels))
        traceparent = tracing.task_traceparent(task_id, url, record=self._traced)
        headers = self._header_block.format(task_id=task_id, traceparent=traceparent).encode()
        assert self._publisher is not None
        try:
            await self._publisher.submit(names.seen_key_subject(task_id), payload, headers, self._settled, task_id)
        except PublishFailed:
            return False  # closed while waiting for a slot: never sent, so never counted
        counts.read += 1
        return True

    async def _crawl(self, item: TaskSpec, url: str) -> None:
        """A line with a ``crawl`` block: its URL seeds a crawl (``crawl.frontier``) through the
        same SEEN create as every task; its other pages are found by the workers."""
        from busscrape.crawl.frontier import Frontier
        from busscrape.crawl.progress import SEED_SKIPS
        from busscrape.crawl.spec import CrawlSpec, crawl_task_id
        from busscrape.crawl.state import SEEDS
        from busscrape.errors import BusscrapeError
        from busscrape.net.policy import NetworkPolicy

        self.counts.read += 1
        spec = CrawlSpec.model_validate({**(item.crawl or {}), "seeds": (url,), "steps": item.steps,
                                         "options": item.options, "labels": item.labels})
        frontier = Frontier(self.bus.js, self.settings, NetworkPolicy.from_settings(self.settings.network.allow))
        seed = crawl_task_id(spec.crawl_id, url, spec.steps, spec.options)
        try:
            before = await frontier.state.page(spec.crawl_id, SEEDS)
            record = await frontier.seed(spec)
        except BusscrapeError as exc:
            self._reject(Rejection(item.line, exc.reason, f"crawl: {exc}", preview(item.url)))
            return
        log.info("dispatch.crawl", crawl_id=spec.crawl_id, line=item.line)
        if seed in record.get("queued", ()):
            queued_before = before is not None and seed in before.get("queued", ())
            self._seen_before(seed) if queued_before else self._published(seed)
        else:  # refused by robots.txt or the network policy: nothing to wait for
            why = next((s["reason"] for s in record.get("skipped") or () if s.get("url") == url), "skipped")
            self._reject(Rejection(item.line, "crawl_seed_skipped", f"crawl {spec.crawl_id}: the seed was not "
                                   f"queued: {why} ({SEED_SKIPS.get(why, 'skipped')})", preview(item.url)))
        if self.on_crawl is not None:
            self.on_crawl(spec.crawl_id)

    def _header_template(self) -> str:
        """Every task's NATS header block, built once with ``{task_id}`` and ``{traceparent}``
        left to fill in: encoding a headers dict per task cost more than the rest of the send
        (see ``publisher``)."""
        headers = {names.MSG_TTL: str(int(self.recrawl_after))}
        if self.force:
            headers[names.MSG_ID] = names.dispatch_msg_id("{task_id}", self.run_id)  # see the module docstring
        else:
            headers[names.EXPECTED_LAST_SUBJECT_SEQUENCE] = "0"  # create only: first writer wins
        headers[names.TRACEPARENT] = "{traceparent}"
        return encode_headers(headers)

    def _reject(self, rejection: Rejection) -> None:
        self.counts.invalid[rejection.reason] += 1
        log.warning("dispatch.rejected", line=rejection.line, reason=rejection.reason, detail=rejection.detail,
                    text=rejection.text)
        if self.on_rejected is not None:
            self.on_rejected(rejection)

    def _settled(self, pub: Publication) -> None:
        """A publish is settled: PubAck, already seen, or failed for good."""
        if pub.ack is not None:
            self._published(pub.context)
            return
        error = pub.error
        assert error is not None
        if error.err_code == WRONG_LAST_SEQUENCE and not self.force:
            if pub.attempts == 1:
                self._seen_before(pub.context)
            else:
                task = asyncio.create_task(self._resolve(pub))
                self._resolving.add(task)
                task.add_done_callback(self._resolving.discard)
            return
        if error.code == ABANDONED:  # we stopped waiting; the server may well have it
            self.counts.unconfirmed += 1
            return
        self.counts.failed += 1
        log.error("dispatch.publish_failed", task_id=pub.context, code=error.code, err_code=error.err_code,
                  error=error.description, attempts=pub.attempts)

    def _seen_before(self, task_id: str) -> None:
        self.counts.already_seen += 1
        if self.on_already_seen is not None:
            self.on_already_seen(task_id)

    def _published(self, task_id: str) -> None:
        self.counts.published += 1
        if self.on_published is not None:
            self.on_published(task_id)

    async def _resolve(self, pub: Publication) -> None:
        """A retried create found the key taken: by our own earlier attempt, or by someone else?"""
        # The read-back may meet an outage too (a timeout, an election): waited out like the
        # publish itself, within publish_outage_wait of the first send, before "unconfirmed".
        within = self.settings.dispatch.publish_outage_wait - (time.monotonic() - pub.first_sent)
        try:
            stored = await patiently(lambda: self.bus.js.get_last_msg(names.SEEN_STREAM, pub.subject),
                                     within=max(within, 0.0), what="dispatch.resolve")
        except nats.js.errors.NotFoundError:
            self._seen_before(pub.context)  # taken, then expired: not ours to claim
            return
        except TRANSIENT as exc:
            log.warning("dispatch.unresolved", task_id=pub.context, error=said(exc))
            self.counts.unconfirmed += 1
            return
        if stored.data == pub.payload:
            self._published(pub.context)
        else:
            self._seen_before(pub.context)

    def summary(self, seconds: float = 0.0) -> DispatchSummary:
        """A snapshot of the counts."""
        c = self.counts
        return DispatchSummary(
            read=c.read, invalid=sum(c.invalid.values()), invalid_by_reason=dict(sorted(c.invalid.items())),
            duplicate_in_input=c.duplicate_in_input, already_seen=c.already_seen, published=c.published,
            failed=c.failed, unconfirmed=c.unconfirmed, interrupted=self._stopping.is_set(), seconds=round(seconds, 3),
        )


async def _first(*awaitables: Any, limit: float | None = None, cancel: bool = True) -> None:
    """Wait until the first of ``awaitables`` finishes (or ``limit`` seconds pass), then cancel the
    rest (except tasks that were passed in, with ``cancel=False``)."""
    futures = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(futures, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for future, given in zip(futures, awaitables, strict=True):
            if cancel or future is not given:
                future.cancel()
