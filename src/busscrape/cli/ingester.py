"""``busscrape ingester``: archive results (and dead letters) until stopped."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import typer

from busscrape.cli.app import ARCHIVE_HELP, LIFELINE_HELP, WAIT_STREAMS_HELP, app, archive_section, run, serve, settings
from busscrape.errors import EXIT_OK, EXIT_PARTIAL

if TYPE_CHECKING:
    from busscrape.settings import Settings


@app.command("ingester")
def ingester_cmd(
    concurrency: int | None = typer.Option(None, "--concurrency", min=1,
                                           help="Results archived at once (default: BUSSCRAPE_INGESTER__CONCURRENCY)."),
    max_results: int | None = typer.Option(None, "--max-results", min=1, help="Exit after this many results."),
    exit_when_idle: str | None = typer.Option(None, "--exit-when-idle", metavar="SECONDS",
                                              help="Exit when no result arrived for this long (30, 30s, 5m)."),
    archive: str | None = typer.Option(None, "--archive", metavar="WHERE", help=ARCHIVE_HELP),
    nats_url: str | None = typer.Option(None, "--nats-url", help="NATS server URL (default: BUSSCRAPE_NATS__URL)."),
    lifeline: int | None = typer.Option(None, "--lifeline", hidden=True, help=LIFELINE_HELP),
    wait_streams: float | None = typer.Option(None, "--wait-streams", hidden=True, help=WAIT_STREAMS_HELP),
) -> None:
    """Archive every result from RESULTS into S3 (or a local folder), and every dead letter.

    Runs until SIGTERM/SIGINT: the first drains (in-flight results finish within the grace
    period), the second stops now. Exit code 1 when a result was dead-lettered in a bounded run.
    """
    import structlog

    s = settings(nats={"url": nats_url}, archive=archive_section(archive),
                 ingester={"concurrency": concurrency, "max_results": max_results, "exit_when_idle": exit_when_idle})
    counters = run(ingest(s, archive=archive, lifeline=lifeline, wait_streams=wait_streams or 0.0))
    structlog.get_logger("busscrape.cli").info("ingester.summary", **dict(sorted(counters.items())))
    bounded = max_results is not None or exit_when_idle is not None
    gave_up = counters["dead_lettered"] + counters["malformed"]
    raise typer.Exit(EXIT_PARTIAL if bounded and gave_up else EXIT_OK)


async def ingest(s: Settings, *, archive: str | None = None, lifeline: int | None = None,
                 wait_streams: float = 0.0) -> Counter[str]:
    """Connect, open the storage (checked and created at start), run an ingester until it stops
    (with ``wait_streams``, after waiting up to that long for the streams it needs)."""
    import structlog

    from busscrape.archive.storage import open_storage
    from busscrape.bus import names, provision, topology
    from busscrape.bus.connection import Bus
    from busscrape.ingest.daemon import Ingester
    from busscrape.telemetry.metrics import Telemetry, configure_tracing

    storage = open_storage(s, archive)
    async with await Bus.connect(s, name=f"busscrape-ingester-{s.ingester.name}") as bus, storage:
        if wait_streams:
            await provision.require(bus.js, topology.load(s), names.REQUIRED, wait=wait_streams)
        structlog.get_logger("busscrape.cli").info("ingester.archive", storage=storage.url, prefix=s.archive.prefix,
                                                   compress=s.archive.compress)
        configure_tracing("ingester")
        telemetry = Telemetry.of_daemon("ingester", s.telemetry)
        outcomes: Counter[str] = await serve(Ingester(bus, storage, s, telemetry), lifeline)
        return outcomes
