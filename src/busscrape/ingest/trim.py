"""Keeping RESULTS small: results every reader has acknowledged leave it after a while.

RESULTS is limits-retention, so acks remove nothing, and with a week's ``max_age`` a fleet
archiving a few pages a second would fill its ``max_bytes`` within hours, then every worker would
wait for room (``worker.backpressure``). So each ingester trims it: every ``EVERY`` seconds it reads
the ack floor of every durable consumer of RESULTS (the ingesters', and any a user added), notes
the lowest, and purges the stream below the lowest floor it noted ``keep`` seconds ago
(``streams.results_keep_acked``). A result therefore stays while any durable consumer still needs
it, and for ``keep`` after the last one acknowledged it (for readers that follow the stream without
a durable consumer); what RESULTS holds is the backlog, not the history. The keep window is a
courtesy, never what stands between the workers and room: when RESULTS is nearly full (``FULL_AT``
of its ``max_bytes`` or ``max_msgs``: ``discard: new`` refuses results and every worker waits),
the acknowledged results go at once, down to the floor of now. An abandoned durable
consumer holds the trim back: ``busscrape status`` shows RESULTS filling, and deleting the consumer
frees it.

Purging below a sequence is idempotent and only ever moves forward, so any number of ingesters can
trim at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque

import structlog
from nats.js import JetStreamContext, api

from busscrape.bus import names
from busscrape.bus.retry import TRANSIENT

log = structlog.get_logger("busscrape.ingester")

EVERY = 10.0
FULL_AT = 0.8
"""RESULTS this full (bytes or messages, of its limits) is short of room: the keep window yields."""


class ResultsTrimmer:
    def __init__(self, js: JetStreamContext, *, keep: float, every: float = EVERY) -> None:
        self._js = js
        self.keep = keep
        self.every = every
        self._floors: deque[tuple[float, int]] = deque()
        self.purged_below = 0
        """The sequence below which this trimmer has purged RESULTS."""

    async def floor(self) -> int | None:
        """The lowest sequence every durable consumer of RESULTS has acknowledged (None: none)."""
        floors = []
        for info in await self._js.consumers_info(names.RESULTS_STREAM):
            if not info.config.durable_name:
                continue  # an ephemeral reader (a `nats stream view`, a scan) holds nothing back
            done = info.delivered if info.config.ack_policy == api.AckPolicy.NONE else info.ack_floor
            floors.append(done.stream_seq if done is not None else 0)
        return min(floors) if floors else None

    async def trim(self, now: float | None = None) -> int:
        """One look; the sequence below which RESULTS is now purged (0: nothing yet)."""
        now = time.monotonic() if now is None else now
        floor = await self.floor()
        if floor is None:
            return self.purged_below
        self._floors.append((now, floor))
        # The newest floor noted at least `keep` ago: everything at or below it has been
        # acknowledged by every durable consumer for at least that long.
        ripe = None
        while self._floors and now - self._floors[0][0] >= self.keep:
            ripe = self._floors.popleft()[1]
        if ripe is not None:
            self._floors.appendleft((now - self.keep, ripe))  # still the floor for the next look
        if floor > (ripe or 0) and await self._short_of_room():
            log.info("results.trimmed_for_room", below=floor + 1, kept_until=(ripe or 0) + 1)
            ripe = floor  # acknowledged by every durable consumer: the workers need the room more
        if ripe is not None and ripe > 0 and ripe + 1 > self.purged_below:
            await self._js.purge_stream(names.RESULTS_STREAM, seq=ripe + 1)
            self.purged_below = ripe + 1
            log.debug("results.trimmed", below=self.purged_below)
        return self.purged_below

    async def _short_of_room(self) -> bool:
        info = await self._js.stream_info(names.RESULTS_STREAM)
        limits = ((info.state.bytes, info.config.max_bytes), (info.state.messages, info.config.max_msgs))
        return any(limit and limit > 0 and held >= FULL_AT * limit for held, limit in limits)

    async def run(self, stopping: asyncio.Event) -> None:
        """Trim every ``every`` seconds until ``stopping``."""
        while not stopping.is_set():
            try:
                await self.trim()
            except TRANSIENT as exc:  # NATS away: the next look
                log.warning("results.trim_failed", error=repr(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.every)
