"""``busscrape dispatch INPUT``: validate, normalise, de-duplicate and queue every URL of a file."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

import typer

from busscrape.cli import options
from busscrape.cli.app import app, err, out, run, settings

if TYPE_CHECKING:
    from rich.progress import Progress
    from rich.table import Table

    from busscrape.dispatch.dispatcher import Dispatcher, DispatchSummary
    from busscrape.dispatch.inputs import Rejection, TaskDefaults
    from busscrape.settings import Settings


HELP = """Validate, normalise and de-duplicate every URL in INPUT, and queue one task per new URL.

INPUT is a file of URLs (one a line; blank lines and # comments skipped), a .jsonl file of task
specs ({"url": ..., "steps": [...], "labels": {...}, "artifacts": [...], any task option}), or -
for stdin; gzipped input works too. The options below apply to every URL of a list and are the
defaults of every JSONL line. A URL dispatched within --recrawl-after is skipped as already seen
(--force queues it regardless). Exit codes: 0 all queued or skipped; 1 rejected lines under
--strict, or failed publishes; 2 cannot connect, streams missing or bad options; 130 interrupted
(the summary is printed anyway; running the same command again finishes the job).
"""


@app.command("dispatch", help=HELP)
@options.task_options
def dispatch_cmd(
    source: str = typer.Argument(..., metavar="INPUT", help="URL list, .jsonl task specs, or - for stdin."),
    progress: bool | None = typer.Option(None, "--progress/--no-progress", help="Live progress bar (default: "
                                         "on a terminal)."),
    nats_url: str | None = typer.Option(None, "--nats-url", help="NATS server URL (default: BUSSCRAPE_NATS__URL)."),
    *,
    task: options.TaskFlags,
) -> None:
    import orjson

    options.check_input(source)
    task.check()
    s = settings(nats={"url": nats_url}, dispatch=task.dispatch_settings())
    task.check_extractor(s, local=False)
    defaults = task.defaults()
    show_progress = err.is_terminal if progress is None else progress
    with task.rejects_file() as rejects_out:
        summary = run(_dispatch(s, defaults, source, task.fmt, task.force, rejects_out, show_progress))
    if task.as_json:
        sys.stdout.write(orjson.dumps(summary.as_dict()).decode() + "\n")
    else:
        out.print(_table(summary))
    raise typer.Exit(summary.exit_code(task.strict))


async def _dispatch(s: Settings, defaults: TaskDefaults, source: str, fmt: Any, force: bool,
                    rejects: IO[bytes] | None, show_progress: bool) -> DispatchSummary:
    import asyncio
    import signal

    import orjson

    from busscrape.bus.connection import Bus
    from busscrape.dispatch.dispatcher import Dispatcher
    from busscrape.telemetry.metrics import configure_tracing

    def rejected(rejection: Rejection) -> None:
        if rejects is not None:
            rejects.write(orjson.dumps(rejection.as_dict()) + b"\n")

    loop = asyncio.get_running_loop()
    configure_tracing("dispatcher")
    async with await Bus.connect(s, name="busscrape-dispatch") as bus:
        async with Dispatcher(bus, s, defaults, force=force, on_rejected=rejected) as dispatcher:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, dispatcher.stop)
            try:
                if not show_progress:
                    return await dispatcher.dispatch(source, fmt)
                with _live(s) as bar:
                    ticker = asyncio.create_task(_tick(bar, dispatcher))
                    try:
                        return await dispatcher.dispatch(source, fmt)
                    finally:
                        ticker.cancel()
                        _show(bar, dispatcher)
            finally:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)


@contextlib.contextmanager
def _live(s: Settings) -> Iterator[Progress]:
    """A progress bar on stderr; log lines (rejections …) scroll above it instead of tearing it."""
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    from busscrape.telemetry import logs

    bar = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[counts]}"), console=err, redirect_stderr=True, transient=False)
    bar.add_task("dispatch", total=None, counts="")
    stderr = sys.stderr
    with bar:
        # structlog holds the stream it was given: hand it rich's redirected stderr while the bar shows.
        logs.configure(s.telemetry.log_format, s.telemetry.log_level)
        try:
            yield bar
        finally:
            logs.configure(s.telemetry.log_format, s.telemetry.log_level, stream=stderr)


async def _tick(bar: Progress, dispatcher: Dispatcher) -> None:
    import asyncio

    previous, last = 0, asyncio.get_running_loop().time()
    while True:
        await asyncio.sleep(0.25)
        now = asyncio.get_running_loop().time()
        rate = (dispatcher.counts.read - previous) / max(now - last, 1e-6)
        previous, last = dispatcher.counts.read, now
        _show(bar, dispatcher, rate)


def _show(bar: Progress, dispatcher: Dispatcher, rate: float | None = None) -> None:
    c, reader = dispatcher.counts, dispatcher.reader
    text = (f"read {c.read:,}  published {c.published:,}  seen {c.already_seen:,}  dup {c.duplicate_in_input:,}  "
            f"invalid {sum(c.invalid.values()):,}" + ("" if rate is None else f"  {rate:,.0f}/s"))
    total = reader.bytes_total if reader is not None else None
    bar.update(bar.task_ids[0], total=total, completed=reader.bytes_read if reader else 0, counts=text)


def _table(summary: DispatchSummary) -> Table:
    from rich.table import Table

    table = Table("", "lines", title="dispatch" + (" (interrupted)" if summary.interrupted else ""),
                  title_justify="left")
    table.add_row("read", f"{summary.read:,}")
    table.add_row("invalid", f"{summary.invalid:,}")
    for reason, count in summary.invalid_by_reason.items():
        table.add_row(f"  {reason}", f"{count:,}")
    table.add_row("duplicate in input", f"{summary.duplicate_in_input:,}")
    table.add_row("already seen", f"{summary.already_seen:,}")
    table.add_row("published", f"{summary.published:,}", style="green" if summary.published else None)
    table.add_row("failed", f"{summary.failed:,}", style="red" if summary.failed else None)
    if summary.unconfirmed:
        table.add_row("unconfirmed", f"{summary.unconfirmed:,}", style="yellow")
    table.caption = f"{summary.seconds:.1f}s, {summary.read / max(summary.seconds, 1e-6):,.0f} lines/s"
    return table
