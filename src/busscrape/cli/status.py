"""``busscrape status [--watch] [--json]``: the bus at a glance (``busscrape.overview``)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import typer

from busscrape.cli.app import app, out, run, safe, settings
from busscrape.errors import EXIT_OK

if TYPE_CHECKING:
    import asyncio

    from rich.console import Group

    from busscrape.settings import Settings


HELP = """Show streams, consumers, buckets, dead letters, the workers' lag and rates at a glance.

The lag is KEDA's nats-jetstream number: num_pending + num_ack_pending of TASKS/workers, read
from the monitoring endpoint's /jsz when BUSSCRAPE_NATS__MONITOR_URL (or --monitor-url) is set,
else from the JetStream API (the output says which). Rates (messages/s into TASKS, RESULTS and
DEADLETTER; acks/s per consumer) come from two reads: one second apart for a single look, the
last two refreshes with --watch. Dead letters are counted by stage exactly and by reason over
the newest 1,000. --json prints one JSON document (one line per refresh with --watch).
Exit codes: 0 (also when Ctrl-C ends --watch); 2 cannot connect, or streams missing.
"""

FIRST_GAP = 1.0  # seconds between the two reads of a single look (the rates' base)


@app.command("status", help=HELP)
def status_cmd(
    watch: bool = typer.Option(False, "--watch", "-w", help="Refresh until Ctrl-C."),
    interval: str = typer.Option("2s", "--interval", "-n", metavar="DURATION", help="Refresh period of --watch."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    nats_url: str | None = typer.Option(None, "--nats-url", help="NATS server URL (default: BUSSCRAPE_NATS__URL)."),
    monitor_url: str | None = typer.Option(None, "--monitor-url", metavar="URL",
                                           help="NATS monitoring endpoint, e.g. http://nats:8222 (default: "
                                                "BUSSCRAPE_NATS__MONITOR_URL)."),
) -> None:
    from busscrape.cli.options import usage
    from busscrape.units import parse_duration

    try:
        every = max(parse_duration(interval), 0.2)
    except ValueError as exc:
        usage(f"--interval: {exc}")
    s = settings(nats={"url": nats_url, "monitor_url": monitor_url}, state_nats=True)
    raise typer.Exit(run(_status(s, watch=watch, every=every, as_json=as_json)))


async def _status(s: Settings, *, watch: bool, every: float, as_json: bool) -> int:
    import asyncio
    import signal

    from busscrape.bus import names, provision, topology
    from busscrape.bus.connection import Bus
    from busscrape.ops.overview import Overview

    definitions = topology.load(s)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if watch:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    try:
        async with await Bus.connect(s, name="busscrape-status") as bus:
            await provision.require(bus.js, definitions, names.REQUIRED)
            async with Overview(bus, definitions, monitor_url=s.nats.monitor_url,
                                account=s.nats.monitor_account) as view:
                first = await view.counters()
                if await _stopped(stop, FIRST_GAP):
                    return EXIT_OK
                doc, counters = await view.snapshot(first)
                with _display(as_json, watch) as show:
                    show(doc)
                    while watch and not await _stopped(stop, every):
                        doc, counters = await view.snapshot(counters)
                        show(doc)
    finally:
        if watch:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
    return EXIT_OK


async def _stopped(stop: asyncio.Event, seconds: float) -> bool:
    import asyncio

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


@contextlib.contextmanager
def _display(as_json: bool, watch: bool) -> Iterator[Any]:
    """A function that shows one document: a JSON line, tables, or a live view on a terminal."""
    import orjson
    from rich.live import Live

    if as_json:
        def line(doc: dict[str, Any]) -> None:
            sys.stdout.write(orjson.dumps(doc).decode() + "\n")
            sys.stdout.flush()

        yield line
    elif watch and out.is_terminal:
        with Live(console=out, auto_refresh=False, transient=False) as live:
            yield lambda doc: live.update(render(doc), refresh=True)
    else:
        yield lambda doc: out.print(render(doc))


def render(doc: dict[str, Any]) -> Group:
    """The status document as tables."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    rates = doc.get("rates") or {}
    inflow, acks = rates.get("messages_in", {}), rates.get("acks", {})

    streams = Table("stream", "messages", "bytes", "consumers", "in/s", title="streams", title_justify="left")
    for name, row in doc["streams"].items():
        streams.add_row(name, f"{row['messages']:,}", _bytes(row["bytes"]), str(row["consumers"]),
                        _rate(inflow.get(name)))

    consumers = Table("consumer", "pending", "ack pending", "redelivered", "waiting", "acks/s", title="consumers",
                      title_justify="left")
    for key, row in doc["consumers"].items():
        consumers.add_row(key, f"{row['num_pending']:,}", f"{row['num_ack_pending']:,}",
                          f"{row['num_redelivered']:,}", f"{row['num_waiting']:,}", _rate(acks.get(key)))

    buckets = Table("bucket", "kind", "keys", "messages", "bytes", title="buckets", title_justify="left")
    for name, row in doc["buckets"].items():
        keys = f"{row['keys']:,}" if "keys" in row else ""
        buckets.add_row(name, row["kind"].replace("_", " "), keys, f"{row['messages']:,}", _bytes(row["bytes"]))

    dl = doc["deadletters"]
    sampled = "" if dl["reasons_complete"] else f" (reasons: newest {dl['reasons_sampled']:,})"
    letters = Table("stage", "letters", "reasons", title=f"dead letters: {dl['total']:,}{sampled}",
                    title_justify="left")
    for stage, count in dl["by_stage"].items():
        reasons = ", ".join(f"{r} ×{n:,}" for r, n in dl["by_reason"].get(stage, {}).items())
        letters.add_row(safe(stage), f"{count:,}", safe(reasons), style=None if count else "dim")

    lag = doc["lag"]
    where = f"/jsz at {lag['monitor_url']}" if lag["source"] == "jsz" else "the JetStream API"
    line = Text.assemble(("workers' lag (KEDA) ", "bold"), (f"{lag['value']:,}", "bold cyan"),
                         f" = {lag['num_pending']:,} pending + {lag['num_ack_pending']:,} ack pending on "
                         f"{lag['consumer']}, from {where}")
    parts: list[Any] = [line]
    if lag.get("note"):
        parts.append(Text(lag["note"], style="yellow"))
    room = doc["results"]
    if room["paused"]:
        parts.append(Text(f"RESULTS is {room['fill']:.0%} full: workers fetch no tasks until the ingesters catch up "
                          "(back-pressure; is the archive reachable?)", style="bold yellow"))
    elif room["max_bytes"] and room["max_bytes"] > 0:
        parts.append(Text(f"RESULTS {room['fill']:.1%} full ({_bytes(room['bytes'])} of {_bytes(room['max_bytes'])})"))
    if doc.get("cooling"):
        cooling = Table("host", "cooling for", "status", "by worker", title="hosts cooling (fleet-wide)",
                        title_justify="left")
        for row in doc["cooling"]:
            cooling.add_row(safe(row["host"]), f"{row['seconds_left']:.0f}s", str(row["status"] or ""),
                            safe(row["worker"]))
        parts.append(cooling)
    if doc.get("workers"):
        workers = Table("worker", "host slots held", "hosts", title="workers rendering (their HOSTS slot leases)",
                        title_justify="left")
        for row in doc["workers"]:
            workers.add_row(safe(row["worker"]), str(row["slots"]),
                            safe(", ".join(f"{host} ×{n}" for host, n in row["hosts"].items())))
        parts.append(workers)
    parts += [streams, consumers, buckets, letters]
    if doc.get("crawls"):
        parts.append(_crawls(doc["crawls"]))
    parts.append(Text(f"{doc['at']}" + (f" · rates over {rates['seconds']:.1f}s" if rates else ""), style="dim"))
    return Group(*parts)


def _crawls(crawls: list[dict[str, Any]]) -> Any:
    """The recent crawls: what each queued (its budget), how many pages' links were read, and how
    many queued pages are still to read (waiting, rendering, or dead)."""
    from rich.table import Table

    table = Table("crawl", "started", "seeds", "scope", "depth", "queued", "followed", "unfollowed", "holds",
                  title="crawls (newest first; `busscrape crawl status ID` for one)", title_justify="left")
    for c in crawls:
        seeds = ", ".join(safe(u) for u in c["seeds"]) + (f" +{c['seed_count'] - len(c['seeds'])}"
                                                          if c["seed_count"] > len(c["seeds"]) else "")
        budget = f"{c['queued']:,}" + (f" / {c['max_pages']:,}" if c["max_pages"] is not None else "")
        table.add_row(c["crawl_id"], (c["started"] or "")[:19], seeds, c["scope"], str(c["depth"]), budget,
                      f"{c['followed']:,}", f"{c['unfollowed']:,}", str(c["holds"]))
    return table


def _rate(value: float | None) -> str:
    return "" if value is None else f"{value:,.1f}"


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{n} B"
