"""``busscrape run``: the whole pipeline from one command.

Without ``BUSSCRAPE_NATS__URL`` it starts an embedded nats-server (data in
``<state_dir>/nats``), applies the streams, starts worker and ingester processes, dispatches
the input, follows every task through the STATUS bucket until it is archived or dead, stops
everything and returns a summary. With a URL it uses that server, only dispatches and waits
(the daemons run elsewhere), unless ``with_daemons`` asks for local ones too.

Stopping (Ctrl-C) ends dispatching, stops the daemons gracefully (tasks in flight go back to
the queue) and returns what is known; running the same input again resumes: tasks already
queued are not queued twice, and the run waits for them too.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import re
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog

from busscrape.errors import EXIT_AUTH, EXIT_CONFIG, ConfigurationError
from busscrape.ops.lifeline import PidFiles
from busscrape.ops.nats_server import EmbeddedNatsServer, free_port
from busscrape.ops.state_dir import require_writable
from busscrape.ops.supervisor import Daemons
from busscrape.settings import Settings

if TYPE_CHECKING:
    from busscrape.bus.connection import Bus
    from busscrape.crawl.progress import CrawlSummary
    from busscrape.crawl.spec import CrawlSpec
    from busscrape.dispatch.dispatcher import Dispatcher, DispatchSummary
    from busscrape.dispatch.inputs import InputFormat, Rejection, Source, TaskDefaults
    from busscrape.status.records import TaskStatus
    from busscrape.status.tracker import Tracker

# What a run needs once its daemons are spawned: the NATS client, the dispatcher, the tracker.
# Imported then, beside the embedded server's start (a third of a second and more of a run's
# first second), not before the daemons it would hold back (``Runner._embedded``).
AFTER_SPAWN = ("busscrape.bus.connection", "busscrape.bus.provision", "busscrape.bus.topology",
               "busscrape.dispatch.dispatcher", "busscrape.status.tracker")

log = structlog.get_logger("busscrape.run")

# `run` was given a server: the generic "use `busscrape run`" would send the user where they are.
RUN_HINT = ("Start that server or fix the URL (--nats-url, BUSSCRAPE_NATS__URL); without one, `busscrape run` "
            "starts an embedded nats-server itself")
LETTERS_TIMEOUT = 60.0  # seconds a finished run waits for its dead letters to reach the archive
NATS_PID = "nats-server"  # the embedded server's pid file
STREAMS_WAIT = 60.0  # seconds the daemons of a run wait for the streams the run is applying


@dataclass
class RunOptions:
    source: Source
    workers: int = field(default_factory=lambda: max(1, (os.cpu_count() or 2) // 2))
    with_daemons: bool = False
    defaults: TaskDefaults = field(default_factory=lambda: _task_defaults())
    force: bool = False
    fmt: InputFormat = "auto"
    on_rejected: Callable[[Rejection], None] | None = None
    """Called with each rejected input line (``--rejects`` writes them)."""
    crawl: CrawlSpec | None = None
    """Crawl from these rules instead of dispatching ``source`` (``busscrape crawl``)."""
    on_outcome: Callable[[TaskStatus], None] | None = None
    """Called with each task's outcome, once (``-o``, the Python API: ``dataset.pages``)."""
    output: str | None = None
    """``-o FILE``: where the run's dataset goes (``dataset.writer``)."""


@dataclass
class RunSummary:
    dispatch: DispatchSummary | None
    tasks: int
    outcomes: Counter[str]
    dead_reasons: Counter[str]
    seconds: float
    archive: str
    interrupted: bool = False
    failed_daemons: list[str] = field(default_factory=list)
    locations: list[str] = field(default_factory=list)
    """Where each archived task of this run is (folder URIs)."""
    letters_unarchived: int = 0
    """Dead letters still waiting to be copied into the archive when the run gave up waiting."""
    earlier: Counter[str] = field(default_factory=Counter)
    """Outcomes among ``outcomes`` recorded before this run began (a re-run of the same input
    finds its tasks already seen, and most of them already archived)."""
    crawl: CrawlSummary | None = None
    """What the crawl's links became (``busscrape crawl``)."""
    failure: tuple[int, str] | None = None
    """Why the run stopped before the end (exit code, message): a local daemon exited with a
    configuration error, or no local worker is left alive."""

    @property
    def archived_now(self) -> int:
        """Tasks this run archived (what its rate counts)."""
        return self.archived - self.earlier.get("archived", 0)

    @property
    def archived(self) -> int:
        return self.outcomes.get("archived", 0)

    @property
    def dead(self) -> int:
        return self.outcomes.get("dead", 0)

    @property
    def unfinished(self) -> int:
        return self.tasks - self.archived - self.dead

    @property
    def complete(self) -> bool:
        """Every task archived or dead-lettered, and every dead letter in the archive too."""
        return not self.unfinished and not self.letters_unarchived


