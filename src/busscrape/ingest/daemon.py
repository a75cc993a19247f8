"""The ingester: copies every result from RESULTS, and every dead letter, into the archive.

One result (``Ingester.handle``)::

    decode ── malformed ───────────────────────────────► DEADLETTER (poison), ack
      │
    archive.plan: keys from the result ── meta.json there already describes it ──► ack (nothing to write)
      │
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
became of every task.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import weakref
from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg

from busscrape.archive import layout
from busscrape.archive.storage.local import Storage
from busscrape.artifacts.store import ArtifactStore
from busscrape.bus.connection import Bus
from busscrape.bus.consumer import PullService, _quiet
from busscrape.bus.names import ARCHIVIST_CONSUMER, DEADLETTER_STREAM, INGESTERS_CONSUMER, RESULTS_STREAM
from busscrape.deadletters import filing
from busscrape.errors import MessageDecodeError, PermanentError, RetryableError, StorageUnavailable, StreamsMissing
from busscrape.model.messages import DeadLetter, ScrapeResult, decode, encode
from busscrape.search.feed import SearchFeed
from busscrape.settings import Settings
from busscrape.status.records import StatusBoard, TaskStatus
from busscrape.telemetry import tracing
from busscrape.telemetry.metrics import Telemetry
from busscrape.telemetry.tracing import trace_id_of

log = structlog.get_logger("busscrape.ingester")

JSON = "application/json"
LETTER_SLOTS = 2  # dead letters are few and small
_NATS_ERRORS = (TimeoutError, nats.errors.Error, nats.js.errors.Error, OSError)


def retry_delay(delivered: int, base: float, cap: float) -> float:
    """The nak delay after ``delivered`` failed deliveries: ``base`` doubling, capped, jittered.

    The jitter (half to all of the delay) spreads the retries of results that failed together,
    so a storage that comes back is not hit by all of them at the same instant.
    """
    ceiling = min(cap, base * 2 ** min(max(delivered - 1, 0), 30))
    return random.uniform(ceiling / 2, ceiling)


def result_letter_id(result: ScrapeResult) -> str:
    """The dedup id of the dead letter for one result (a redelivery files it only once)."""
    return f"dead-result-{result.task_id}-{result.task_seq}-{result.attempt}"


@dataclass(frozen=True)
class Archived:
    """What archiving one result did."""

    plan: layout.ArchivePlan
    objects: tuple[layout.StoredObject, ...]
    reused: bool
    """meta.json already described this result (a redelivery after a crash): nothing was written."""

    @property
    def size(self) -> int:
        return sum(o.size for o in self.objects)


class Archiver:
    """Writes one result's objects and then its meta.json."""

    def __init__(self, storage: Storage, artifacts: ArtifactStore, *, prefix: str = "", compress: bool = True,
                 gzip_level: int = layout.GZIP_LEVEL) -> None:
        self.storage = storage
        self.artifacts = artifacts
        self.prefix = prefix
        self.compress = compress
        self.gzip_level = gzip_level
        # Two results of one task on one day share a folder: one at a time in this process.
        self._folders: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    async def archive(self, result: ScrapeResult, *, first_try: bool = False) -> Archived:
        """Archive ``result``. Raises ``PermanentError`` (dead-letter) or ``RetryableError`` (nak).

        ``first_try``: the first delivery of a first attempt, which cannot have written anything
        yet, so the folder is not inspected first (one request less per result on the hot path).
        A folder that another scrape of the same task wrote earlier the same day is then simply
        overwritten, meta.json last; what it listed and the new scrape lacks stays unlisted.
        """
        plan = layout.plan(result, prefix=self.prefix, compress=self.compress)
        lock = self._folders.setdefault(plan.folder, asyncio.Lock())
        async with lock:
            existing = None if first_try else await self.storage.get(plan.meta_key)
            if existing is not None and layout.describes(existing, result, plan):
                return Archived(plan, (), reused=True)
            if existing is not None:
                await self._replace(plan, existing)
            try:
                stored = await _all(self._copy(o) for o in plan.objects)
            except PermanentError:
                await self._discard(plan)
                raise
            await self.storage.put_bytes(plan.meta_key, layout.meta_document(result, stored), content_type=JSON)
        return Archived(plan, tuple(stored), reused=False)

    async def _replace(self, plan: layout.ArchivePlan, meta: bytes) -> None:
        """Make way for another result of the same task and day. Its meta.json goes first, so
        the folder never claims to be complete while it holds a mix of both."""
        await self.storage.delete(plan.meta_key)
        ours = {o.key for o in plan.objects}
        for key in sorted(layout.listed_keys(meta) - ours):
            if key.startswith(plan.folder + "/"):
                await self.storage.delete(key)

    async def _copy(self, planned: layout.PlannedObject) -> layout.StoredObject:
        with tracing.span("copy artifact", **{"busscrape.artifact": planned.name, "busscrape.key": planned.key}):
            return await self._copy_one(planned)

    async def _copy_one(self, planned: layout.PlannedObject) -> layout.StoredObject:
        ref = planned.ref
        async with aclosing(self.artifacts.stream(ref)) as source:
            # Not durable on their own: meta.json, written last into the same folder, makes them so.
            if planned.content_encoding is None:
                await self.storage.put(planned.key, source, content_type=ref.content_type, durable=False)
                # The stream checked size and sha256 before it ended, and the bytes are stored as they came.
                size, sha256 = ref.size, ref.sha256
            else:
                measured = _Measured(layout.gzip_stream(source, self.gzip_level))
                await self.storage.put(planned.key, measured, content_type=ref.content_type,
                                       content_encoding=planned.content_encoding, durable=False)
                size, sha256 = measured.size, measured.sha256
        return layout.StoredObject(
            key=planned.key, name=planned.name, size=size, sha256=sha256, content_type=ref.content_type,
            content_encoding=planned.content_encoding, original_size=ref.size, original_sha256=ref.sha256,
        )

    async def _discard(self, plan: layout.ArchivePlan) -> None:
        """After a permanent failure, remove what this result wrote (best effort): no half folder.
        A meta.json there is another scrape's, whose objects these may have replaced: it goes too."""
        for planned in (*plan.objects, plan.meta_key):
            with contextlib.suppress(RetryableError):
                await self.storage.delete(planned if isinstance(planned, str) else planned.key)


