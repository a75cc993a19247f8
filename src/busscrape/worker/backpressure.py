"""Back-pressure from RESULTS: while it is full, workers fetch no new tasks and hold what they rendered.

RESULTS is limits-retention with ``discard: new``: when the ingesters fall behind for long (S3
down for hours) it fills up, and the server refuses further results (``maximum bytes exceeded``).
That is not the task's fault, so it must cost the task nothing: no delivery, no attempt, no dead
letter. ``ResultsRoom`` watches how full RESULTS is (its bytes and messages against its limits)
and closes above ``HIGH_WATER``; the worker's slots wait for it to open before fetching, and a
task whose result was refused keeps its rendered result, keeps sending ``in_progress()``
heartbeats, and publishes again when room returns. The room reopens below ``LOW_WATER`` (a gap,
so a fleet at the limit does not flap).
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
    """Open while RESULTS has room. ``wait()`` before fetching; ``refused()`` when a publish was."""

    def __init__(self, js: JetStreamContext, *, every: float = 2.0) -> None:
        self._js = js
        self.every = every
        self._open = asyncio.Event()
        self._open.set()
        self._changed = asyncio.Event()
        self.fill = 0.0
        self.pauses = 0
        """How often RESULTS filled up while this worker ran."""

    @property
    def full(self) -> bool:
        return not self._open.is_set()

    async def wait(self) -> None:
        await self._open.wait()

    def refused(self) -> None:
        """A publish was refused as full: close now, without waiting for the next look."""
        self._close(reason="publish_refused")
        self._changed.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """Look at RESULTS every ``every`` seconds (more often while closed) until ``stopping``."""
        while not stopping.is_set():
            try:
                info = await self._js.stream_info(names.RESULTS_STREAM)
            except TRANSIENT as exc:
                log.debug("results_room.unknown", error=repr(exc))
            else:
                self.fill = fill_of(info.config.max_bytes, info.config.max_msgs, info.state.bytes,
                                    info.state.messages)
                if self.fill >= HIGH_WATER:
                    self._close(reason="high_water")
                elif self.fill <= LOW_WATER and self.full:
                    self._open.set()
                    log.info("worker.resumed", results_fill=round(self.fill, 3))
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.every / 4 if self.full else self.every)

    def _close(self, *, reason: str) -> None:
        if self.full:
            return
        self._open.clear()
        self.pauses += 1
        log.warning("worker.paused", reason=reason, results_fill=round(self.fill, 3),
                    hint="RESULTS is full: the ingesters are behind or the archive is down")
