"""``busscrape search "QUERY"``: ranked full-text search of the archived pages (``search_index``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from busscrape.cli.app import app, err, out, plain, run, safe, settings
from busscrape.errors import EXIT_CONFIG, EXIT_OK

if TYPE_CHECKING:
    from rich.console import Group
    from rich.text import Text

    from busscrape.search.index import SearchHit, SearchPage, SearchQuery
    from busscrape.settings import Settings


HELP = """Search the visible text, titles and URLs of every archived page; best matches first.

QUERY is the same on every backend: words (all must match), "a phrase", a or b, -word.
Without QUERY, the filters (--host, --since, --crawl, --status, --where) list every page they
keep, newest first; --offset pages through the results. Each result shows its title, URL,
scrape date, archive folder and a snippet with the matches marked, and the record of a page
whose task had an extractor (its text is searched too). --where FIELD<VALUE (repeatable;
< <= > >= = !=) keeps pages whose extracted record's field holds it; a value that reads as a
number compares as one (--where price<100).
--reindex rebuilds the index from the archive's meta.json files (after pages were missed, or to
fill a new index). Exit codes: 0 (with or without matches); 2 an invalid query, search off, or
the index cannot be opened.
"""


@app.command("search", help=HELP)
def search_cmd(
    query: str | None = typer.Argument(None, metavar="QUERY", help="What to look for."),
    host: str | None = typer.Option(None, "--host", help="Only pages of this host (exact, e.g. shop.example)."),
    since: str | None = typer.Option(None, "--since", metavar="WHEN", help="Only pages scraped since a date, a "
                                     "time (ISO 8601) or an age (7d, 36h)."),
    crawl: str | None = typer.Option(None, "--crawl", metavar="CRAWL_ID", help="Only pages of this crawl."),
    status: int | None = typer.Option(None, "--status", metavar="CODE", help="Only pages that answered this HTTP "
                                      "status (e.g. 404)."),
    limit: int = typer.Option(10, "--limit", min=1, max=1000, help="At most this many results."),
    offset: int = typer.Option(0, "--offset", min=0, help="Skip this many results first (the next page of "
                               "results: --offset 10 after --limit 10)."),
    where: list[str] = typer.Option([], "--where", metavar="FIELD<VALUE", help="A condition on the extracted "
                                    "record's field (< <= > >= = !=), e.g. price<100. Repeatable."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document (as GET /search does)."),
    reindex_all: bool = typer.Option(False, "--reindex", help="Index every archived page again, from the archive."),
    archive: str | None = typer.Option(None, "--archive", metavar="DIR", help="With --reindex: read this local "
                                       "folder (default: the configured archive)."),
) -> None:
    import orjson

    from busscrape.cli.options import usage
    from busscrape.search.index import InvalidQuery, SearchQuery, SearchUnavailable, parse_since

    s = settings()
    if archive and not reindex_all:
        usage("--archive goes with --reindex")
    if reindex_all:
        source = Path(archive) if archive else None
        if source is not None and not source.is_dir():
            usage(f"--archive {archive}: no such folder")
        nowhere = not (s.s3.endpoint or s.archive.url) and not s.archive_dir().is_dir()
        if source is None and nowhere:  # nothing made for nothing
            usage(f"no archive at {s.archive_dir()} (BUSSCRAPE_STATE_DIR, BUSSCRAPE_ARCHIVE__DIR, or --archive DIR)")
        count = run(_reindex(s, source))
        out.print(f"indexed {count:,} archived page(s)")
        raise typer.Exit(EXIT_OK)
    if query is None and not (host or since or where or crawl or status is not None):
        usage("give a QUERY, a filter (--host, --since, --where, --crawl, --status), or --reindex")
    try:
        wanted = SearchQuery.parse(query or "", host=host, since=parse_since(since) if since else None, limit=limit,
                                   max_limit=1000, where=where, crawl=crawl, status=status, offset=offset)
        backend, found = run(_search(s, wanted))
    except (InvalidQuery, SearchUnavailable) as exc:
        err.print(f"[red]error:[/] {safe(exc.message)}")
        raise typer.Exit(EXIT_CONFIG) from None
    if as_json:
        doc = {"query": wanted.text, "backend": backend, "results": [h.model_dump(mode="json") for h in found.hits],
               "offset": wanted.offset, "more": found.more}
        sys.stdout.write(orjson.dumps(doc).decode() + "\n")
    elif not found.hits:
        err.print(f"no archived page matches {safe(repr(wanted.text)) if wanted.text else 'the filters'}")
    else:
        for rank, hit in enumerate(found.hits, wanted.offset + 1):
            out.print(render(rank, hit))
        if found.more:
            err.print(f"more results follow: --offset {wanted.offset + len(found.hits)}")
    raise typer.Exit(EXIT_OK)


async def _search(s: Settings, query: SearchQuery) -> tuple[str, SearchPage]:
    from busscrape.search import open_index

    async with open_index(s) as index:
        return index.backend, await index.page(query)


async def _reindex(s: Settings, archive_dir: Path | None) -> int:
    from busscrape.archive.storage import open_storage
    from busscrape.search import open_index
    from busscrape.search.feed import reindex

    async with open_storage(s, archive_dir) as storage, open_index(s) as index:
        return await reindex(storage, index, limit=s.search.max_text_bytes, prefix=s.archive.prefix)


def render(rank: int, hit: SearchHit) -> Group:
    """One result: title, URL, date and archive folder, then the snippet with the matches marked."""
    from rich.console import Group
    from rich.text import Text

    title = Text.assemble((f"{rank}. ", "dim"), (plain(hit.title or "(no title)").plain, "bold"),
                          (f"  {hit.score:.3g}", "dim"))
    where = Text.assemble(("   ", ""), (plain(hit.url).plain, "cyan"))
    when = Text(f"   {hit.scraped_at:%Y-%m-%d %H:%M} UTC · {plain(hit.archive_key).plain}", style="dim")
    lines = [title, where, when, highlighted(hit.snippet, bold=out.is_terminal)]
    if hit.record is not None:
        import orjson

        lines.append(Text(f"   {hit.extractor}: " + plain(orjson.dumps(hit.record).decode()[:300]).plain,
                          style="green"))
    return Group(*lines, Text(""))


def highlighted(snippet: str, *, bold: bool = True) -> Text:
    """The snippet with each ⟦match⟧ shown in bold yellow, without the brackets; off a terminal
    (no bold there) the brackets stay."""
    from rich.text import Text

    from busscrape.search.index import MARK_END, MARK_START

    text = Text("   ")
    rest = " ".join(snippet.split())
    if not bold:
        return text.append(rest)
    while MARK_START in rest:
        before, _, after = rest.partition(MARK_START)
        match, _, rest = after.partition(MARK_END)
        text.append(before)
        text.append(match, style="bold yellow")
    text.append(rest)
    return text
