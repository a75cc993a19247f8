"""Back-pressure from RESULTS: while it is full, workers fetch no new tasks and hold what they rendered.

RESULTS is limits-retention with ``discard: new``: when the ingesters fall behind for long (S3
down for hours) it fills up, and the server refuses further results (``maximum bytes exceeded``).
That is not the task's fault, so it must cost the task nothing: no delivery, no attempt, no dead
letter. ``ResultsRoom`` watches how full RESULTS is (its bytes and messages against its limits)
and closes above ``HIGH_WATER``; the worker's slots wait for it to open before fetching, and a
task whose result was refused keeps its rendered result, keeps sending ``in_progress()``
heartbeats, and publishes again when room returns. The room reopens below ``LOW_WATER`` (a gap,
so a fleet at the limit does not flap).

The bus itself unavailable is the same kind of thing: a task that could not reach its page, or
could not store what it rendered, because NATS, a bucket or the object store did not answer (a
node killed, a leader election, a disconnect) is not the task's fault either. ``unavailable()``
closes the room too, until a look at RESULTS and at what failed answers again; meanwhile the
worker fetches nothing (no deliveries churned through an outage, ``worker.outages``).
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from nats.js import JetStreamContext

from busscrape.bus import names
from busscrape.bus.retry import TRANSIENT

log = structlog.get_logger("busscrape.worker")

HIGH_WATER = 0.95
LOW_WATER = 0.90


def fill_of(max_bytes: int | None, max_msgs: int | None, used_bytes: int, used_msgs: int) -> float:
    """How full a stream is against its own limits (0 when it has none): the larger of bytes and
    messages."""
    fills = [0.0]
    for limit, used in ((max_bytes, used_bytes), (max_msgs, used_msgs)):
        if limit and limit > 0:
            fills.append((used or 0) / limit)
    return max(fills)


class ResultsRoom:
    """Open while RESULTS has room and the bus answers. ``wait()`` before fetching; ``refused()``
    when a publish was refused as full; ``unavailable()`` when the bus did not answer."""

    def __init__(self, js: JetStreamContext, *, every: float = 2.0) -> None:
        self._js = js
        self.every = every
        self._open = asyncio.Event()
        self._open.set()
        self._changed = asyncio.Event()
        self.fill = 0.0
        self.pauses = 0
        """How often RESULTS filled up while this worker ran."""
        self._full = False
        self.outage: str | None = None
        """What did not answer, while the bus is unavailable."""
        self.outages = 0
        """How often the bus was unavailable while this worker ran."""

    @property
    def full(self) -> bool:
        return self._full

    @property
    def closed(self) -> bool:
        return not self._open.is_set()

    async def wait(self) -> None:
        await self._open.wait()

    def refused(self) -> None:
        """A publish was refused as full: close now, without waiting for the next look."""
        self._close(reason="publish_refused")
        self._changed.set()

    def unavailable(self, what: str, error: str = "") -> None:
        """Something on the bus did not answer: close until it does (``run`` looks again)."""
        if self.outage is None:
            self.outages += 1
            log.warning("worker.paused", reason="bus_unavailable", unavailable=what, error=error[:300],
                        hint="fetching no task until NATS answers again")
        self.outage = what
        self._open.clear()
        self._changed.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """Look at RESULTS (and at what did not answer) every ``every`` seconds (more often while
        closed) until ``stopping``."""
        while not stopping.is_set():
            outage = self.outage
            try:
                info = await self._js.stream_info(names.RESULTS_STREAM)
                if outage is not None and (stream := names.stream_behind(outage)) not in (None, names.RESULTS_STREAM):
                    await self._js.stream_info(stream)
            except TRANSIENT as exc:
                log.debug("results_room.unknown", error=repr(exc))
            else:
                self.fill = fill_of(info.config.max_bytes, info.config.max_msgs, info.state.bytes,
                                    info.state.messages)
                if self.fill >= HIGH_WATER:
                    self._close(reason="high_water")
                elif self.fill <= LOW_WATER:
                    self._full = False
                if outage is not None and self.outage == outage:
                    self.outage = None
                    log.info("worker.bus_back", unavailable=outage)
                if not self._full and self.outage is None and self.closed:
                    self._open.set()
                    log.info("worker.resumed", results_fill=round(self.fill, 3))
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.every / 4 if self.closed else self.every)

    def _close(self, *, reason: str) -> None:
        if self._full:
            return
        self._full = True
        self._open.clear()
        self.pauses += 1
        log.warning("worker.paused", reason=reason, results_fill=round(self.fill, 3),
                    hint="RESULTS is full: the ingesters are behind or the archive is down")
