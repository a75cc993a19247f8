"""A run and the pages it yields: what ``busscrape run -o``, ``crawl -o`` and the Python API
(``busscrape.run``, ``busscrape.crawl``) share.

``RunSession`` runs a ``Runner`` in a task beside a pump: each task's outcome (the tracker's,
once per task) becomes a ``Page`` read back from the archive, written to the dataset when there
is one (``-o``) and handed to whoever iterates the session. Leaving the session before the run
is over stops the run the way Ctrl-C does (``Runner.stop``: the daemons drain, the embedded
nats-server stops after them) and waits for it, so nothing is left running; a cancellation
while it waits stops it at once (a second ``stop``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from busscrape.dataset.pages import Page, PageFeed
from busscrape.ops.runner import Progress, Runner, RunOptions, RunSummary

if TYPE_CHECKING:
    from collections.abc import Callable

    from busscrape.dataset.writer import DatasetWriter
    from busscrape.settings import Settings
    from busscrape.status.records import TaskStatus


class RunSession:
    """``async with RunSession(settings, options) as session: async for page in session: …``;
    ``await session.finish()`` is the run's summary."""

    def __init__(self, settings: Settings, options: RunOptions, *, progress: Progress | None = None,
                 dead: bool = True, collect: bool = True) -> None:
        self.feed = PageFeed(settings, dead=dead)
        self.writer: DatasetWriter | None = None
        if options.output:
            from busscrape.dataset.writer import DatasetWriter

            self.writer = DatasetWriter(options.output)  # a bad name or no pyarrow: before anything starts
        self.collect = collect
        if collect or self.writer is not None:  # else no page is read back (a plain `busscrape run`)
            options.on_outcome = self._also_feed(options.on_outcome)
        self.runner = Runner(settings, options, progress=progress)
        self._pages: asyncio.Queue[Page | None] = asyncio.Queue()
        self._running: asyncio.Task[RunSummary] | None = None
        self._pumping: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RunSession:
        if self._running is not None:
            raise RuntimeError("a RunSession can be entered only once")
        if self.writer is not None:
            self.writer.__enter__()
        self._running = asyncio.create_task(self._run(), name="busscrape-run")
        self._pumping = asyncio.create_task(self._pump(), name="busscrape-pages")
        return self

    async def _run(self) -> RunSummary:
        try:
            return await self.runner.run()
        finally:
            self.feed.close()

    async def _pump(self) -> None:
        try:
            async for page in self.feed.pages():
                if self.writer is not None:
                    self.writer.write(page)
                if self.collect:
                    self._pages.put_nowait(page)
        finally:
            self._pages.put_nowait(None)

    def _also_feed(self, earlier: Callable[[TaskStatus], None] | None) -> Callable[[TaskStatus], None]:
        """The run's outcome callback: ``earlier``'s (the caller's own), then the page feed's."""
        if earlier is None:
            return self.feed.outcome

        def both(status: TaskStatus) -> None:
            earlier(status)
            self.feed.outcome(status)

        return both

    def __aiter__(self) -> RunSession:
        return self

    async def __anext__(self) -> Page:
        page = await self._pages.get()
        if page is None:
            self._pages.put_nowait(None)  # iterating again ends at once too
            raise StopAsyncIteration
        return page

    async def finish(self) -> RunSummary:
        """Wait for the end of the run (every page pumped); its summary (or what stopped it)."""
        assert self._running is not None and self._pumping is not None
        await asyncio.wait({self._running, self._pumping})
        summary = self._running.result()
        self._pumping.result()
        return summary

    @property
    def started(self) -> bool:
        return self._running is not None

    @property
    def result(self) -> RunSummary | None:
        """The run's summary once it has ended (None before, and when it failed)."""
        running = self._running
        if running is None or not running.done() or running.cancelled() or running.exception() is not None:
            return None
        return running.result()

    async def __aexit__(self, *exc: Any) -> None:
        assert self._running is not None
        if not self._running.done():
            self.runner.stop()
        try:
            try:
                await asyncio.shield(asyncio.wait({self._running, *([self._pumping] if self._pumping else [])}))
            except asyncio.CancelledError:
                self.runner.stop()  # cancelled while stopping: the second stop is at once
                await asyncio.wait({self._running})
                raise
        finally:
            if self.writer is not None:
                self.writer.close(complete=self.result is not None and not self.result.interrupted)
