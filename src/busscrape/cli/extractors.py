"""``busscrape extractors list|show|test`` and ``busscrape export``: extractors without the bus."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from busscrape.cli.app import app, err, out, plain, run, safe, settings
from busscrape.errors import EXIT_CONFIG, EXIT_OK, EXIT_PARTIAL, said

if TYPE_CHECKING:
    from busscrape.extract.registry import Registry
    from busscrape.settings import Settings

extractors_app = typer.Typer(help="The extractors of extractors/ (BUSSCRAPE_EXTRACT__DIR): list, show, try them.",
                             no_args_is_help=True)
app.add_typer(extractors_app, name="extractors")

DIR_OPTION = typer.Option(None, "--dir", metavar="DIR", help="Extractors folder (default BUSSCRAPE_EXTRACT__DIR, "
                          "extractors).")


def _registry(folder: Path | None) -> tuple[Settings, Registry]:
    from busscrape.errors import ConfigurationError
    from busscrape.extract.registry import Registry

    s = settings(extract={"dir": folder})
    try:
        return s, Registry.with_bundled(s.extract.dir)
    except ConfigurationError as exc:  # an invalid file: exit 2, naming the file, the field and why
        err.print(f"[red]error:[/] {safe(exc.message)}")
        raise typer.Exit(exc.exit_code) from None


@extractors_app.command("list")
def list_cmd(folder: Path | None = DIR_OPTION) -> None:
    """Every extractor, its version and its fields (exit 2 when a file is invalid)."""
    from rich.table import Table

    s, registry = _registry(folder)
    table = Table("name", "version", "fields", "required", "description", title=str(s.extract.dir),
                  title_justify="left")
    for name, extractor in registry.items():
        table.add_row(name, str(extractor.version), ", ".join(extractor.fields) or "(Python: extract(page))",
                      ", ".join(extractor.required_fields()), plain(extractor.description))
    out.print(table)
    if not registry:
        err.print(f"no extractors in {safe(str(s.extract.dir))}")


@extractors_app.command("show")
def show_cmd(name: str = typer.Argument(..., metavar="NAME"), folder: Path | None = DIR_OPTION) -> None:
    """The extractor as loaded: every field with its defaults filled in, as JSON."""
    import orjson

    _, registry = _registry(folder)
    extractor = _named(registry, name)
    sys.stdout.write(orjson.dumps(extractor.model_dump(mode="json", exclude_defaults=True),
                                  option=orjson.OPT_INDENT_2).decode() + "\n")


@extractors_app.command("test")
def test_cmd(
    name: str = typer.Argument(..., metavar="NAME"),
    page: str = typer.Argument(..., metavar="FILE_OR_URL", help="A saved page (.html or .html.gz), an archive "
                               "folder (its page.html.gz), or an http(s) URL fetched as it is (no JavaScript)."),
    url: str | None = typer.Option(None, "--url", help="The page's URL, to resolve relative links (default: the "
                                   "archived URL, the fetched URL, or file://)."),
    folder: Path | None = DIR_OPTION,
    allow: list[str] = typer.Option([], "--allow", metavar="CIDR|HOST:PORT",
                                    help="Open a non-public address to the fetch of a URL (repeatable; adds to "
                                         "BUSSCRAPE_NETWORK__ALLOW)."),
) -> None:
    """Run an extractor on one page, without the bus; print the record. Exit 1 when a required field
    is missing (the task would be dead-lettered as extraction_failed), 2 for a bad file or page.
    A URL is fetched as a worker would be let: under the network policy (non-public addresses
    refused unless allowed), and at most the worker's max_page_bytes."""
    import orjson

    from busscrape.extract import engine

    s, registry = _registry(folder)
    extractor = _named(registry, name)
    if page.startswith(("http://", "https://")):
        html, page_url = _fetch_page(s, page, url, allow)
    else:
        html, page_url = _read_page(page, url)
    outcome = engine.run(extractor, html, page_url)
    doc: dict[str, Any] = {"extractor": extractor.name, "version": extractor.version, "url": page_url,
                           "record": outcome.record, "ms": outcome.ms}
    if outcome.warnings:
        doc["warnings"] = outcome.warnings
    if outcome.missing:
        doc["missing"] = outcome.missing
    sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    if outcome.missing:
        err.print(f"[yellow]extraction_failed:[/] required field missing: {safe('; '.join(outcome.missing))}")
        raise typer.Exit(EXIT_PARTIAL)
    raise typer.Exit(EXIT_OK)


def _named(registry: Registry, name: str) -> Any:
    from busscrape.errors import ConfigurationError

    try:
        return registry.get_or_explain(name)
    except ConfigurationError as exc:
        err.print(f"[red]error:[/] {safe(exc.message)}")
        raise typer.Exit(EXIT_CONFIG) from None


FETCH_TIMEOUT = 30.0


