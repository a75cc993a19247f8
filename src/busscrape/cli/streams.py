"""``busscrape streams apply|show``."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer

from busscrape.cli.app import app, err, out, run, settings
from busscrape.errors import EXIT_CONFIG, StreamConflict

if TYPE_CHECKING:
    from busscrape.bus import provision


group = typer.Typer(help="Create, update and inspect the streams, consumers and buckets in streams/.",
                    no_args_is_help=True)
app.add_typer(group, name="streams")

NATS_URL = typer.Option(None, "--nats-url", help="NATS server URL (default: BUSSCRAPE_NATS__URL).")


@group.command("apply")
def apply_cmd(
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would change; change nothing."),
    recreate: list[str] = typer.Option([], "--recreate", metavar="NAME",
                                       help="Delete and create NAME anew when it cannot be updated in place "
                                            "(loses its messages). Repeatable."),
    nats_url: str | None = NATS_URL,
) -> None:
    """Create what is missing, update what differs (showing the diff), leave the rest."""
    from busscrape.bus import provision, topology
    from busscrape.bus.connection import Bus

    s = settings(nats={"url": nats_url})

    async def go() -> list[provision.Change]:
        definitions = topology.load(s)
        async with await Bus.connect(s, name="busscrape-streams") as bus:
            return await provision.apply(bus.js, definitions, dry_run=dry_run, recreate=frozenset(recreate))

    try:
        changes = run(go())
    except typer.Exit:
        raise
    except StreamConflict as exc:  # pragma: no cover - run() maps ConfigurationError already
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(EXIT_CONFIG) from None
    verb = {"create": "would create", "update": "would update", "recreate": "would recreate"} if dry_run else {}
    for change in changes:
        action = verb.get(change.action, change.action)
        style = {"unchanged": "dim", "create": "green", "update": "yellow"}.get(change.action, "red")
        out.print(f"[{style}]{action:>14}[/] {change.definition.label}  [dim]({change.definition.file.name})[/]")
        for field in change.fields:
            out.print(f"{'':>16}{field.describe()}")
    changed = sum(c.action != "unchanged" for c in changes)
    out.print(f"{'dry run: ' if dry_run else ''}{changed} of {len(changes)} "
              f"{'would change' if dry_run else 'changed'}")


@group.command("show")
def show_cmd(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    nats_url: str | None = NATS_URL,
) -> None:
    """Print the live configuration and counts of every stream, consumer and bucket."""
    import orjson
    from rich.table import Table

    from busscrape.bus import provision, topology
    from busscrape.bus.connection import Bus

    s = settings(nats={"url": nats_url})

    async def go() -> list[provision.Live]:
        definitions = topology.load(s)
        async with await Bus.connect(s, name="busscrape-streams") as bus:
            return await provision.show(bus.js, definitions)

    lives = run(go())
    if as_json:
        doc = [{"kind": x.definition.kind, "name": x.definition.name, "stream": x.definition.stream,
                "exists": x.exists, "config": x.config, "counts": x.counts} for x in lives]
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    table = Table("kind", "name", "counts", "configuration")
    for x in lives:
        if not x.exists:
            table.add_row(x.definition.kind, x.definition.label.split(" ", 1)[-1], "[red]missing[/]", "")
            continue
        counts = " ".join(f"{k}={v}" for k, v in x.counts.items())
        config = ", ".join(f"{k}={_fmt(k, v)}" for k, v in x.config.items() if k not in _QUIET)
        table.add_row(x.definition.kind, x.definition.label.split(" ", 1)[-1], counts, config)
    out.print(table)


# Shown by --json; too long or too constant for the table.
_QUIET = {"subjects", "durable_name", "num_replicas", "storage", "max_msg_size", "deliver_policy", "ack_policy",
          "max_waiting"}


def _fmt(key: str, value: object) -> str:
    from busscrape.units import format_duration

    if key == "sources" and isinstance(value, list):
        return "+".join(str(s["name"]) for s in value)
    if key in {"max_bytes"} and isinstance(value, int) and value > 0:
        return f"{value / 2**30:.1f}GiB"

    if key in {"max_age", "duplicate_window", "ack_wait"} and isinstance(value, int | float):
        return format_duration(value)
    if key == "backoff" and isinstance(value, list):
        return "[" + ",".join(format_duration(v) for v in value) + "]"
    return str(value)
