"""The ingester: copies every result from RESULTS, and every dead letter, into the archive.

One result (``Ingester.handle``)::

    decode ── malformed ───────────────────────────────► DEADLETTER (poison), ack
      │
    layout.plan: keys from the result; the folder leased (no two ingesters write one at once)
      │ meta.json there describes it, or a later scrape ───► ack (nothing to write)
      │ meta.json of an earlier scrape ────────────────────► staged beside it, then swapped in
    every artifact, concurrently (bounded by the storage's upload slots):
      ARTIFACTS ─ streamed, sha256 checked ─► [gzip] ─► storage
      │   artifact gone or checksum wrong ──────────► DEADLETTER (with the result), ack
      │   storage or NATS error ────────────────────► nak, delay doubling per delivery; nothing acked
    meta.json, last: its presence means the folder is complete
      │
    'archived' in STATUS ─► the artifacts released from ARTIFACTS ─► ack_sync
      (either failing: nak and redo; a redelivery finds meta.json and only records, releases, acks)

Alongside, each ingester runs an ``Archivist`` on ``DEADLETTER/archivist`` that copies every
dead letter to ``<prefix>/deadletter/dt=…/<task_id>.json``, so the archive alone tells what
became of every task, and trims RESULTS of what every reader has acknowledged (``trim``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import nats.js.errors
import structlog
from nats.aio.msg import Msg

from busscrape.archive.storage import Storage
from busscrape.artifacts.store import ArtifactStore
from busscrape.bus import names
from busscrape.bus.connection import Bus
from busscrape.bus.consumer import PullService, quietly
from busscrape.bus.names import ARCHIVIST_CONSUMER, DEADLETTER_STREAM, INGESTERS_CONSUMER, RESULTS_STREAM
from busscrape.bus.retry import TRANSIENT, patiently, transient_or
from busscrape.deadletters import filing
from busscrape.errors import (
    MessageDecodeError,
    PermanentError,
    RetryableError,
    StorageUnavailable,
    StreamsMissing,
    said,
)
from busscrape.ingest.archiver import Archiver
from busscrape.ingest.leases import FolderLeases
from busscrape.ingest.letters import Archivist
from busscrape.ingest.trim import ResultsTrimmer
from busscrape.model.messages import DeadLetter, ScrapeResult, decode, utcnow
from busscrape.search.feed import SearchFeed
from busscrape.settings import Settings
from busscrape.status.records import StatusBoard, TaskStatus
from busscrape.telemetry import tracing
from busscrape.telemetry.metrics import Telemetry
from busscrape.telemetry.tracing import trace_id_of

log = structlog.get_logger("busscrape.ingester")


class Ingester(PullService):
    """Archives results from ``RESULTS`` (one durable consumer shared by every ingester)."""

    kind = "ingester"
    stream = RESULTS_STREAM
    durable = INGESTERS_CONSUMER

    def __init__(self, bus: Bus, storage: Storage, settings: Settings | None = None,
                 telemetry: Telemetry | None = None) -> None:
        s = settings or bus.settings
        cfg = s.ingester
        super().__init__(bus, concurrency=cfg.concurrency, max_items=cfg.max_results,
                         exit_when_idle=cfg.exit_when_idle, grace_period=cfg.grace_period,
                         backoff=(cfg.retry_base_delay, cfg.retry_max_delay), telemetry=telemetry)
        self.storage = storage
        self.artifacts = ArtifactStore(bus.js)
        self.leases = FolderLeases(bus.js, cfg.name)
        self.archiver = Archiver(storage, self.artifacts, self.leases, prefix=s.archive.prefix,
                                 compress=s.archive.compress, gzip_level=s.archive.gzip_level)
        self.board = StatusBoard(bus.js)
        self.trimmer = ResultsTrimmer(bus.js, keep=s.streams.results_keep_acked)
        self.results_max_age = s.streams.results_max_age
        self.max_msg_size = s.streams.max_msg_size
        self.search = SearchFeed(s, storage, self.counters)  # best effort, off the hot path (search_feed)
        self.archivist = Archivist(bus, storage, prefix=s.archive.prefix,
                                   backoff=(cfg.retry_base_delay, cfg.retry_max_delay),
                                   grace_period=cfg.grace_period, telemetry=telemetry)

    async def setup(self) -> None:
        """Refuse to start without the dead-letter consumer (the results one is checked by ``run``)."""
        try:
            await patiently(lambda: self.bus.js.consumer_info(DEADLETTER_STREAM, ARCHIVIST_CONSUMER),
                            what=f"{DEADLETTER_STREAM}/{ARCHIVIST_CONSUMER}")
        except nats.js.errors.NotFoundError:
            raise StreamsMissing(
                f"the durable consumer {DEADLETTER_STREAM}/{ARCHIVIST_CONSUMER} does not exist. Run "
                "`busscrape streams apply` against the same NATS server first"
            ) from None
        await self.search.start()

    async def teardown(self) -> None:
        await self.search.close()

    def companions(self) -> list[PullService]:
        return [self.archivist]

    async def background(self) -> list[asyncio.Task[Any]]:
        return [asyncio.create_task(self.trimmer.run(self._stopping), name="results-trim")]

    async def handle(self, msg: Msg) -> None:
        trace_id = trace_id_of(msg.headers)
        try:
            result = decode(ScrapeResult, msg.data)
        except MessageDecodeError as exc:
            msg_id = names.poison_letter_id(RESULTS_STREAM, msg.metadata.sequence.stream)
            if await self._give_up(msg, filing.poison("ingester", msg, exc), msg_id, "malformed", trace_id=trace_id):
                await quietly(msg.ack_sync())
            return
        with structlog.contextvars.bound_contextvars(task_id=result.task_id, url=result.url, attempt=result.attempt,
                                                     trace_id=trace_id), \
                tracing.consuming("archive result", msg.headers, RESULTS_STREAM,
                                  **{"busscrape.task_id": result.task_id, "url.full": result.url}):
            await self._archive(msg, result)

    async def _archive(self, msg: Msg, result: ScrapeResult) -> None:
        try:
            done = await self.archiver.archive(result)
        except PermanentError as exc:
            await self._dead(msg, result, exc.reason, str(exc))
            return
        except transient_or(RetryableError) as exc:
            if self._expiring(msg):
                # RESULTS would drop it unrecorded at its max_age: a letter keeps it (90 days), with
                # its claim checks, and says why; the archive can take it from there once it is back.
                await self._dead(msg, result, "archive_unavailable",
                                 f"not archived before RESULTS' max_age ran out; last error: {exc}")
                return
            await self.retry_later(msg, exc, "result.not_archived")
            return
        # Recorded before the ack, and the result kept until it is: `busscrape run` waits for this
        # record, so a lost one would hang it. A redelivery finds meta.json and only records again.
        archived = TaskStatus(task_id=result.task_id, state="archived", url=result.url,
                              dispatched_at=result.dispatched_at, attempt=result.attempt, status=result.status,
                              worker=result.worker, archive=f"{self.storage.url.rstrip('/')}/{done.plan.folder}")
        if not await self.board.record(archived):
            await self.retry_later(msg, StorageUnavailable("STATUS did not take the archived record"),
                                   "result.status_unrecorded")
            return
        # The archive is complete (meta.json, status), so the artifacts can go before the ack: a
        # redelivery only needs meta.json. Released first, a kill before the ack cannot orphan them.
        if not await self._release(result):
            await self.retry_later(msg, StorageUnavailable("ARTIFACTS did not release the artifacts"),
                                   "result.release_failed")
            return
        try:
            await msg.ack_sync()
        except TRANSIENT as exc:
            # Redelivered later: its meta.json is there, so that delivery only records, releases and acks.
            self.counters["ack_failed"] += 1
            log.warning("result.ack_failed", error=said(exc))
            return
        self.counters["superseded" if done.superseded else "already_archived" if done.reused else "archived"] += 1
        if self.telemetry is not None and not done.reused:
            self.telemetry.results_archived.add(1)
            self.telemetry.archived_bytes.add(done.size)
        log.info("result.archived", key=done.plan.folder, objects=len(done.plan.objects), bytes=done.size,
                 reused=done.reused)
        self.search.archived(result, done.plan)

    async def _give_up(self, msg: Msg, letter: DeadLetter, msg_id: str, counter: str, **fields: Any) -> bool:
        """File ``letter``; if NATS does not take it, keep the message for later (False)."""
        try:
            await filing.file(self.bus.js, letter, msg_id=msg_id, telemetry=self.telemetry, limit=self.max_msg_size)
        except TRANSIENT as exc:
            await self.retry_later(msg, exc, "result.deadletter_failed", **fields)
            return False
        self.count(counter)
        return True

    async def _dead(self, msg: Msg, result: ScrapeResult, reason: str, error: str) -> None:
        """The result's letter, then its ``dead`` record, then the ack: each kept for later when
        NATS does not take it, so STATUS never says dead without a letter, nor stays ``rendered``."""
        letter = DeadLetter(task_id=result.task_id, stage="ingester", reason=reason, error=error[:4000],
                            url=result.url, host=filing.host_of(result.url), result=result,
                            source=filing.source_of(msg))
        if not await self._give_up(msg, letter, names.result_letter_id(result.task_id, result.task_seq,
                                                                       result.attempt), "dead_lettered"):
            return
        if not await self.board.record(TaskStatus(task_id=result.task_id, state="dead", url=result.url,
                                                  dispatched_at=result.dispatched_at, attempt=result.attempt,
                                                  reason=reason, error=error[:500])):
            await self.retry_later(msg, StorageUnavailable("STATUS did not take the dead record"),
                                   "result.status_unrecorded")
            return
        await quietly(msg.ack_sync())

    def _expiring(self, msg: Msg) -> bool:
        """Whether RESULTS is about to drop this message by its age (its last tenth of max_age)."""
        stored = msg.metadata.timestamp
        if stored is None:
            return False
        age = (utcnow() - stored).total_seconds()
        return age >= 0.9 * self.results_max_age

    async def _release(self, result: ScrapeResult) -> bool:
        """Delete the result's artifacts from ARTIFACTS; whether every one is gone."""
        outcomes = await asyncio.gather(*(self.artifacts.release(ref) for ref in result.artifacts),
                                        return_exceptions=True)
        failed = [repr(o) for o in outcomes if isinstance(o, BaseException)]
        if failed:
            self.counters["release_failed"] += 1
            log.warning("artifacts.release_failed", errors=failed[:3])
        return not failed
