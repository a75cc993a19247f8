"""``busscrape sessions list|show|drop``: the sessions the workers keep in SESSIONS."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import typer

from busscrape.cli.app import app, err, out, run, safe, settings
from busscrape.errors import EXIT_PARTIAL

if TYPE_CHECKING:
    from busscrape.settings import Settings
    from busscrape.worker.sessions import SessionStore

sessions_app = typer.Typer(help="Sessions' stored cookies and storage (options.session): list, show, drop.",
                           no_args_is_help=True)
app.add_typer(sessions_app, name="sessions")


@contextlib.asynccontextmanager
async def _store(s: Settings) -> AsyncIterator[SessionStore]:
    from busscrape.bus import names, provision, topology
    from busscrape.bus.connection import Bus
    from busscrape.worker.sessions import SessionStore

    async with await Bus.connect(s, name="busscrape-sessions") as bus:
        await provision.require(bus.js, topology.load(s), frozenset({("kv", names.SESSIONS_BUCKET)}))
        yield SessionStore(bus.js)


def _when(ts: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def _readable(summary: dict[str, Any]) -> dict[str, Any]:
    """A session's summary with its times as the table shows them (ISO 8601, UTC), not epoch floats."""
    return {**summary, "logged_in_at": _when(summary["logged_in_at"]), "expires_at": _when(summary["expires_at"])}


@sessions_app.command("list")
def list_cmd(as_json: bool = typer.Option(False, "--json", help="One JSON line per session.")) -> None:
    """Every stored session: when it logged in, when it expires, its proxy, its cookies' names."""
    import orjson
    from rich.table import Table

    async def main() -> list[dict[str, Any]]:
        async with _store(settings(state_nats=True)) as store:
            found = [await store.get(n, expired=True) for n in await store.names()]
            return [s.summary() for s in found if s is not None]

    rows = run(main())
    if as_json:
        for row in rows:
            out.print(orjson.dumps(_readable(row)).decode(), markup=False, highlight=False, soft_wrap=True)
        return
    table = Table("session", "logged in", "expires", "logins", "proxy", "cookies")
    for row in rows:
        table.add_row(safe(row["session"]), _when(row["logged_in_at"]),
                      ("expired " if row["expired"] else "") + _when(row["expires_at"]), str(row["logins"]),
                      safe(row["proxy"] or "direct"), str(len(row["cookies"])))
    out.print(table)
    if not rows:
        err.print("no sessions stored")


@sessions_app.command("show")
def show_cmd(name: str = typer.Argument(..., metavar="SESSION")) -> None:
    """One session as JSON: cookie names and domains, origins with storage; never a value (exit 1: none)."""
    import orjson

    async def main() -> dict[str, Any] | None:
        async with _store(settings(state_nats=True)) as store:
            stored = await store.get(name, expired=True)
            return stored.summary() if stored is not None else None

    found = run(main())
    if found is None:
        err.print(f"no session {safe(name)}")
        raise typer.Exit(EXIT_PARTIAL)
    out.print(orjson.dumps(_readable(found), option=orjson.OPT_INDENT_2).decode(), markup=False, highlight=False)


@sessions_app.command("drop")
def drop_cmd(names_: list[str] = typer.Argument(..., metavar="SESSION...")) -> None:
    """Forget sessions: their next task logs in again (exit 1 when one was not there)."""

    async def main() -> list[tuple[str, bool]]:
        async with _store(settings(state_nats=True)) as store:
            return [(n, await store.drop(n)) for n in names_]

    done = run(main())
    missing = [name for name, dropped in done if not dropped]
    for name, dropped in done:
        if dropped:
            out.print(f"dropped session {safe(name)}")
        else:
            err.print(f"no session {safe(name)}")
    if missing:
        raise typer.Exit(EXIT_PARTIAL)
