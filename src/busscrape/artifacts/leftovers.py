"""Leftover artifacts: what earlier deliveries of a task stored in ARTIFACTS that no result points at.

A worker killed between storing a task's artifacts and publishing its result, or whose clean-up
failed while NATS was away, leaves objects that nothing will archive or release. The bucket's TTL
would collect them days later; but the delivery that settles the task knows where they are, since
object names are ``<task_id>/<task_seq>/<attempt>/<file>`` and the files follow from the task
(``artifacts.files.capture_files``). So the worker that publishes a retried task's result or files
its dead letter, and the reaper, discard the earlier attempts' objects, all but those of every
result RESULTS holds for this task (when an earlier attempt published one and died before its
ack, or its PubAck was lost, that result is the one the ingester archives), read from the
stream's leader (``status.standing``).

Those are found by name. ``StrayChunks`` collects what has no name any more: chunks whose meta
is gone (a delivery's put that went on writing after another delivery had discarded its object,
a clean-up cut short by a kill or by NATS going away). Every worker runs it every few minutes.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable

import structlog
from nats.js import JetStreamContext

from busscrape.artifacts.files import capture_files
from busscrape.artifacts.store import ArtifactStore, object_name
from busscrape.bus.retry import TRANSIENT, transient_or
from busscrape.errors import StorageUnavailable
from busscrape.model.messages import ScrapeTask
from busscrape.status.standing import objects_of, standing_results

log = structlog.get_logger("busscrape.leftovers")



PATIENCE = 30.0
"""How long a sweep keeps asking when NATS does not answer. Named objects are found only here,
by the delivery that settles their task: what this gives up on stays until the bucket's TTL
(days). A node lost from a cluster costs a few seconds of leader elections, so the sweep
outwaits that rather than giving up at the first timeout."""


async def sweep(js: JetStreamContext, store: ArtifactStore, task: ScrapeTask, seq: int, attempts: Iterable[int],
                keep: set[str] | None = None) -> int:
    """Discard the objects of ``attempts`` of this task but ``keep`` and those of every result
    RESULTS holds for it (an earlier attempt's result may be there, not yet archived); the number
    found. Nothing is discarded unless RESULTS answers. Asks again for up to ``PATIENCE`` seconds
    when NATS does not answer; after that, best effort: what is left, the bucket's TTL collects.
    """
    deadline = asyncio.get_running_loop().time() + PATIENCE
    delay = 0.25
    standing = await standing_results(js, task.task_id, seq)
    while standing is None and await _wait(delay, deadline):
        delay *= 2
        standing = await standing_results(js, task.task_id, seq)
    if standing is None:
        log.info("leftovers.unanswered", task_id=task.task_id, seq=seq)
        return 0
    spared = (keep or set()) | objects_of(standing)
    doomed = [name for attempt in attempts for file in capture_files(task)
              if (name := object_name(task.task_id, seq, attempt, file)) not in spared]
    found, failed = 0, []
    while doomed:
        outcomes = await asyncio.gather(*(store.delete(name) for name in doomed), return_exceptions=True)
        found += sum(1 for outcome in outcomes if outcome is True)
        failed = [(name, o) for name, o in zip(doomed, outcomes, strict=True) if isinstance(o, BaseException)]
        doomed = [name for name, o in failed if isinstance(o, (*TRANSIENT, StorageUnavailable))]
        if not doomed or not await _wait(delay, deadline):
            break
        delay *= 2
    if found or failed:
        log.info("leftovers.discarded", task_id=task.task_id, seq=seq, objects=found,
                 errors=[repr(o) for _, o in failed][:3])
    return found


async def _wait(delay: float, deadline: float) -> bool:
    """Sleep ``delay`` (at most 4 s) unless that passes ``deadline``; whether to try again."""
    delay = min(delay, 4.0)
    if asyncio.get_running_loop().time() + delay > deadline:
        return False
    await asyncio.sleep(delay)
    return True


class StrayChunks:
    """Purges chunks that no meta has named for two passes in a row.

    A put rolls its placeholder meta onto the name before its first chunk, and every deletion
    purges chunks before the meta, so chunks without a meta are left over, except those of a put
    that started between a pass's reading of the metas and its listing of the chunks: by the
    next pass, that put's meta is there (or its object is gone). So one pass only suspects;
    the next one purges what it still finds nameless.
    """

    def __init__(self, store: ArtifactStore) -> None:
        self.store = store
        self.suspects: set[str] = set()
        self.purged = 0

    async def sweep(self) -> int:
        """One pass; the number of chunk subjects purged."""
        nameless = await self.store.nameless_chunks()
        strays = list(nameless & self.suspects)
        outcomes = await asyncio.gather(*(self.store.purge_chunks(nuid) for nuid in strays), return_exceptions=True)
        purged = {nuid for nuid, done in zip(strays, outcomes, strict=True) if not isinstance(done, BaseException)}
        self.suspects = nameless - purged  # a purge that failed is tried again next pass
        if strays:
            log.warning("leftovers.stray_chunks", purged=len(purged), failed=len(strays) - len(purged))
        self.purged += len(purged)
        return len(purged)

    async def run(self, stopping: asyncio.Event, interval: float) -> None:
        """Sweep every ``interval`` seconds (with jitter, so a fleet's workers spread out) until ``stopping``.

        Never more often than the store's ``placeholder_lag``: closer passes could take the chunks
        of a put whose placeholder is still being re-sent for strays.
        """
        interval = max(interval, self.store.placeholder_lag)
        while not stopping.is_set():
            try:
                await asyncio.wait_for(stopping.wait(), interval * random.uniform(0.8, 1.2))
                return
            except TimeoutError:
                pass
            try:
                await self.sweep()
            except transient_or(StorageUnavailable) as exc:  # NATS away or not answering: next pass
                log.warning("leftovers.stray_sweep_failed", error=repr(exc))
