"""``busscrape dispatch INPUT``: validate, normalise, de-duplicate and queue every URL of a file."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
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
def dispatch_cmd(
    source: str = typer.Argument(..., metavar="INPUT", help="URL list, .jsonl task specs, or - for stdin."),
    fmt: str = typer.Option("auto", "--format", help="auto (by file name: *.jsonl is JSONL), urls or jsonl."),
    steps: str | None = typer.Option(None, "--steps", help="JSON array of steps for every task, or @FILE."),
    artifacts: str | None = typer.Option(None, "--artifacts", help="Comma list of html,screenshot,har,text,warc."),
    label: list[str] = typer.Option([], "--label", metavar="K=V", help="A label on every task. Repeatable."),
    screenshot_format: str | None = typer.Option(None, "--screenshot-format", help="png or jpeg."),
    jpeg_quality: int | None = typer.Option(None, "--jpeg-quality", help="1-100, with jpeg screenshots."),
    full_page: bool | None = typer.Option(None, "--full-page/--no-full-page", help="Whole-page screenshot."),
    har_content: str | None = typer.Option(None, "--har-content", help="omit or embed response bodies."),
    wait_until: str | None = typer.Option(None, "--wait-until", help="load, domcontentloaded, networkidle, commit."),
    timeout: str | None = typer.Option(None, "--timeout", help="Navigation timeout of every task (30s, 1m)."),
    viewport: str | None = typer.Option(None, "--viewport", metavar="WxH", help="Viewport, e.g. 1280x800."),
    block: str | None = typer.Option(None, "--block", help="Comma list of image,media,font,stylesheet."),
    user_agent: str | None = typer.Option(None, "--user-agent", help="User-Agent of every task."),
    header: list[str] = typer.Option([], "--header", metavar="'NAME: VALUE'", help="Request header. Repeatable."),
    recrawl_after: str | None = typer.Option(None, "--recrawl-after", help="Skip URLs dispatched within this "
                                             "(default BUSSCRAPE_DISPATCH__RECRAWL_AFTER, 7d)."),
    force: bool = typer.Option(False, "--force", help="Queue every URL even if it was seen within --recrawl-after."),
    strip_tracking: bool | None = typer.Option(None, "--strip-tracking/--keep-tracking",
                                               help="Drop utm_*, fbclid … before de-duplication."),
    sort_query: bool | None = typer.Option(None, "--sort-query/--keep-query-order", help="Sort query parameters."),
    max_url_length: int | None = typer.Option(None, "--max-url-length", help="Reject longer URLs."),
    window: int | None = typer.Option(None, "--window", help="Publishes in flight before waiting for PubAcks."),
    rejects: Path | None = typer.Option(None, "--rejects", metavar="FILE", help="Also write rejected lines "
                                        "here, as JSONL."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 if any line was rejected."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object."),
    progress: bool | None = typer.Option(None, "--progress/--no-progress", help="Live progress bar (default: "
                                         "on a terminal)."),
    nats_url: str | None = typer.Option(None, "--nats-url", help="NATS server URL (default: BUSSCRAPE_NATS__URL)."),
) -> None:
    import orjson

    if fmt not in ("auto", "urls", "jsonl"):
        options.usage(f"--format must be auto, urls or jsonl, not {fmt!r}")
    s = settings(nats={"url": nats_url}, dispatch={
        "recrawl_after": recrawl_after, "strip_tracking": strip_tracking, "sort_query": sort_query,
        "max_url_length": max_url_length, "window": window,
    })
    defaults = options.task_defaults(
        steps=steps, artifacts=artifacts, label=label, screenshot_format=screenshot_format, jpeg_quality=jpeg_quality,
        full_page=full_page, har_content=har_content, wait_until=wait_until, timeout=timeout, viewport=viewport,
        block=block, user_agent=user_agent, header=header)
    show_progress = err.is_terminal if progress is None else progress
    with _rejects_file(rejects) as rejects_out:
        summary = run(_dispatch(s, defaults, source, fmt, force, rejects_out, show_progress))
    if as_json:
        sys.stdout.write(orjson.dumps(summary.as_dict()).decode() + "\n")
    else:
        out.print(_table(summary))
    raise typer.Exit(summary.exit_code(strict))


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


@contextlib.contextmanager
def _rejects_file(path: Path | None) -> Iterator[IO[bytes] | None]:
    if path is None:
        yield None
        return
    try:
        handle = open(path, "wb")  # closed by the with below
    except OSError as exc:
        options.usage(f"--rejects {path}: {exc.strerror or exc}")
    with handle:
        yield handle