def _fetch_page(s: Settings, page: str, url: str | None, allow: list[str]) -> tuple[str, str]:
    """The HTML and final URL of ``page``, fetched through the policy (``net.checked``: every
    redirect hop checked, connections only to checked addresses) and bounded by the worker's
    ``max_page_bytes``; exit 2 with the reason when refused, unreachable or over the bound."""
    import asyncio

    import aiohttp

    from busscrape.errors import PolicyBlocked
    from busscrape.net import checked
    from busscrape.net.policy import NetworkPolicy

    policy = NetworkPolicy.from_settings([*s.network.allow, *allow])
    bound = s.worker.max_page_bytes

    async def get() -> checked.Fetched:
        timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT)
        async with checked.session(policy, timeout=timeout, headers={"User-Agent": "busscrape"}) as http:
            return await checked.fetch(http, policy, page, bound + 1)  # one byte more tells an over-size

    try:
        got = asyncio.run(get())
    except PolicyBlocked as exc:
        err.print(f"[red]error:[/] {safe(page)} is refused by the network policy: {safe(str(exc))} (open an "
                  "address with --allow or BUSSCRAPE_NETWORK__ALLOW)")
        raise typer.Exit(EXIT_CONFIG) from None
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        err.print(f"[red]error:[/] cannot fetch {safe(page)}: {safe(said(exc))}")
        raise typer.Exit(EXIT_CONFIG) from None
    if len(got.body) > bound:
        err.print(f"[red]error:[/] {safe(page)} is over max_page_bytes ({bound} bytes; "
                  "BUSSCRAPE_WORKER__MAX_PAGE_BYTES): not read further")
        raise typer.Exit(EXIT_CONFIG)
    if got.status >= 400 or got.status == 310:
        err.print(f"[red]error:[/] cannot fetch {safe(page)}: HTTP {got.status} {safe(got.reason)}")
        raise typer.Exit(EXIT_CONFIG)
    charset = aiohttp.helpers.parse_mimetype(got.headers.get("Content-Type", "")).parameters.get("charset")
    try:
        text = got.body.decode(charset or "utf-8", "replace")
    except LookupError:  # a charset Python does not know
        text = got.body.decode("utf-8", "replace")
    return text, url or got.url


def _read_page(page: str, url: str | None) -> tuple[str, str]:
    """The HTML and URL of a saved file or an archive folder (exit 2 when unreadable)."""
    import gzip

    import orjson

    path = Path(page)
    if path.is_dir():  # an archive folder: its rendered DOM and the URL meta.json records
        meta = path / "meta.json"
        if url is None and meta.is_file():
            url = orjson.loads(meta.read_bytes()).get("final_url")
        path = next((p for p in (path / "page.html.gz", path / "page.html") if p.is_file()), path / "page.html.gz")
    try:
        data = path.read_bytes()
    except OSError as exc:
        err.print(f"[red]error:[/] cannot read {safe(page)}: {safe(exc.strerror or str(exc))}")
        raise typer.Exit(EXIT_CONFIG) from None
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data.decode("utf-8", "replace"), url or path.resolve().as_uri()


EXPORT_HELP = """Write every archived record of one extractor as JSONL, CSV or Parquet, oldest first.

Reads the archive (the local folder, or S3 when configured): the extracted.json of every
complete page folder whose record that extractor made. Each row holds the record's fields and
_task_id, _url, _scraped_at, _version. Parquet columns are typed from the extractor's file
(decimal, date, int …; items as lists of structs; needs busscrape[export]). Exit codes: 0
written (even none); 2 a bad option, an unreadable archive, an invalid extractor file, pyarrow
missing for parquet, or an extractor that neither the extractors folders nor the archive know.
"""


@app.command("export", help=EXPORT_HELP)
def export_cmd(
    extractor: str = typer.Option(..., "--extractor", metavar="NAME", help="Whose records."),
    fmt: str = typer.Option("jsonl", "--format", help="jsonl, csv or parquet."),
    since: str | None = typer.Option(None, "--since", metavar="WHEN", help="Only pages scraped since a date, a "
                                     "time (ISO 8601) or an age (7d)."),
    output: Path | None = typer.Option(None, "--output", "-o", metavar="FILE", help="Write here (default: stdout; "
                                       "parquet needs a file)."),
    archive: Path | None = typer.Option(None, "--archive", metavar="DIR", help="Read this local archive folder."),
    folder: Path | None = DIR_OPTION,
) -> None:
    from busscrape.cli.options import usage
    from busscrape.extract import export
    from busscrape.search.index import InvalidQuery, parse_since

    if fmt not in export.FORMATS:
        usage(f"--format must be jsonl, csv or parquet, not {fmt!r}")
    if fmt == "parquet" and output is None:
        usage("--format parquet writes a file: give --output FILE")
    try:
        moment = parse_since(since) if since else None
    except InvalidQuery as exc:
        usage(exc.message)
    if archive is not None and not archive.is_dir():
        usage(f"--archive {archive}: no such folder")
    from busscrape.errors import ConfigurationError

    s, registry = _registry(folder)
    try:
        if fmt == "parquet":
            export.pyarrow()  # before reading the archive
        rows = run(_records(s, archive, extractor, moment))
        definition = registry.get(extractor)
        if definition is None and not rows:  # records of an extractor whose file is gone are still exported
            registry.get_or_explain(extractor)
        names = export.columns(rows, definition)
        _write(rows, fmt, output, names, definition)
    except ConfigurationError as exc:
        usage(exc.message)
    except OSError as exc:
        usage(f"--output {output}: {exc.strerror or exc}")
    err.print(f"exported {len(rows):,} record(s) of {safe(extractor)}" + (f" to {safe(str(output))}" if output
                                                                           else ""))
    raise typer.Exit(EXIT_OK)


def _write(rows: list[dict[str, Any]], fmt: str, output: Path | None, names: list[str], definition: Any) -> None:
    from busscrape.extract import export

    if fmt == "parquet":
        assert output is not None
        export.write_parquet(rows, output, names, definition)
        return
    handle = open(output, "wb") if output is not None else sys.stdout.buffer
    try:
        if fmt == "jsonl":
            export.write_jsonl(rows, handle)
        else:
            export.write_csv(rows, handle, names)
    finally:
        if output is not None:
            handle.close()
        else:
            handle.flush()


async def _records(s: Settings, archive: Path | None, extractor: str, since: Any) -> list[dict[str, Any]]:
    from busscrape.archive.storage import open_storage
    from busscrape.extract import export

    async with open_storage(s, archive) as storage:
        return await export.records(storage, extractor, since=since, prefix=s.archive.prefix)