Progress = Callable[[Counter[str], "DispatchSummary | None", float], None]


def _task_defaults() -> TaskDefaults:
    from busscrape.dispatch.inputs import TaskDefaults

    return TaskDefaults()


def _import_after_spawn() -> None:
    for module in AFTER_SPAWN:
        importlib.import_module(module)


_FOLDER = re.compile(r"/dt=[^/]+/host=[^/]+/[^/]+/?$")


def archive_root(locations: list[str]) -> str:
    """The archive the ingesters wrote to, from the folders they recorded (``file:///a/dt=…/host=…/id``
    → ``/a``); a placeholder when none was recorded (nothing archived yet)."""
    roots = sorted({_FOLDER.sub("", loc).removeprefix("file://") for loc in locations if _FOLDER.search(loc)})
    if not roots:
        return "(where the ingesters archive: nothing was archived in this run)"
    return ", ".join(roots)


class Runner:
    """One run. ``stop()`` once ends it gracefully (second call: at once)."""

    def __init__(self, settings: Settings, options: RunOptions, progress: Progress | None = None) -> None:
        self.settings = settings
        self.options = options
        self.progress = progress
        self._stop = asyncio.Event()
        self._stops = 0
        self._dispatcher: Dispatcher | None = None
        self.rejections: list[Rejection] = []
        self._crawls: dict[str, Any] = {}
        """crawl id -> its ``CrawlWatch``: crawls that lines of the input started (``crawl`` blocks)."""
        self.pids = PidFiles(settings.state_dir)
        self.failure: tuple[int, str] | None = None

    def _fleet_failed(self, code: int, message: str) -> None:
        """The local daemons cannot do the work (``Daemons.on_fatal``): stop now, not wait forever.
        With a NATS URL a fleet elsewhere may still work: local workers all gone is a warning there."""
        if self.settings.nats.url and code not in (EXIT_CONFIG, EXIT_AUTH):
            log.warning("run.local_workers_gone", error=message)
            return
        log.error("run.fleet_failed", code=code, error=message)
        self.failure = (code, message)
        self._stops += 1  # no grace: nothing is rendering, or nothing can
        self.stop()

    def stop(self) -> None:
        self._stops += 1
        self._stop.set()
        if self._dispatcher is not None:
            self._dispatcher.stop()

    def archive_location(self) -> str:
        from busscrape.archive.storage import location_of

        s = self.settings
        where = location_of(s)
        if "://" in where:
            return f"{where.rstrip('/')}/{s.archive.prefix}".rstrip("/")
        return str((s.archive_dir() / s.archive.prefix).resolve())

    async def run(self) -> RunSummary:
        started, began = time.monotonic(), datetime.now(UTC)
        from busscrape.extract.registry import Registry

        async with AsyncExitStack() as stack:
            settings = self.settings
            embedded = not settings.nats.url
            if embedded or self.options.with_daemons:
                require_writable(settings)
                # What a run that was killed left on this state dir (its run gone) goes first.
                for name in await asyncio.to_thread(self.pids.stop_leftovers):
                    log.warning("run.leftover_stopped", name=name)
            daemons = None
            if embedded:
                settings, daemons = await self._embedded(stack, settings)
            else:
                await asyncio.to_thread(_import_after_spawn)
            # An invalid extractor file stops the run before it dispatches anything (the daemons
            # just spawned stop with it; each would refuse the file too).
            Registry.with_bundled(self.settings.extract.dir)
            from busscrape.bus import names, provision, topology
            from busscrape.bus.connection import Bus
            from busscrape.status.tracker import Tracker

            bus = await stack.enter_async_context(await Bus.connect(settings, name="busscrape-run", hint=RUN_HINT))
            definitions = topology.load(settings)
            if embedded:
                await provision.apply(bus.js, definitions)
                if self.pids.left:  # an earlier run on this state dir was killed: its tasks in flight
                    from busscrape.ops.in_flight import reclaim

                    await reclaim(bus)
            else:
                await provision.require(bus.js, definitions, names.REQUIRED)
            log.info("run.streams_applied")
            tracker = Tracker(bus.js)
            if self.options.on_outcome is not None:
                tracker.listeners.append(self.options.on_outcome)
            await tracker.start()
            stack.push_async_callback(tracker.stop)
            if daemons is None and self.options.with_daemons:
                daemons = Daemons(settings, workers=self.options.workers, on_fatal=self._fleet_failed)
                await stack.enter_async_context(daemons)
            crawl = None
            if self.options.crawl is not None:
                from busscrape.crawl.run import crawl_until_done

                summary = None
                crawl = await crawl_until_done(bus, settings, self.options.crawl, tracker, self._stop,
                                               lambda: self._report(tracker, None, time.monotonic() - started))
            else:
                summary = await self._dispatch(bus, settings, tracker)
                await self._wait(tracker, summary, started)
            unfiled = await self._letters_archived(bus, tracker) if not self._stop.is_set() else 0
            if daemons is not None:
                # Done: the daemons are idle and exit at once. Interrupted: a few seconds for
                # renders about to finish, then in-flight tasks go back to the queue.
                await daemons.stop(grace=(0.5 if self._stops > 1 else 5.0) if self._stop.is_set() else 10.0)
            counts = tracker.counts()
            reasons = Counter(s.reason or "unknown" for s in tracker.final.values() if s.state == "dead")
            locations = sorted(s.archive for s in tracker.final.values() if s.archive)
            earlier: Counter[str] = Counter(s.state for s in tracker.final.values() if s.at < began)
            # Daemons elsewhere archive where *they* are configured: say what their records say.
            archive = self.archive_location() if daemons is not None else archive_root(locations)
            return RunSummary(dispatch=summary, tasks=len(tracker.expected), outcomes=counts, dead_reasons=reasons,
                              seconds=time.monotonic() - started, archive=archive,
                              interrupted=self._stop.is_set() and self.failure is None, failure=self.failure,
                              failed_daemons=daemons.failed() if daemons else [], letters_unarchived=unfiled,
                              locations=locations, earlier=earlier, crawl=crawl)

    async def _embedded(self, stack: AsyncExitStack, settings: Settings) -> tuple[Settings, Daemons]:
        """The embedded nats-server and the local daemons, started side by side: the daemons'
        start (Python, Chromium) is the longest part of a run's first second, so they are
        spawned first, on the port the server is about to listen on, and wait for the streams
        (``--wait-streams``) while the server starts and the run applies them."""
        for attempt in (1, 2):
            # The second time, should another process have taken the chosen port in between:
            # the server picks its own, and the daemons start after it.
            early = attempt == 1
            server = EmbeddedNatsServer(settings.state_dir / "nats", binary=settings.nats.server_binary,
                                        die_with_parent=True, port=free_port("127.0.0.1") if early else None,
                                        memory=settings.nats.server_memory)
            # Registered before the daemons: the server stops after them (they drain through it).
            stack.callback(self.pids.remove, NATS_PID)
            stack.callback(server.stop)
            daemons = None
            if early:
                # They may try before the server listens: give their first connection as long as
                # the server has to become ready (a refused one would be a configuration error).
                patient = max(settings.nats.connect_timeout, server.ready_timeout)
                daemons = Daemons(settings.with_overrides(nats={"url": server.url, "connect_timeout": patient}),
                                  workers=self.options.workers, wait_streams=STREAMS_WAIT, on_fatal=self._fleet_failed)
                await stack.enter_async_context(daemons)
            importing = asyncio.ensure_future(asyncio.to_thread(_import_after_spawn)) if early else None
            try:
                # Started from this (the loop's) thread: its parent-death signal follows the forking
                # thread. It blocks the loop until the server answers; the imports go on in their thread.
                server.start()
            except ConfigurationError as exc:
                if not early:
                    raise
                log.warning("run.embedded_nats_retry", port=server.port, error=str(exc).splitlines()[0])
                assert daemons is not None
                await daemons.stop(grace=0.5)
                continue
            assert server.process is not None
            self.pids.record(NATS_PID, server.process.pid)
            settings = settings.with_overrides(nats={"url": server.url})
            log.info("run.embedded_nats", url=server.url, store=str(server.store_dir))
            if daemons is None:
                daemons = Daemons(settings, workers=self.options.workers, wait_streams=STREAMS_WAIT,
                                  on_fatal=self._fleet_failed)
                await stack.enter_async_context(daemons)
            await (importing or asyncio.to_thread(_import_after_spawn))
            return settings, daemons
        raise AssertionError("unreachable")

    async def _dispatch(self, bus: Bus, settings: Settings, tracker: Tracker) -> DispatchSummary:
        from busscrape.dispatch.dispatcher import Dispatcher

        since = datetime.now(UTC)
        self._dispatcher = Dispatcher(
            bus, settings, self.options.defaults, force=self.options.force,
            on_published=lambda task_id: tracker.expect(task_id, since),
            on_already_seen=tracker.expect_existing,
            on_rejected=self._rejected,
            on_crawl=lambda crawl_id: self._crawls.setdefault(crawl_id, asyncio.ensure_future(
                self._watch_crawl(bus, tracker, crawl_id))),
        )
        async with self._dispatcher as dispatcher:
            if self._stop.is_set():
                dispatcher.stop()
            dispatching = asyncio.create_task(dispatcher.dispatch(self.options.source, self.options.fmt))
            while not dispatching.done():
                await asyncio.wait({dispatching}, timeout=0.5)
                self._report(tracker, dispatcher.summary(), 0.0)
            return dispatching.result()

    async def _watch_crawl(self, bus: Bus, tracker: Tracker, crawl_id: str) -> Any:
        from busscrape.crawl.progress import CrawlWatch
        from busscrape.crawl.state import CrawlState

        watch = CrawlWatch(CrawlState(bus.js), tracker, crawl_id)
        await watch.start()
        return watch

    async def _crawls_done(self) -> bool:
        """Every crawl the input started has followed all its pages (``crawl.progress``)."""
        for started in self._crawls.values():
            if not started.done() or not started.result().done:
                return False
        return True

    def _rejected(self, rejection: Rejection) -> None:
        self.rejections.append(rejection)
        if self.options.on_rejected is not None:
            self.options.on_rejected(rejection)

    async def _letters_archived(self, bus: Bus, tracker: Tracker, timeout: float = LETTERS_TIMEOUT) -> int:
        """Wait until every dead letter is in the archive too (the ``dead`` record comes before the
        archivist copies the letter), so that what the summary counts is there when the run ends.
        The letters still waiting when ``timeout`` runs out."""
        if not any(status.state == "dead" for status in tracker.final.values()):
            return 0
        from busscrape.bus import names
        from busscrape.bus.retry import TRANSIENT

        deadline = time.monotonic() + timeout
        waiting = -1
        while time.monotonic() < deadline and not self._stop.is_set():
            try:
                info = await bus.js.consumer_info(names.DEADLETTER_STREAM, names.ARCHIVIST_CONSUMER)
            except TRANSIENT:
                await asyncio.sleep(0.5)
                continue
            waiting = (info.num_pending or 0) + (info.num_ack_pending or 0)
            if waiting == 0:
                return 0
            await asyncio.sleep(0.2)
        log.warning("run.letters_unarchived", letters=waiting)
        return max(waiting, 0)

    async def _wait(self, tracker: Tracker, summary: DispatchSummary, started: float) -> None:
        try:
            while not (tracker.done and await self._crawls_done()) and not self._stop.is_set():
                await tracker.changed(timeout=0.5)
                self._report(tracker, summary, time.monotonic() - started)
            self._report(tracker, summary, time.monotonic() - started)
        finally:
            for started_watch in self._crawls.values():
                if started_watch.done() and not started_watch.cancelled():
                    await started_watch.result().stop()
                else:
                    started_watch.cancel()

    def _report(self, tracker: Tracker, summary: DispatchSummary | None, elapsed: float) -> None:
        if self.progress is not None:
            self.progress(tracker.counts(), summary, elapsed)
