"""``busscrape worker``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from busscrape.cli.app import LIFELINE_HELP, WAIT_STREAMS_HELP, app, run, serve, settings

if TYPE_CHECKING:
    from busscrape.settings import Settings


@app.command("worker")
def worker_cmd(
    concurrency: int | None = typer.Option(None, "--concurrency", "-c", help="Pages rendering at once."),
    max_tasks: int | None = typer.Option(None, "--max-tasks", help="Exit after this many tasks."),
    exit_when_idle: str | None = typer.Option(None, "--exit-when-idle", metavar="DURATION",
                                              help="Exit after this long without a task (e.g. 30s)."),
    allow: list[str] = typer.Option([], "--allow", metavar="CIDR|HOST:PORT",
                                    help="Open a non-public address to pages (repeatable; adds to "
                                         "BUSSCRAPE_NETWORK__ALLOW)."),
    nats_url: str | None = typer.Option(None, "--nats-url", help="NATS server URL."),
    lifeline: int | None = typer.Option(None, "--lifeline", hidden=True, help=LIFELINE_HELP),
    wait_streams: float | None = typer.Option(None, "--wait-streams", hidden=True, help=WAIT_STREAMS_HELP),
) -> None:
    """Render tasks from TASKS until stopped (SIGTERM drains, a second one exits now)."""

    async def go() -> None:
        import asyncio
        import importlib

        from busscrape.worker.browser.driver import start_driver, stop_driver

        # Playwright's driver first: it boots in its own process while the settings are built here.
        driver = start_driver()
        browser = None
        try:
            base = await asyncio.to_thread(settings)
            s = settings(worker={"concurrency": concurrency, "max_tasks": max_tasks, "exit_when_idle": exit_when_idle},
                         nats={"url": nats_url}, network={"allow": [*base.network.allow, *allow]})

            import structlog

            from busscrape.worker.startup import BrowserStart

            structlog.get_logger("busscrape.worker").info("worker.starting")
            # Chromium next: it is the slow part of a worker's start and needs no NATS. The rest of
            # the worker is imported in a thread meanwhile, so the loop keeps driving the launch.
            browser = BrowserStart(s, driver=driver).begin()
            # An invalid extractor file still stops the worker before it connects (and its browser).
            await asyncio.to_thread(_read_extractors, s)
            await asyncio.to_thread(importlib.import_module, "busscrape.worker.daemon")
            from busscrape.bus import names, provision, topology
            from busscrape.bus.connection import Bus
            from busscrape.telemetry.metrics import Telemetry, configure_tracing
            from busscrape.worker.daemon import Worker

            async with await Bus.connect(s, name=f"busscrape-worker-{s.worker.name}") as bus:
                # Waiting: everything the run applies (whatever the worker's companions touch first).
                needs = names.REQUIRED if wait_streams else names.WORKER_NEEDS
                await provision.require(bus.js, topology.load(s), needs, wait=wait_streams or 0.0)
                configure_tracing("worker")
                await serve(Worker(bus, s, Telemetry.of_daemon("worker", s.telemetry), browser=browser), lifeline)
        finally:
            if browser is not None:
                await browser.close()
            await stop_driver(driver)

    run(go())


def _read_extractors(s: Settings) -> None:
    from busscrape.extract.registry import Registry

    Registry.with_bundled(s.extract.dir)
