"""``busscrape dlq list|show|replay|purge``: the dead letters, as ``busscrape.dlq`` reads them."""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import AsyncIterator
from datetime import datetime
from typing import TYPE_CHECKING

import typer

from busscrape.cli.app import app, err, out, plain, run, safe, settings
from busscrape.errors import EXIT_CONFIG, EXIT_OK, EXIT_PARTIAL
from busscrape.printable import visible

if TYPE_CHECKING:
    from busscrape.deadletters.queue import DeadLetterQueue, Entry, LetterFilter, Outcome
    from busscrape.settings import Settings


group = typer.Typer(help="List, show, replay and purge dead letters (DEADLETTER).", no_args_is_help=True)
app.add_typer(group, name="dlq")

REASON = typer.Option([], "--reason", metavar="R", help="Reason code or glob (http_5*). Repeatable: any matches.")
HOST = typer.Option([], "--host", metavar="H", help="Host or glob (*.example.com). Repeatable.")
STAGE = typer.Option([], "--stage", metavar="S", help="Stage that filed it: dispatch, worker, reaper, ingester. "
                                                      "Repeatable.")
OLDER = typer.Option(None, "--older-than", metavar="DURATION", help="Only letters at least this old (age = now - "
                                                                    "dead_at), e.g. 2h, 7d.")
NEWER = typer.Option(None, "--newer-than", metavar="DURATION", help="Only letters at most this old.")
LIMIT = typer.Option(None, "--limit", metavar="N", help="At most N letters (oldest first).")
SEQS = typer.Argument(None, metavar="[SEQ]...", help="DEADLETTER sequences (as `dlq list` shows them).")
ALL = typer.Option(False, "--all", help="Every letter (needed when neither SEQ nor a filter is given).")
JSON_OUT = typer.Option(False, "--json", help="Print JSON.")
NATS_URL = typer.Option(None, "--nats-url", help="NATS server URL (default: BUSSCRAPE_NATS__URL).")

NOTHING_SELECTED = ("say which letters: SEQ..., a filter (--reason, --host, --stage, --older-than, --newer-than, "
                    "--limit), or --all")


def _filter(reason: list[str], host: list[str], stage: list[str], older_than: str | None, newer_than: str | None,
            limit: int | None) -> LetterFilter:
    from busscrape.cli.options import usage
    from busscrape.deadletters.queue import LetterFilter
    from busscrape.units import parse_duration

    try:
        return LetterFilter(reasons=tuple(reason), hosts=tuple(host), stages=tuple(stage),
                            older_than=parse_duration(older_than) if older_than else None,
                            newer_than=parse_duration(newer_than) if newer_than else None, limit=limit)
    except ValueError as exc:
        usage(str(exc))


# A replay writes to TASKS, ATTEMPTS and STATUS: better exit 2 with the fix than fail every letter.


@contextlib.asynccontextmanager
async def _queue(s: Settings, needs: frozenset[tuple[str, str]] | None = None) -> AsyncIterator[DeadLetterQueue]:
    from busscrape.bus import names, provision, topology
    from busscrape.bus.connection import Bus
    from busscrape.deadletters.queue import DeadLetterQueue

    async with await Bus.connect(s, name="busscrape-dlq") as bus:
        await provision.require(bus.js, topology.load(s), needs or names.DLQ_READ_NEEDS)
        yield DeadLetterQueue(bus.js, request_timeout=s.nats.request_timeout)


async def _selected(s: Settings, seqs: list[int], flt: LetterFilter) -> list[tuple[int, Entry | None]]:
    async with _queue(s) as dlq, contextlib.aclosing(dlq.select(seqs, flt)) as found:
        return [item async for item in found]


# -- list / show ----------------------------------------------------------------------------


@group.command("list")
def list_cmd(reason: list[str] = REASON, host: list[str] = HOST, stage: list[str] = STAGE,
             older_than: str | None = OLDER, newer_than: str | None = NEWER, limit: int | None = LIMIT,
             as_json: bool = typer.Option(False, "--json", help="One JSON object per letter (JSON lines)."),
             nats_url: str | None = NATS_URL) -> None:
    """List dead letters, oldest first: seq, age, stage, reason, host, url, attempts."""
    import orjson
    from rich.table import Table

    from busscrape.model.messages import utcnow

    flt = _filter(reason, host, stage, older_than, newer_than, limit)
    s = settings(nats={"url": nats_url}, state_nats=True)

    async def go() -> list[Entry]:
        rows: list[Entry] = []
        now = utcnow()
        async with _queue(s) as dlq, contextlib.aclosing(dlq.scan(flt)) as entries:
            async for entry in entries:
                if as_json:  # streamed: a long list starts at once and never sits in memory
                    sys.stdout.write(orjson.dumps(entry.summary(now)).decode() + "\n")
                else:
                    rows.append(entry)
        return rows

    rows = run(go())
    if as_json:
        return
    now = utcnow()
    table = Table("seq", "age", "stage", "reason", "host", "url", "attempts", title=f"{len(rows):,} dead letters",
                  title_justify="left")
    for e in rows:
        table.add_row(str(e.seq), age(e.age(now)), safe(e.stage), safe(e.reason), safe(e.host or ""), safe(e.url or ""),
                      str(e.attempts),
                      style=None if e.unreplayable() is None else "dim")
    out.print(table)


