"""``busscrape wacz NAME``: the pages' WARCs packaged as one WACZ in the archive (and ``run --wacz``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from busscrape.cli.app import ARCHIVE_HELP, app, err, out, run, safe, settings
from busscrape.errors import EXIT_CONFIG, EXIT_OK, PermanentError

if TYPE_CHECKING:
    from busscrape.archive.wacz import Packed
    from busscrape.settings import Settings

HELP = """Package the WARCs of archived pages (the warc artifact) as one WACZ, stored in the archive
as wacz/NAME.wacz. Pages are chosen by folder (--folder, repeatable) or by key prefix (--under,
e.g. dt=2026-12-02, or dt=2026-12-02/host=example.org); without either, every page with a WARC.
Packing again under the same NAME keeps the pages the package held and adds the new ones.
Exit codes: 0 packaged; 2 nothing to package or a bad name.
"""


@app.command("wacz", help=HELP)
def wacz_cmd(
    name: str = typer.Argument(..., help="Package name (wacz/NAME.wacz in the archive)."),
    folder: list[str] = typer.Option([], "--folder", metavar="KEY", help="A page folder (repeatable)."),
    under: str | None = typer.Option(None, "--under", metavar="PREFIX", help="Every page folder under this key."),
    archive: str | None = typer.Option(None, "--archive", metavar="WHERE", help=ARCHIVE_HELP),
) -> None:
    s = settings()
    packed = run(package(s, name, folders=folder, under=under, archive=archive))
    report(packed)
    raise typer.Exit(EXIT_OK)


async def package(s: Settings, name: str, *, folders: list[str] | None = None, under: str | None = None,
                  locations: list[str] | None = None, archive: str | None = None) -> Packed:
    """Pack the given folders (or the run's ``locations``, or the pages under a prefix)."""
    from busscrape.archive import wacz
    from busscrape.archive.layout import join
    from busscrape.archive.storage import open_storage

    try:
        async with open_storage(s, archive) as storage:
            chosen = [*(folders or []), *(wacz.folder_of(loc, storage) for loc in locations or [])]
            if under is not None or (not chosen and locations is None):
                chosen += await wacz.page_folders(storage, join(s.archive.prefix, under or ""))
            return await wacz.pack(storage, chosen, name, prefix=s.archive.prefix)
    except PermanentError as exc:
        err.print(f"[red]error:[/] {safe(exc)}")
        raise typer.Exit(EXIT_CONFIG) from None


def report(packed: Packed) -> None:
    out.print(f"wacz: {safe(packed.key)} · {packed.pages} pages · {packed.size:,} bytes")
    if packed.dangling:
        err.print(f"  [yellow]{packed.dangling} revisit records refer to pages not in the package[/] "
                  "(worker.warc_revisits = worker): pack those pages together")
    for why in packed.skipped[:20]:
        err.print(f"  [yellow]skipped[/] {safe(why)}")
    if len(packed.skipped) > 20:
        err.print(f"  [yellow]… {len(packed.skipped) - 20} more skipped[/]")
