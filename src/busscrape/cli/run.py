"""``busscrape run INPUT`` (and the display shared with ``busscrape demo``)."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from busscrape.cli import options
from busscrape.cli.app import ARCHIVE_HELP, app, archive_section, err, out, run, settings
from busscrape.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_PARTIAL

if TYPE_CHECKING:
    from rich.table import Table

    from busscrape.dispatch.dispatcher import DispatchSummary
    from busscrape.dispatch.inputs import Rejection
    from busscrape.ops.runner import RunOptions, RunSummary
    from busscrape.settings import Settings


HELP = """Run the whole pipeline on INPUT and wait until every task is archived or dead-lettered.

Without BUSSCRAPE_NATS__URL it starts an embedded nats-server (data in BUSSCRAPE_STATE_DIR,
default .busscrape/), applies the streams, starts worker processes and an ingester, dispatches
INPUT, shows progress and prints a summary with where the archive is. With a NATS URL it only
dispatches and waits (the daemons run elsewhere) unless --with-daemons is given. Ctrl-C stops
cleanly (tasks in flight go back to the queue); running the same command again resumes.
Exit codes: 0 every task archived or dead-lettered; 1 some input rejected under --strict, some
publishes failed, or tasks left unfinished; 2 configuration; 130 interrupted.
"""


@app.command("run", help=HELP)
@options.task_options
def run_cmd(
    source: str = typer.Argument(..., metavar="INPUT", help="URL list, .jsonl task specs, or - for stdin."),
    workers: int | None = typer.Option(None, "--workers", "-w", help="Worker processes (default: cores / 2)."),
    concurrency: int | None = typer.Option(None, "--concurrency", "-c", help="Pages at once per worker."),
    archive: str | None = typer.Option(None, "--archive", metavar="WHERE", help=ARCHIVE_HELP),
    with_daemons: bool = typer.Option(False, "--with-daemons", help="With a NATS URL: run local daemons too."),
    allow: list[str] = typer.Option([], "--allow", metavar="CIDR|HOST:PORT",
                                    help="Open a non-public address to pages (repeatable)."),
    nats_url: str | None = typer.Option(None, "--nats-url", help="Use this NATS server instead of an embedded one."),
    wacz: str | None = typer.Option(None, "--wacz", metavar="NAME",
                                    help="Then package the run's WARCs as wacz/NAME.wacz (see busscrape wacz)."),
    output: str | None = options.OUTPUT,
    config: str | None = options.CONFIG,
    *,
    task: options.TaskFlags,
) -> None:
    import orjson

    from busscrape.ops.runner import RunOptions

    options.check_input(source)
    options.check_output(output)
    task.check()
    base = settings()
    s = settings(nats={"url": nats_url}, worker={"concurrency": concurrency}, telemetry={"log_level": quiet_logs()},
                 archive=archive_section(archive), dispatch=task.dispatch_settings(),
                 network={"allow": [*base.network.allow, *allow]})
    task.check_extractor(s, local=not s.nats.url or with_daemons)
    with task.rejects_file() as rejects_out:
        def rejected(rejection: Rejection) -> None:
            if rejects_out is not None:
                rejects_out.write(orjson.dumps(rejection.as_dict()) + b"\n")

        opts = RunOptions(source=source, defaults=task.defaults(), force=task.force, with_daemons=with_daemons,
                          fmt=task.fmt, on_rejected=rejected)
        opts.output = output
        if workers:
            opts.workers = workers
        summary = run(execute(s, opts))
    show_outcome(s, summary, as_json=task.as_json, wacz=wacz, archive=archive, stdout_taken=output == "-")
    raise typer.Exit(exit_code(summary, task.strict))


def show_outcome(s: Settings, summary: RunSummary, *, as_json: bool, wacz: str | None, archive: str | None,
                 tables: tuple[object, ...] = (), stdout_taken: bool = False) -> None:
    """How ``run`` and ``crawl`` end: the run's pages packed as a WACZ when asked, then the summary
    as one JSON object (with the crawl's and the WACZ's) or as ``tables`` + the run's table and
    where to look. With ``stdout_taken`` (``-o -``: the dataset is standard output) all of it goes
    to standard error."""
    import orjson

    console = err if stdout_taken else out

    if summary.failure is not None:
        err.print(f"error: {summary.failure[1]}", soft_wrap=True, markup=False, highlight=False)
    packed = None
    if wacz and summary.failure is None:
        from busscrape.cli.wacz import package

        packed = run(package(s, wacz, locations=summary.locations, archive=archive))
    if as_json:
        doc = summary_dict(summary)
        if summary.crawl is not None:
            doc["crawl"] = summary.crawl.as_dict()
        if packed is not None:
            doc["wacz"] = {"key": packed.key, "pages": packed.pages, "bytes": packed.size}
        (sys.stderr if stdout_taken else sys.stdout).write(orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS).decode()
                                                           + "\n")
        return
    for table in tables:
        console.print(table)
    console.print(summary_table(summary))
    console.print(how_to_look(summary, s), soft_wrap=True)
    if packed is not None:
        from busscrape.cli.wacz import report

        report(packed)


def summary_dict(summary: RunSummary) -> dict[str, object]:
    """``run --json``: the summary as one JSON object."""
    return {"tasks": summary.tasks, "archived": summary.archived, "dead": summary.dead,
            "earlier": dict(summary.earlier), "archived_now": summary.archived_now,
            "dead_by_reason": dict(summary.dead_reasons), "unfinished": summary.unfinished,
            "letters_unarchived": summary.letters_unarchived, "interrupted": summary.interrupted,
            "seconds": round(summary.seconds, 3), "archive": summary.archive, "failed_daemons": summary.failed_daemons,
            "error": summary.failure[1] if summary.failure is not None else None,
            "dispatch": summary.dispatch.as_dict() if summary.dispatch is not None else None}


def quiet_logs() -> str | None:
    """Warnings only from the run itself (the daemons log to their files), unless asked otherwise."""
    return None if os.environ.get("BUSSCRAPE_TELEMETRY__LOG_LEVEL") else "warning"


def execute(s: Settings, opts: RunOptions) -> Coroutine[Any, Any, RunSummary]:
    """Run with live progress and Ctrl-C handling (first: stop cleanly, second: at once). Called
    by the Python API (``cli.embedding``), it hands the settings and options over instead."""
    from busscrape.cli import embedding

    embedding.hand_over(s, opts)
    return _execute(s, opts)


async def _execute(s: Settings, opts: RunOptions) -> RunSummary:
    import asyncio
    import signal

    from busscrape.ops.session import RunSession

    display = ProgressDisplay()
    session = RunSession(s, opts, progress=display.update, collect=False)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, session.runner.stop)
    try:
        with display:
            async with session:
                return await session.finish()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


class ProgressDisplay:
    """One live line on a terminal; otherwise a plain line every few seconds."""

    def __init__(self) -> None:
        from rich.live import Live
        from rich.text import Text

        self.live = Live(Text("starting…"), console=err, refresh_per_second=4, transient=False) \
            if err.is_terminal else None
        self._last_print = 0.0
        self._archived: list[tuple[float, int]] = []

    def __enter__(self) -> ProgressDisplay:
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live:
            self.live.__exit__(*exc)

    def update(self, counts: Counter[str], dispatch: DispatchSummary | None, elapsed: float) -> None:
        from rich.text import Text

        now = time.monotonic()
        archived = counts.get("archived", 0)
        self._archived = [(t, n) for t, n in self._archived if now - t <= 10] + [(now, archived)]
        first_t, first_n = self._archived[0]
        rate = (archived - first_n) / (now - first_t) if now > first_t else 0.0
        # A crawl dispatches nothing itself: its pages are queued by the frontier.
        dispatched = f"dispatched {dispatch.published + dispatch.already_seen:,} · " if dispatch else ""
        line = (f"{dispatched}queued {counts.get('queued', 0):,} · rendering "
                f"{counts.get('running', 0) + counts.get('retrying', 0):,} · results {counts.get('rendered', 0):,} · "
                f"archived {archived:,} · dead {counts.get('dead', 0):,} · {rate:.1f} pages/s · {elapsed:.0f}s")
        if self.live:
            self.live.update(Text(line))
        elif now - self._last_print >= 5:
            self._last_print = now
            err.print(line)


def summary_table(summary: RunSummary) -> Table:
    from rich.table import Table

    title = "run" + (" (interrupted: run the same command again to resume)" if summary.interrupted else "")
    table = Table("", "tasks", title=title, title_justify="left")
    d = summary.dispatch
    if d is not None:
        table.add_row("input lines", f"{d.read:,}")
        if d.invalid:
            table.add_row("  rejected", f"{d.invalid:,}", style="yellow")
        if d.duplicate_in_input:
            table.add_row("  duplicates in input", f"{d.duplicate_in_input:,}")
        if d.already_seen:
            table.add_row("  already seen (dispatched before)", f"{d.already_seen:,}")
    table.add_row("tasks", f"{summary.tasks:,}")
    table.add_row("archived", f"{summary.archived:,}", style="green")
    if summary.earlier.get("archived"):
        table.add_row("  by an earlier run", f"{summary.earlier['archived']:,}")
    table.add_row("dead-lettered", f"{summary.dead:,}", style="red" if summary.dead else None)
    if summary.earlier.get("dead"):
        table.add_row("  by an earlier run", f"{summary.earlier['dead']:,}")
    for reason, count in summary.dead_reasons.most_common():
        table.add_row(f"  {reason}", f"{count:,}")
    if summary.unfinished:
        table.add_row("unfinished", f"{summary.unfinished:,}", style="yellow")
    if summary.letters_unarchived:
        table.add_row("dead letters not yet archived", f"{summary.letters_unarchived:,}", style="yellow")
    rate = summary.archived_now / summary.seconds if summary.seconds else 0
    table.caption = f"{summary.seconds:.1f}s, {rate:.2f} pages/s" + (
        f" ({summary.archived_now:,} archived by this run)" if summary.earlier.get("archived") else "")
    return table


def how_to_look(summary: RunSummary, s: Settings) -> str:
    """Where the archive is, and commands that show what became of the tasks: each works as
    printed, from this directory, once the run is over (an embedded run's NATS is reopened from
    its state dir, ``ops.state_dir``)."""
    import shlex

    where = summary.archive
    lines = [f"archive: {where}"]
    if where.startswith("/"):
        lines += [
            f"  ls {where}/dt=*/host=*/                 # one folder per page, meta.json written last",
            f"  zcat {where}/dt=*/host=*/*/page.html.gz | head",
            f"  duckdb -c \"select url, status, title from read_json_auto('{where}/dt=*/host=*/*/meta.json', "
            "hive_partitioning=true)\"",
        ]
    env = []
    if s.nats.url:
        env.append(f"BUSSCRAPE_NATS__URL={shlex.quote(s.nats.url)}")
    if s.state_dir != Path(".busscrape"):
        env.append(f"BUSSCRAPE_STATE_DIR={shlex.quote(str(s.state_dir))}")
    cmd = " ".join([*env, "busscrape"])
    lines.append(f"  {cmd} status                    # streams, consumers, dead letters")
    if summary.dead:
        lines.append(f"  {cmd} dlq list                  # why each dead letter died")
    if summary.tasks:
        lines.append(f"  {cmd} task URL                  # every transition of one task")
    if s.search.backend != "off" and summary.archived:
        lines.append(f"  {cmd} search WORD               # full text of the archived pages")
    if summary.failed_daemons:
        lines.append("daemons that stopped for good: " + ", ".join(summary.failed_daemons))
    return "\n".join(lines)


def exit_code(summary: RunSummary, strict: bool) -> int:
    if summary.failure is not None:
        return summary.failure[0]
    if summary.interrupted:
        return EXIT_INTERRUPTED
    d = summary.dispatch
    if not summary.complete or (d is not None and (d.failed or (strict and d.invalid))):
        return EXIT_PARTIAL
    return EXIT_OK