@group.command("show")
def show_cmd(seq: int = typer.Argument(..., metavar="SEQ", help="The letter's DEADLETTER sequence."),
             as_json: bool = JSON_OUT, nats_url: str | None = NATS_URL) -> None:
    """Print one dead letter whole: reason, error, attempt history, and the task (or result, or payload)."""
    import orjson

    from busscrape.deadletters.queue import LetterFilter
    from busscrape.model.messages import utcnow

    s = settings(nats={"url": nats_url}, state_nats=True)
    [(_, entry)] = run(_selected(s, [seq], LetterFilter()))
    if entry is None:
        err.print(f"[red]error:[/] no dead letter at seq {seq} (replayed, purged, or past the stream's max age)")
        raise typer.Exit(EXIT_PARTIAL)
    if as_json:
        sys.stdout.write(orjson.dumps(entry.document(), option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    _show(entry, utcnow())


def _show(e: Entry, now: datetime) -> None:
    import orjson
    from rich.json import JSON
    from rich.table import Table
    from rich.text import Text

    facts = Table.grid(padding=(0, 2))
    facts.add_row("seq", f"{e.seq}  [dim]({safe(e.subject)})[/]")
    facts.add_row("stage", plain(e.stage))
    facts.add_row("reason", f"[bold]{safe(e.reason)}[/]")
    facts.add_row("dead at", f"{e.dead_at.isoformat()}  [dim]({age(e.age(now))} ago)[/]")
    letter = e.letter
    if letter is not None:
        facts.add_row("error", plain(letter.error))
        for label, value in (("task", letter.task_id), ("url", letter.url), ("host", e.host)):
            if value:
                facts.add_row(label, plain(value))
        if letter.source is not None:
            facts.add_row("from", plain(f"{letter.source.stream} seq {letter.source.seq} ({letter.source.subject})"))
    else:
        facts.add_row("problem", plain(e.problem or ""))
    why = e.unreplayable()
    facts.add_row("replay", "[green]possible[/]" if why is None else f"[yellow]not possible[/]: {safe(why)}")
    out.print(facts)
    if letter is not None and letter.attempts:
        attempts = Table("#", "at", "worker", "reason", "status", "retryable", "error", title="attempts",
                         title_justify="left")
        for a in letter.attempts:
            attempts.add_row(str(a.attempt), a.at.isoformat(timespec="seconds"), plain(a.worker), plain(a.reason),
                             str(a.status or ""), "yes" if a.retryable else "no", plain(a.error))
        out.print(attempts)
    if letter is not None and (letter.task or letter.result):
        body = letter.task or letter.result
        assert body is not None
        out.print(Text("task" if letter.task else "result", style="bold"))
        out.print(JSON(orjson.dumps(body.model_dump(mode="json")).decode()))
    payload = letter.payload if letter is not None else e.payload
    if payload:
        out.print(Text("payload (start)", style="bold"))
        out.print(plain(payload))


# -- replay / purge -------------------------------------------------------------------------


@group.command("replay")
def replay_cmd(seqs: list[int] | None = SEQS, reason: list[str] = REASON, host: list[str] = HOST,
               stage: list[str] = STAGE, older_than: str | None = OLDER, newer_than: str | None = NEWER,
               limit: int | None = LIMIT, all_letters: bool = ALL,
               dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be replayed; change nothing."),
               as_json: bool = JSON_OUT, nats_url: str | None = NATS_URL) -> None:
    """Queue the selected letters' tasks again (fresh delivery count), then delete the letters.

    Letters without a task (poison messages; ingester letters, which carry the result) are
    skipped with the reason. Exit 1 if any selected letter could not be replayed.
    """
    from busscrape.bus import names
    from busscrape.cli.options import usage
    from busscrape.deadletters.queue import Outcome

    flt = _filter(reason, host, stage, older_than, newer_than, limit)
    if not (seqs or flt.narrows or all_letters):
        usage(NOTHING_SELECTED)
    s = settings(nats={"url": nats_url}, state_nats=True)

    async def go() -> list[Outcome]:
        outcomes = []
        async with _queue(s, names.DLQ_REPLAY_NEEDS) as dlq, contextlib.aclosing(dlq.select(seqs or [], flt)) as found:
            async for seq, entry in found:
                outcome = (Outcome(seq, "missing", "no dead letter at this sequence") if entry is None
                           else await dlq.replay(entry, dry_run=dry_run))
                outcomes.append(outcome)
                if not as_json:
                    _report(outcome)
        return outcomes

    outcomes = run(go())
    counts: Counter[str] = Counter(o.action for o in outcomes)
    _summary(outcomes, counts, as_json, dry_run=dry_run)
    unreplayable = counts["skipped"] + counts["failed"] + counts["missing"]
    raise typer.Exit(EXIT_PARTIAL if unreplayable else EXIT_OK)


@group.command("purge")
def purge_cmd(seqs: list[int] | None = SEQS, reason: list[str] = REASON, host: list[str] = HOST,
              stage: list[str] = STAGE, older_than: str | None = OLDER, newer_than: str | None = NEWER,
              limit: int | None = LIMIT, all_letters: bool = ALL,
              yes: bool = typer.Option(False, "--yes", "-y", help="Delete without asking (required off a terminal)."),
              dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be deleted; change nothing."),
              as_json: bool = JSON_OUT, nats_url: str | None = NATS_URL) -> None:
    """Delete the selected letters for good, after a y/N question (or --yes)."""
    from busscrape.cli.options import usage
    from busscrape.deadletters.queue import Outcome

    flt = _filter(reason, host, stage, older_than, newer_than, limit)
    if not (seqs or flt.narrows or all_letters):
        usage(NOTHING_SELECTED)
    s = settings(nats={"url": nats_url}, state_nats=True)
    # Select, ask, then delete: the question waits outside the event loop and the NATS connection.
    selected = run(_selected(s, seqs or [], flt))
    entries = [e for _, e in selected if e is not None]
    outcomes = [Outcome(seq, "missing", "no dead letter at this sequence") for seq, e in selected if e is None]
    if entries and not dry_run and not yes:
        if not sys.stdin.isatty():
            err.print(f"[red]error:[/] refusing to delete {len(entries):,} dead letters without confirmation; "
                      "add --yes (or run it on a terminal to be asked)")
            raise typer.Exit(EXIT_CONFIG)
        _preview(entries)
        if not typer.confirm(f"Delete {len(entries):,} dead letters for good?", default=False):
            err.print("nothing deleted")
            raise typer.Exit(EXIT_PARTIAL)

    async def go() -> list[Outcome]:
        async with _queue(s) as dlq:
            return [await dlq.delete(entry, dry_run=dry_run) for entry in entries]

    outcomes += run(go()) if entries else []
    if not as_json:
        for outcome in outcomes:
            _report(outcome)
    counts: Counter[str] = Counter(o.action for o in outcomes)
    _summary(outcomes, counts, as_json, dry_run=dry_run)
    raise typer.Exit(EXIT_PARTIAL if counts["missing"] else EXIT_OK)


_STYLE = {"replayed": "green", "deleted": "green", "would_replay": "cyan", "would_delete": "cyan",
          "skipped": "yellow", "failed": "red", "missing": "red"}


def _report(o: Outcome) -> None:
    from rich.text import Text

    e = o.entry
    what = f"{e.stage}/{e.reason}  {e.url or e.task_id or ''}" if e is not None else ""
    where = f" -> TASKS seq {o.task_seq}" if o.task_seq is not None else ""
    line = Text.assemble((f"{o.action.replace('_', ' '):<13}", _STYLE[o.action]),
                         plain(f"seq {o.seq}  {what}{where}"))
    if o.detail:
        line.append(f"\n{'':<13}{visible(o.detail)}", style="dim")
    out.print(line, soft_wrap=True)


def _summary(outcomes: list[Outcome], counts: Counter[str], as_json: bool, *, dry_run: bool) -> None:
    import orjson

    if as_json:
        doc = {"dry_run": dry_run, "counts": dict(counts), "letters": [o.as_dict() for o in outcomes]}
        sys.stdout.write(orjson.dumps(doc).decode() + "\n")
        return
    if not outcomes:
        out.print("no dead letters selected")
        return
    out.print(" · ".join(f"{action.replace('_', ' ')} {n:,}" for action, n in sorted(counts.items())))


def _preview(entries: list[Entry], shown: int = 20) -> None:
    from rich.table import Table

    from busscrape.model.messages import utcnow

    now = utcnow()
    table = Table("seq", "age", "stage", "reason", "url", title="to delete", title_justify="left")
    for e in entries[:shown]:
        table.add_row(str(e.seq), age(e.age(now)), safe(e.stage), safe(e.reason), safe(e.url or ""))
    if len(entries) > shown:
        table.caption = f"… and {len(entries) - shown:,} more"
    err.print(table)


def age(seconds: float) -> str:
    """``42s``, ``12m``, ``3h12m``, ``2d4h``: coarse, as a listing wants it."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"
