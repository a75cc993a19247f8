"""``busscrape task ID|URL``: what happened to one task, generation by generation."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import typer

from busscrape.cli.app import app, err, out, plain, run, safe, settings
from busscrape.errors import EXIT_CONFIG, EXIT_OK, EXIT_PARTIAL, InputError

if TYPE_CHECKING:
    from rich.console import Group

    from busscrape.settings import Settings
    from busscrape.status.history import HistoryEvent, TaskHistory


HELP = """Show every transition of a task: queued, running (attempt n), retrying (why), rendered,
archived (where) or dead (why), for each time it was dispatched.

TASK is a task id (32 hex characters) or a URL. A URL is normalised exactly as `busscrape
dispatch` does (--strip-tracking and --sort-query as there) and looked up under the task id it
gets with the default steps and options, or with those of --spec. Exit codes: 0 found; 1 no such
task (never queued, or forgotten after BUSSCRAPE_STREAMS__STATUS_TTL); 2 an invalid URL or spec,
cannot connect, or streams missing.
"""

STATE_STYLE = {"queued": "cyan", "running": "blue", "retrying": "yellow", "rendered": "green",
               "archived": "bold green", "dead": "bold red"}


@app.command("task", help=HELP)
def task_cmd(
    task: str = typer.Argument(..., metavar="TASK", help="Task id, or a URL as given to dispatch."),
    spec: str | None = typer.Option(None, "--spec", metavar="JSON", help="The task's steps and options as in a "
                                    "JSONL spec line, without url: '{\"artifacts\": [\"html\"]}'."),
    strip_tracking: bool | None = typer.Option(None, "--strip-tracking/--keep-tracking",
                                               help="Normalise as dispatch --strip-tracking did."),
    sort_query: bool | None = typer.Option(None, "--sort-query/--keep-query-order",
                                           help="Normalise as dispatch --sort-query did."),
    as_json: bool = typer.Option(False, "--json", help="Print the history as one JSON object."),
    nats_url: str | None = typer.Option(None, "--nats-url", help="NATS server URL (default: BUSSCRAPE_NATS__URL)."),
) -> None:
    import orjson

    s = settings(nats={"url": nats_url}, dispatch={"strip_tracking": strip_tracking, "sort_query": sort_query},
                 state_nats=True)
    task_id = resolve(task, s, spec)
    history = run(_read(s, task_id))
    if history is None:
        err.print(f"[yellow]no task {task_id}[/] ({safe(task)}): never queued, or forgotten since")
        raise typer.Exit(EXIT_PARTIAL)
    if as_json:
        sys.stdout.write(orjson.dumps(history.model_dump(mode="json")).decode() + "\n")
    else:
        out.print(render(history))
    raise typer.Exit(EXIT_OK)


def resolve(task: str, s: Settings, spec: str | None) -> str:
    """The task id TASK names (exit 2 with the reason for a URL dispatch would reject)."""
    import orjson

    from busscrape.cli.options import usage
    from busscrape.dispatch.identity import task_id_for_url
    from busscrape.status.history import TASK_ID

    if TASK_ID.match(task) and spec is None:
        return task
    extra: dict[str, Any] = {}
    if spec is not None:
        try:
            extra = orjson.loads(spec)
        except orjson.JSONDecodeError as exc:
            usage(f"--spec is not JSON: {exc}")
        if not isinstance(extra, dict) or "url" in extra:
            usage("--spec is a JSON object of steps and task options, without url")
    try:
        return task_id_for_url(task, s, extra)
    except InputError as exc:
        if spec is not None:  # the URL, the spec or both: blame what is wrong
            url_problem = _url_problem(task, s)
            if url_problem is None:
                usage(f"--spec: {exc.message}")
            exc = url_problem
        err.print(f"[red]error:[/] {safe(repr(task))} is not a task id, and dispatch would reject it as a URL: "
                  f"{safe(exc.reason)}: {safe(exc.message)}")
        raise typer.Exit(EXIT_CONFIG) from None


def _url_problem(task: str, s: Settings) -> InputError | None:
    """Why dispatch would reject TASK as a URL with the default options (None: it would not)."""
    from busscrape.dispatch.identity import task_id_for_url

    try:
        task_id_for_url(task, s)
    except InputError as exc:
        return exc
    return None


async def _read(s: Settings, task_id: str) -> TaskHistory | None:
    from busscrape.bus import names, provision, topology
    from busscrape.bus.connection import Bus
    from busscrape.status.history import HistoryReader

    async with await Bus.connect(s, name="busscrape-task") as bus:
        await provision.require(bus.js, topology.load(s), names.HISTORY_NEEDS)
        return await HistoryReader(bus.js).read(task_id)


def render(history: TaskHistory) -> Group:
    """The history as a heading and one table row per event."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Text.assemble(("task ", "bold"), (history.task_id, "bold"), "  ", plain(history.url or ""), "  ",
                         (history.state, STATE_STYLE.get(history.state, "")))
    table = Table("gen", "at (UTC)", "state", "attempt", "worker", "detail", show_lines=False)
    for number, generation in enumerate(history.generations, 1):
        for event in generation.events:
            table.add_row(str(number), event.at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
                          Text(event.state, style=STATE_STYLE.get(event.state, "")),
                          str(event.attempt or ""), plain(event.worker or ""), plain(detail(event)))
        if number < len(history.generations):
            table.add_section()
    return Group(head, table)


def detail(event: HistoryEvent) -> str:
    """What else an event says, in a few words."""
    parts = []
    if event.status is not None:
        parts.append(f"HTTP {event.status}")
    if event.reason:
        parts.append(event.reason)
    if event.error:
        parts.append(event.error if len(event.error) <= 120 else event.error[:119] + "…")
    if event.archive:
        parts.append(event.archive)
    if event.state == "queued" and event.source != "status":
        parts.append("dispatched" if event.source == "dispatch" else "created in SEEN")
    return " · ".join(parts)
