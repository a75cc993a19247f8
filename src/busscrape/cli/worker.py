"""``busscrape worker``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from busscrape.cli.app import LIFELINE_HELP, app, run, serve, settings

if TYPE_CHECKING:
    pass


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
) -> None:
    """Render tasks from TASKS until stopped (SIGTERM drains, a second one exits now)."""
    from busscrape.bus import names, provision, topology
    from busscrape.bus.connection import Bus
    from busscrape.telemetry.metrics import Telemetry, configure_tracing
    from busscrape.worker.daemon import Worker

    base = settings()
    s = settings(worker={"concurrency": concurrency, "max_tasks": max_tasks, "exit_when_idle": exit_when_idle},
                 nats={"url": nats_url}, network={"allow": [*base.network.allow, *allow]})

    async def go() -> None:
        from busscrape.extract.registry import Registry

        Registry.load(s.extract.dir)  # an invalid extractor file stops the worker before it connects
        async with await Bus.connect(s, name=f"busscrape-worker-{s.worker.name}") as bus:
            await provision.require(bus.js, topology.load(s), names.WORKER_NEEDS)
            configure_tracing("worker")
            await serve(Worker(bus, s, Telemetry("worker")), lifeline)

    run(go())
