"""Publishing a rendered task's result to RESULTS, and what then becomes of its artifacts.

The result goes out under ``Nats-Msg-Id: result-<task_id>-<task_seq>`` through a ``Publisher``
that re-sends a publish whose PubAck did not come in time: RESULTS de-duplicates the re-send, so a
lost PubAck turns into a "duplicate" answer that says the result is stored. Then:

========================================  =====================================================
the server answered                        what happens
========================================  =====================================================
PubAck                                     stored: the task is acked; earlier attempts' leftover
                                           objects are discarded, but none a result points at
PubAck, duplicate                          another delivery's result stands: this one's
                                           artifacts would be orphans and are released
"maximum bytes/messages exceeded"          RESULTS is full: back-pressure (``backpressure``). The
                                           result is held (heartbeats go on) and published again
                                           when there is room; no delivery is spent
an error (4xx, or a 5xx JetStream error)   not stored: its artifacts are released, the task
                                           retried (``results_unavailable``) or dead-lettered
no answer at all (timeouts, connection)    unknown: the result may be stored, so nothing it
                                           points at is touched; the task is retried, and the
                                           next delivery finds the stored result (``standing``)
                                           before it renders again
========================================  =====================================================
"""

from __future__ import annotations

import asyncio
from collections import Counter

import structlog
from opentelemetry.trace import SpanKind

from busscrape.artifacts import leftovers
from busscrape.artifacts.store import ArtifactStore
from busscrape.bus import names
from busscrape.bus.connection import Bus
from busscrape.bus.publisher import Publisher, PublishFailed
from busscrape.bus.retry import TRANSIENT
from busscrape.deadletters.filing import ENVELOPE
from busscrape.errors import LimitExceeded, StorageUnavailable
from busscrape.model.messages import ArtifactRef, ScrapeResult, ScrapeTask, encode
from busscrape.telemetry import tracing
from busscrape.worker.backpressure import ResultsRoom

log = structlog.get_logger("busscrape.worker")

_RESENDS = 2  # re-sends of a result whose PubAck did not come in time (de-duplicated by its id)
_WINDOW = 256  # results in flight at once (a worker has a few; this is never the limit)


class ResultPublisher:
    """One per worker: ``async with ResultPublisher(...) as results: await results.publish(task, result)``."""

    def __init__(self, bus: Bus, artifacts: ArtifactStore, room: ResultsRoom, counters: Counter[str], *,
                 timeout: float, max_msg_size: int = 1024 * 1024) -> None:
        self.bus = bus
        self.artifacts = artifacts
        self.room = room
        self.counters = counters
        self.max_msg_size = max_msg_size
        self._publisher = Publisher(bus.nc, window=_WINDOW, timeout=timeout, retries=_RESENDS)

    async def __aenter__(self) -> ResultPublisher:
        await self._publisher.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._publisher.close()

    async def publish(self, task: ScrapeTask, result: ScrapeResult) -> bool:
        """Store ``result`` in RESULTS; True when this delivery's result is the one that stands,
        False when another delivery's already did. Raises ``StorageUnavailable`` (retry)."""
        headers = tracing.inject({names.MSG_ID: names.result_msg_id(task.task_id, result.task_seq)})
        payload = encode(result)
        limit = min(self.max_msg_size, self.bus.nc.max_payload or self.max_msg_size) - ENVELOPE
        if len(payload) > limit:  # its labels, say: what the page controls is bounded already
            await self.drop(result.artifacts)
            raise LimitExceeded(f"the result is {len(payload)} bytes, over RESULTS' {limit} (streams.max_msg_size)",
                                reason="result_too_large")
        while True:
            with tracing.span("publish result", SpanKind.PRODUCER, **{
                    "messaging.system": "nats", "messaging.destination.name": names.RESULTS_STREAM}):
                settled = await (await self._publisher.send(names.result_subject(task.task_id), payload, headers))
            if settled.ack is not None:
                break
            error = settled.error
            assert error is not None
            if error.full:
                await self._hold(error)
                continue
            if error.answered:
                await self.drop(result.artifacts)  # not stored: nothing points at them
                raise StorageUnavailable(f"RESULTS refused the result: {error.description}",
                                         reason="results_unavailable", what=names.RESULTS_STREAM)
            # No answer: it may be stored. What it points at stays; the next delivery looks first.
            raise StorageUnavailable(f"RESULTS did not confirm the result ({error.description}); it may be "
                                     "stored, so its artifacts are kept", reason="results_unavailable",
                                     what=names.RESULTS_STREAM)
        stands = not settled.ack.duplicate
        if not stands:
            # An earlier delivery of this task already published its result (and was killed
            # before its ack): that result stands; these artifacts would be orphans.
            self.counters["duplicate_results"] += 1
            await self.drop(result.artifacts)
        if result.attempt > 1:
            await self.sweep(task, result.task_seq, range(1, result.attempt),
                             keep={ref.object for ref in result.artifacts} if stands else set())
        return stands

    async def _hold(self, error: PublishFailed) -> None:
        """RESULTS is full: wait for room (the delivery's heartbeats keep the task), then publish
        again. No attempt is recorded and no delivery spent: it is the fleet's state, not the task's."""
        self.counters["held_for_room"] += 1
        self.room.refused()
        log.warning("result.held", reason=error.description)
        await self.room.wait()

    async def sweep(self, task: ScrapeTask, seq: int, attempts: range, keep: set[str]) -> None:
        """Discard what earlier attempts stored, but anything a standing result points at. Before
        the ack, so a kill leaves the task (and this) to the next delivery."""
        found = await leftovers.sweep(self.bus.js, self.artifacts, task, seq, attempts, keep)
        if found:  # objects, not tasks: kept out of the task metric
            self.counters["leftovers_discarded"] += found

    async def drop(self, refs: tuple[ArtifactRef, ...] | list[ArtifactRef]) -> None:
        """Release objects no result points at (best effort: the bucket's TTL collects the rest)."""
        outcomes = await asyncio.gather(*(self.artifacts.release(ref) for ref in refs), return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if any(not isinstance(o, TRANSIENT) for o in failed):
            log.warning("artifacts.release_failed", errors=[repr(o) for o in failed][:3])
