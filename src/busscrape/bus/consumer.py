"""The daemon core shared by workers and ingesters: slots over one durable pull consumer.

A ``PullService`` runs ``concurrency`` slots. Each slot fetches ONE message only when it is
free, handles it, and fetches again, so a process never holds messages it cannot work on
(they stay available to the rest of the fleet). While a message is handled the service sends
``in_progress()`` heartbeats at a third of the consumer's ack_wait, so long renders are not
redelivered under a live worker.

Lifecycle (``async with service: await service.run()``)::

    first stop()  -> stop fetching; in-flight messages may finish within the grace period;
                     what is left is nak'ed at once (another process takes it), then exit
    second stop() -> cancel everything now (handlers nak on the way out)
    max_items     -> stop fetching after that many messages, finish them, exit
    exit_when_idle-> exit after that long with nothing fetched and nothing in flight

Subclasses implement ``handle(msg)``, which acks, naks or dead-letters itself (``retry_later``
naks with the service's backoff). Anything that escapes it is a bug: logged, the message nak'ed
with a delay, and the daemon carries on.

A service may bring *companions*: side consumers of other streams that live and die with it (the
worker's reaper on TASK_ADVISORIES, the ingester's archivist on DEADLETTER). They are pull
services too, so they get the same slots, heartbeats and drain; they start after this one has
bound its consumer, stop when it stops, and their counters join its own under their kind
(``archivist_archived``). A companion that fails stops the service, and ``run`` raises its error.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections import Counter
from typing import TYPE_CHECKING, Any, ClassVar

import nats.errors
import nats.js.errors
import structlog
from nats.aio.msg import Msg

from busscrape import cancelling
from busscrape.bus.compat import prefetched
from busscrape.bus.connection import Bus
from busscrape.bus.retry import TRANSIENT, backoff, patiently
from busscrape.errors import StreamsMissing, said

if TYPE_CHECKING:
    # Annotations only: the daemons load the OpenTelemetry SDK, the short commands need not.
    from busscrape.telemetry.metrics import Telemetry

log = structlog.get_logger("busscrape.service")

CRASH_DELAY = 5.0  # seconds before a message whose handler crashed is redelivered
# A nak without a delay lives only in the server's memory (its redelivery queue): a server that
# restarts before it redelivers, like the embedded one `busscrape run` stops on Ctrl-C, would hold
# the message until ack_wait ran out. A nak with a delay rewrites the delivery's time in the
# consumer's stored state, so the message is due at once, restart or not.
HAND_BACK_DELAY = 0.001
STOP_GRACE = 15.0
"""Seconds a stopping service gives its loops (slots, background tasks) to end once cancelled:
in-flight work had its grace period and ten seconds more already (``_drain``)."""


class PullService(ABC):
    """A long-running consumer of one durable pull consumer, with bounded concurrency."""

    kind: ClassVar[str] = "service"
    stream: ClassVar[str]
    durable: ClassVar[str]

    def __init__(
        self,
        bus: Bus,
        *,
        concurrency: int,
        max_items: int | None = None,
        exit_when_idle: float | None = None,
        grace_period: float = 30.0,
        fetch_timeout: float = 2.0,
        backoff: tuple[float, float] = (1.0, 60.0),
        telemetry: Telemetry | None = None,
    ) -> None:
        self.bus = bus
        self.telemetry = telemetry
        self.lag = 0
        self._bound = False
        self.concurrency = concurrency
        self.max_items = max_items
        self.exit_when_idle = exit_when_idle
        self.grace_period = grace_period
        self.fetch_timeout = fetch_timeout
        self.backoff = backoff
        """First and longest delay of ``retry_later`` (the base doubles per delivery)."""
        self.counters: Counter[str] = Counter()
        self.heartbeat_interval = 10.0
        self._stopping = asyncio.Event()
        self._stop_calls = 0
        self._taken = 0
        self._inflight: dict[asyncio.Task[Any], Msg] = {}
        self._fetching: set[asyncio.Task[Any]] = set()
        self._last_activity = time.monotonic()
        self._entered = False
        self._started = False
        self._companions: list[PullService] = []
        self._held = 0  # slots waiting in before_fetch

    # -- hooks ------------------------------------------------------------------------------

    @abstractmethod
    async def handle(self, msg: Msg) -> None:
        """Work on one message and ack/nak/term it."""

    async def setup(self) -> None:  # noqa: B027 - optional hook
        """Acquire resources (browser, storage) before the first fetch."""

    async def teardown(self) -> None:  # noqa: B027 - optional hook
        """Release them after the last message."""

    async def background(self) -> list[asyncio.Task[Any]]:
        """Extra tasks that run alongside the slots (e.g. the stray-chunk sweep); cancelled at exit."""
        return []

    def companions(self) -> list[PullService]:
        """Side consumers that run with this service (see the module's docstring)."""
        return []

    def paused(self) -> bool:
        """Hook: whether taking another message must wait (the worker's, while RESULTS is full)."""
        return False

    async def before_fetch(self) -> None:  # noqa: B027 - optional hook
        """Hook: wait until ``paused()`` is over."""

    def handed_on(self, due_in: float) -> None:
        """The message just handled was put off (nak'ed to come back in ``due_in`` seconds) rather
        than worked on: it counts neither towards ``max_items`` nor as activity done, and the
        service is not idle (``exit_when_idle``) before it is due back."""
        self._taken = max(self._taken - 1, 0)
        self._last_activity = max(self._last_activity, time.monotonic() + due_in)

    def count(self, outcome: str) -> None:
        """Count an outcome in the shutdown summary (and, through ``counted``, in metrics)."""
        self.counters[outcome] += 1
        self.counted(outcome)

    def counted(self, outcome: str) -> None:  # noqa: B027 - optional hook
        """Hook: report ``outcome`` to metrics (the worker counts tasks by outcome)."""

    async def checks(self) -> dict[str, bool]:
        """Readiness: connected to NATS and bound to the consumer (subclasses add theirs)."""
        return {"nats": self.bus.nc.is_connected, "consumer": self._bound}

    # -- lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> PullService:
        if self._entered:
            raise RuntimeError(f"a {type(self).__name__} can be entered only once")
        self._entered = True
        await self.setup()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.teardown()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    def stop(self) -> None:
        """First call: drain gracefully. Second call: cancel in-flight work now (companions alike)."""
        self._stop_calls += 1
        self._stopping.set()
        for side in self._companions:
            side.stop()
        if self._stop_calls == 1:
            log.info(f"{self.kind}.stopping", in_flight=self.in_flight, grace_period=self.grace_period)
        else:
            log.warning(f"{self.kind}.stopping_now", in_flight=self.in_flight)
            for task in list(self._inflight):
                task.cancel()

    async def run(self) -> Counter[str]:
        """Work until stopped, bounded by max_items or exit_when_idle. Returns the counters."""
        if self._started:
            raise RuntimeError("run() can be called once")
        self._started = True
        subs = await self._bind()
        self._bound = True
        await self._learn_ack_wait()
        extra = await self.background()
        if self.telemetry is not None:
            labels = {"service": self.kind}
            self.telemetry.gauge("in_flight", lambda: [(self.in_flight, labels)])
            self.telemetry.gauge("lag", lambda: [(self.lag, {"consumer": f"{self.stream}/{self.durable}"})])
            extra.append(asyncio.create_task(self._watch_lag(), name=f"{self.kind}-lag"))
        # Idle time counts from the first fetch, not from construction: a browser that takes
        # longer than exit_when_idle to start must not make the service leave before it asked.
        self._last_activity = time.monotonic()
        slots = {asyncio.create_task(self._slot(sub), name=f"{self.kind}-slot-{i}"): sub
                 for i, sub in enumerate(subs)}
        log.info(f"{self.kind}.started", concurrency=self.concurrency, stream=self.stream, consumer=self.durable)
        watcher = asyncio.create_task(self._watch_idle())
        self._companions = self.companions()
        sides = [asyncio.create_task(self._accompany(side), name=side.kind) for side in self._companions]
        failure: BaseException | None = None
        try:
            await self._stopping.wait()
            await self._drain(slots)
        finally:
            # Bounded (``cancelling``): a task whose cancel is lost inside nats-py's wait_for must
            # not keep the service from ending; it is left behind, the process exits anyway.
            await cancelling.stop([*slots, *extra, watcher], grace=STOP_GRACE, what=f"{self.kind} loops")
            for sub in subs:
                await self._release_prefetched(sub)
            for side in self._companions:
                if not side.stopping:
                    side.stop()
            for side, outcome in zip(self._companions, await asyncio.gather(*sides, return_exceptions=True),
                                     strict=True):
                if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
                    failure = failure or outcome
                for name, count in side.counters.items():
                    self.counters[f"{side.kind}_{name}"] += count
            log.info(f"{self.kind}.stopped", **dict(sorted(self.counters.items())))
        if failure is not None:
            raise failure
        return self.counters

    async def _may_fetch(self) -> bool:
        """Wait while ``paused()`` (``before_fetch``), unless the service stops first (False then).
        Waiting here is not idleness: a paused service does not leave by ``exit_when_idle``."""
        if not self.paused():
            return True
        waiting = asyncio.ensure_future(self.before_fetch())
        stopping = asyncio.ensure_future(self._stopping.wait())
        self._held += 1
        try:
            done, _ = await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._held -= 1
            self._last_activity = time.monotonic()
            waiting.cancel()
            stopping.cancel()
        if waiting in done and not waiting.cancelled() and waiting.exception() is None:
            return True
        if waiting in done and (error := waiting.exception()) is not None:
            raise error
        return False

    async def _accompany(self, side: PullService) -> None:
        """Run a companion; if it fails while this service runs on, stop this service too."""
        try:
            async with side:
                await side.run()
        except Exception as exc:
            if not self.stopping:
                log.error(f"{side.kind}.failed", error=repr(exc))
                self.stop()
            raise

    async def retry_later(self, msg: Msg, error: BaseException | str, event: str, *, at_least: float | None = None,
                          **fields: Any) -> float:
        """Nak ``msg`` with this service's backoff for its delivery count; the delay."""
        delivered = msg.metadata.num_delivered
        delay = backoff(delivered, *self.backoff, at_least=at_least)
        self.count("retried")
        log.warning(event, error=str(error) or type(error).__name__, delivery=delivered, retry_in=round(delay, 2),
                    **fields)
        await quietly(msg.nak(delay=delay))
        return delay

    async def _bind(self) -> list[Any]:
        missing = StreamsMissing(
            f"the durable consumer {self.stream}/{self.durable} does not exist. Run `busscrape streams apply` "
            "against the same NATS server first")
        subs = []
        try:
            for _ in range(self.concurrency):
                subs.append(await patiently(lambda: self.bus.js.pull_subscribe_bind(self.durable, self.stream),
                                            what=f"{self.stream}/{self.durable}"))
            await patiently(subs[0].consumer_info, what=f"{self.stream}/{self.durable}")
        except nats.js.errors.NotFoundError:
            raise missing from None
        return subs

    async def _watch_lag(self, every: float = 10.0) -> None:
        """Keep the consumer-lag gauge fresh (the same sum KEDA scales on). Until the service
        stops: the flag too, as a cancel can be lost in the request (``cancelling``)."""
        while not self._stopping.is_set():
            with contextlib.suppress(*TRANSIENT):
                info = await self.bus.js.consumer_info(self.stream, self.durable)
                self.lag = (info.num_pending or 0) + (info.num_ack_pending or 0)
            await asyncio.sleep(every)

    async def _learn_ack_wait(self) -> None:
        info = await patiently(lambda: self.bus.js.consumer_info(self.stream, self.durable),
                               what=f"{self.stream}/{self.durable}")
        ack_wait = info.config.ack_wait or 30.0
        # Heartbeat well inside ack_wait: three beats per window survive one lost beat.
        self.heartbeat_interval = max(ack_wait / 3, 0.2)

    async def _drain(self, slots: dict[asyncio.Task[None], Any]) -> None:
        """Let in-flight work finish within the grace period; cancel (and so nak) the rest."""
        if self._inflight and self._stop_calls == 1:
            await asyncio.wait(set(self._inflight), timeout=self.grace_period)
        # Withdraw this process's waiting pull requests before handing anything back: the
        # server would otherwise redeliver the handed-back messages straight into them, and
        # they would sit here until ack_wait instead of going to another process at once.
        for task, sub in slots.items():
            if task in self._fetching:
                task.cancel()
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        with contextlib.suppress(Exception):
            await self.bus.nc.flush(timeout=2)
        for task in list(self._inflight):
            task.cancel()
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=10)

    async def _watch_idle(self) -> None:
        while not self._stopping.is_set():
            await asyncio.sleep(0.2)
            if self.max_items is not None and self._taken >= self.max_items and not self._inflight:
                log.info(f"{self.kind}.max_items_reached", max_items=self.max_items)
                self.stop()
            elif (self.exit_when_idle is not None and not self._inflight and not self._held
                  and time.monotonic() - self._last_activity >= self.exit_when_idle):
                log.info(f"{self.kind}.idle_exit", idle_seconds=self.exit_when_idle)
                self.stop()

    # -- slots ------------------------------------------------------------------------------

    async def _slot(self, sub: Any) -> None:
        while not self._stopping.is_set():
            if self.max_items is not None and self._taken >= self.max_items:
                return
            if not await self._may_fetch():
                return
            me = asyncio.current_task()
            assert me is not None
            self._fetching.add(me)
            try:
                msgs = await sub.fetch(1, timeout=self.fetch_timeout)
            except (TimeoutError, nats.errors.TimeoutError, nats.js.errors.FetchTimeoutError):
                continue
            except TRANSIENT as exc:
                # NATS is restarting or unreachable: wait and fetch again; nothing is lost.
                log.warning(f"{self.kind}.fetch_failed", error=said(exc))
                await asyncio.sleep(1.0)
                continue
            finally:
                self._fetching.discard(me)
            for msg in msgs:
                if self._stopping.is_set() or (self.max_items is not None and self._taken >= self.max_items):
                    await hand_back(msg)  # fetched as we were stopping: hand it straight back
                    continue
                self._taken += 1
                self._last_activity = time.monotonic()
                task = asyncio.create_task(self._process(msg))
                self._inflight[task] = msg
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    if not task.done():
                        task.cancel()
                        await asyncio.gather(task, return_exceptions=True)
                    raise
                finally:
                    self._inflight.pop(task, None)
                    self._last_activity = max(self._last_activity, time.monotonic())

    async def _process(self, msg: Msg) -> None:
        ended = asyncio.Event()
        beat = asyncio.create_task(self._heartbeat(msg, ended))
        try:
            await self.handle(msg)
        except asyncio.CancelledError:
            # Stopping: hand the message back at once so another process takes it.
            self.count("released")
            await hand_back(msg)
            raise
        except Exception as exc:
            self.count("crashed")
            log.exception(f"{self.kind}.handler_crashed", error=repr(exc), subject=msg.subject)
            await quietly(msg.nak(delay=CRASH_DELAY))
        finally:
            ended.set()
            beat.cancel()

    async def _heartbeat(self, msg: Msg, ended: asyncio.Event) -> None:
        # Until the message is done with: the flag too, as the cancel can be lost in ``quietly``'s
        # wait_for (``cancelling``), and a beat left running would extend a finished message.
        while not ended.is_set():
            await asyncio.sleep(self.heartbeat_interval)
            if not ended.is_set():
                await quietly(msg.in_progress())

    async def _release_prefetched(self, sub: Any) -> None:
        """Nak messages that arrived for an expired fetch after we stopped asking."""
        queue = prefetched(sub)
        while not queue.empty():
            msg = queue.get_nowait()
            if msg.headers and msg.headers.get("Status"):
                continue
            if msg.reply:
                await hand_back(msg)
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def hand_back(msg: Msg) -> None:
    """Return ``msg`` to the queue for another process now (on the way out)."""
    await quietly(msg.nak(delay=HAND_BACK_DELAY))


async def quietly(awaitable: Any) -> None:
    """Ack-family calls during shutdown or reconnects: best effort, the server redelivers anyway."""
    try:
        await asyncio.wait_for(awaitable, 5)
    except TRANSIENT:
        pass