class _Measured:
    """Passes chunks through, counting and hashing them: the stored object's size and sha256."""

    def __init__(self, chunks: AsyncIterable[bytes]) -> None:
        self._chunks = chunks
        self._digest = hashlib.sha256()
        self.size = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._chunks:
            self.size += len(chunk)
            self._digest.update(chunk)
            yield chunk

    @property
    def sha256(self) -> str:
        return self._digest.hexdigest()


async def _all(coros: Iterable[Any]) -> list[Any]:
    """``gather`` that cancels the rest as soon as one fails (no point finishing the others)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _retry_later(service: PullService, msg: Msg, exc: BaseException, backoff: tuple[float, float],
                       event: str, **fields: Any) -> None:
    delivered = msg.metadata.num_delivered
    delay = retry_delay(delivered, *backoff)
    service.counters["retried"] += 1
    log.warning(event, error=str(exc) or type(exc).__name__, delivery=delivered, retry_in=round(delay, 2), **fields)
    await _quiet(msg.nak(delay=delay))


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
                         exit_when_idle=cfg.exit_when_idle, grace_period=cfg.grace_period, telemetry=telemetry)
        self.storage = storage
        self.artifacts = ArtifactStore(bus.js)
        self.archiver = Archiver(storage, self.artifacts, prefix=s.archive.prefix, compress=s.archive.compress,
                                 gzip_level=s.archive.gzip_level)
        self.backoff = (cfg.retry_base_delay, cfg.retry_max_delay)
        self.board = StatusBoard(bus.js)
        self.search = SearchFeed(s, storage, self.counters)  # best effort, off the hot path (search_feed)
        self.archivist = Archivist(bus, storage, prefix=s.archive.prefix, backoff=self.backoff,
                                   grace_period=cfg.grace_period, telemetry=telemetry)

    async def setup(self) -> None:
        """Refuse to start without the dead-letter consumer (the results one is checked by ``run``)."""
        try:
            await self.bus.js.consumer_info(DEADLETTER_STREAM, ARCHIVIST_CONSUMER)
        except nats.js.errors.NotFoundError:
            raise StreamsMissing(
                f"the durable consumer {DEADLETTER_STREAM}/{ARCHIVIST_CONSUMER} does not exist. Run "
                "`busscrape streams apply` against the same NATS server first"
            ) from None
        await self.search.start()

    async def teardown(self) -> None:
        await self.search.close()

    def stop(self) -> None:
        """First call drains (results and dead letters), second stops now."""
        super().stop()
        self.archivist.stop()

    async def run(self) -> Counter[str]:
        """Archive until stopped or bounded; returns the counters, the archivist's as ``letters_*``."""
        letters = asyncio.create_task(self.archivist.run(), name="archivist")
        letters.add_done_callback(self._archivist_ended)
        try:
            counters = await super().run()
        finally:
            if not self.archivist.stopping:
                self.archivist.stop()
            (failure,) = await asyncio.gather(letters, return_exceptions=True)
        if isinstance(failure, BaseException):
            raise failure
        for name, count in self.archivist.counters.items():
            counters[f"letters_{name}"] += count
        return counters

    def _archivist_ended(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None and not self.stopping:
            log.error("archivist.failed", error=repr(task.exception()))
            self.stop()

    async def handle(self, msg: Msg) -> None:
        trace_id = trace_id_of(msg.headers)
        try:
            result = decode(ScrapeResult, msg.data)
        except MessageDecodeError as exc:
            msg_id = filing.poison_letter_id(RESULTS_STREAM, msg.metadata.sequence.stream)
            await self._give_up(msg, filing.poison("ingester", msg, exc), msg_id, "malformed", trace_id=trace_id)
            return
        with structlog.contextvars.bound_contextvars(task_id=result.task_id, url=result.url, attempt=result.attempt,
                                                     trace_id=trace_id), \
                tracing.consuming("archive result", msg.headers, RESULTS_STREAM,
                                  **{"busscrape.task_id": result.task_id, "url.full": result.url}):
            await self._archive(msg, result)

    async def _archive(self, msg: Msg, result: ScrapeResult) -> None:
        fields: dict[str, Any] = {}
        try:
            first_try = msg.metadata.num_delivered == 1 and result.attempt == 1
            done = await self.archiver.archive(result, first_try=first_try)
        except PermanentError as exc:
            letter = DeadLetter(task_id=result.task_id, stage="ingester", reason=exc.reason, error=str(exc),
                                url=result.url, host=filing.host_of(result.url), result=result,
                                source=filing.source_of(msg))
            await self._give_up(msg, letter, result_letter_id(result), "dead_lettered", **fields)
            await self.board.record(TaskStatus(task_id=result.task_id, state="dead", url=result.url,
                                               dispatched_at=result.dispatched_at, attempt=result.attempt,
                                               reason=exc.reason, error=str(exc)[:500]))
            return
        except (RetryableError, *_NATS_ERRORS) as exc:
            await _retry_later(self, msg, exc, self.backoff, "result.not_archived", **fields)
            return
        # Recorded before the ack, and the result kept until it is: `busscrape run` waits for this
        # record, so a lost one would hang it. A redelivery finds meta.json and only records again.
        archived = TaskStatus(task_id=result.task_id, state="archived", url=result.url,
                              dispatched_at=result.dispatched_at, attempt=result.attempt, status=result.status,
                              worker=result.worker, archive=f"{self.storage.url.rstrip('/')}/{done.plan.folder}")
        if not await self.board.record(archived):
            await _retry_later(self, msg, StorageUnavailable("STATUS did not take the archived record"), self.backoff,
                               "result.status_unrecorded", **fields)
            return
        # The archive is complete (meta.json, status), so the artifacts can go before the ack: a
        # redelivery only needs meta.json. Released first, a kill before the ack cannot orphan them.
        if not await self._release(result, fields):
            await _retry_later(self, msg, StorageUnavailable("ARTIFACTS did not release the artifacts"), self.backoff,
                               "result.release_failed", **fields)
            return
        try:
            await msg.ack_sync()
        except _NATS_ERRORS as exc:
            # Redelivered later: its meta.json is there, so that delivery only records, releases and acks.
            self.counters["ack_failed"] += 1
            log.warning("result.ack_failed", error=str(exc) or type(exc).__name__, **fields)
            return
        self.counters["already_archived" if done.reused else "archived"] += 1
        if self.telemetry is not None and not done.reused:
            self.telemetry.results_archived.add(1)
            self.telemetry.archived_bytes.add(done.size)
        log.info("result.archived", key=done.plan.folder, objects=len(done.plan.objects), bytes=done.size,
                 reused=done.reused, **fields)
        self.search.archived(result, done.plan)

    async def _give_up(self, msg: Msg, letter: DeadLetter, msg_id: str, counter: str, **fields: Any) -> None:
        """File ``letter``, then ack; if NATS does not take the letter, keep the message for later."""
        try:
            await filing.file(self.bus.js, letter, msg_id=msg_id, telemetry=self.telemetry)
        except _NATS_ERRORS as exc:
            await _retry_later(self, msg, exc, self.backoff, "result.deadletter_failed", **fields)
            return
        self.counters[counter] += 1
        await _quiet(msg.ack_sync())

    async def _release(self, result: ScrapeResult, fields: dict[str, Any]) -> bool:
        """Delete the result's artifacts from ARTIFACTS; whether every one is gone."""
        outcomes = await asyncio.gather(*(self.artifacts.release(ref) for ref in result.artifacts),
                                        return_exceptions=True)
        failed = [repr(o) for o in outcomes if isinstance(o, BaseException)]
        if failed:
            self.counters["release_failed"] += 1
            log.warning("artifacts.release_failed", errors=failed[:3], **fields)
        return not failed


class Archivist(PullService):
    """Copies every dead letter into the archive; runs inside each ingester."""

    kind = "archivist"
    stream = DEADLETTER_STREAM
    durable = ARCHIVIST_CONSUMER

    def __init__(self, bus: Bus, storage: Storage, *, prefix: str, backoff: tuple[float, float],
                 grace_period: float, telemetry: Telemetry | None = None) -> None:
        super().__init__(bus, concurrency=LETTER_SLOTS, grace_period=grace_period, telemetry=telemetry)
        self.storage = storage
        self.prefix = prefix
        self.backoff = backoff

    async def handle(self, msg: Msg) -> None:
        try:
            letter = decode(DeadLetter, msg.data)
            data = msg.data
        except MessageDecodeError as exc:
            # Archive a letter about the unreadable one, dated by the stream (so a redelivery writes
            # the same bytes). It is never filed to DEADLETTER again: that could loop.
            letter = filing.poison("ingester", msg, exc).model_copy(update={"dead_at": msg.metadata.timestamp})
            data = encode(letter)
            self.counters["unreadable"] += 1
        key = layout.deadletter_key(letter, prefix=self.prefix, stream=DEADLETTER_STREAM,
                                     seq=msg.metadata.sequence.stream)
        try:
            existing = await self.storage.get(key)
            newer = existing is not None and _dead_at_after(existing, letter)
            if not newer:
                await self.storage.put_bytes(key, data, content_type=JSON)
        except RetryableError as exc:
            await _retry_later(self, msg, exc, self.backoff, "deadletter.not_archived", key=key)
            return
        await _quiet(msg.ack_sync())
        self.counters["superseded" if newer else "archived"] += 1
        log.info("deadletter.archived", key=key, task_id=letter.task_id, reason=letter.reason, superseded=newer)


def _dead_at_after(stored: bytes, letter: DeadLetter) -> bool:
    """Whether the stored letter is a later one for the same key (the latest word stays)."""
    try:
        return decode(DeadLetter, stored).dead_at > letter.dead_at
    except MessageDecodeError:
        return False
