"""``busscrape demo``: the bundled demo site, scraped end to end on the embedded default."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from busscrape.cli.app import app, err, out, plain, run, settings
from busscrape.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_PARTIAL

if TYPE_CHECKING:
    from rich.tree import Tree

    from busscrape.ops.runner import RunSummary
    from busscrape.settings import Settings


EXPECTED_DEAD = {"/missing.html": "http_404", "/shop/mystery.html": "extraction_failed"}
CRAWL_PAGES = 5  # the demo's crawl: from the home page, one link deep, at most this many pages


@app.command("demo")
def demo_cmd(
    workers: int = typer.Option(1, "--workers", "-w", help="Worker processes."),
    archive: Path | None = typer.Option(None, "--archive", help="Archive folder (default .busscrape/archive)."),
) -> None:
    """Serve a small demo site on loopback and run the whole pipeline on it, offline.

    Starts an embedded nats-server, a worker and an ingester; scrapes seven pages (static,
    JavaScript-rendered, slow, images, a redirect, an index and a broken link) and a shop whose
    product pages run the demo extractor (extractors/demo-product.toml); ends with the archive
    tree and one meta.json. The broken link is dead-lettered (http_404), and so is the product
    without a price (extraction_failed), as they should. Then a small crawl (`busscrape crawl`)
    of the same site: from the home page, links one deep, at most five pages.
    """
    from rich.syntax import Syntax

    from busscrape.cli.run import how_to_look, quiet_logs, summary_table

    s = settings(archive={"dir": archive}, telemetry={"log_level": quiet_logs()})
    if s.nats.url:
        err.print("[yellow]note:[/] busscrape demo always uses its own embedded nats-server; "
                  "ignoring BUSSCRAPE_NATS__URL")
    summary, origin, crawled = run(_demo(s.with_overrides(nats={"url": None}), workers))
    out.print(summary_table(summary))
    out.print(_tree(summary, origin))
    meta = _one_meta(summary, origin)
    if meta is not None:
        out.print(f"\n[bold]{meta}[/]")
        pretty = json.dumps(json.loads(meta.read_text()), indent=2)
        # Highlighted on a terminal; off one, the JSON as it is (Syntax pads every line to the width).
        out.print(Syntax(pretty, "json", word_wrap=True) if out.is_terminal else plain(pretty))
    from busscrape.cli.crawl import crawl_table

    if crawled.crawl is not None:
        out.print(crawl_table(crawled.crawl))
    out.print(how_to_look(summary, s), soft_wrap=True)
    code = _verdict(summary) or _crawl_verdict(crawled)
    _dataset(dataset_path(s).resolve())
    raise typer.Exit(code)


def dataset_path(s: Settings) -> Path:
    """Where the demo writes its dataset (``-o``): both runs' pages, one row each."""
    return s.state_dir / "demo-pages.jsonl"


def _dataset(path: Path) -> None:
    """The demo's last words: the dataset it wrote, and how to read it."""
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    out.print(f"\n[bold]dataset: {path}[/] ({len(rows)} rows, one per page; `-o FILE` on run and crawl writes one)")
    for row in rows[:3]:
        out.print(plain(json.dumps({k: row[k] for k in ("url", "status", "title", "extracted", "dead_reason")})),
                  soft_wrap=True)
    out.print(f"  duckdb -c \"select url, status, title, dead_reason from read_json_auto('{path}')\"", soft_wrap=True)


async def _demo(s, workers: int) -> tuple[RunSummary, str, RunSummary]:  # type: ignore[no-untyped-def]
    from busscrape.cli.run import execute
    from busscrape.crawl.run import make_spec
    from busscrape.extract.registry import bundled_dir
    from busscrape.ops.demo_site import DemoSite
    from busscrape.ops.runner import RunOptions

    async with DemoSite() as site:
        # Open exactly the demo's origin to the browser: everything else stays refused.
        s = s.model_copy(update={"nats": s.nats.model_copy(update={"url": None}),
                                 "network": s.network.model_copy(update={"allow": [site.origin]})})
        # The shop's product pages run the bundled demo extractor (extractors/demo-product.toml).
        s = s.with_overrides(extract={"dir": bundled_dir()})
        dataset = dataset_path(s)
        dataset.unlink(missing_ok=True)  # this demo's pages only
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", prefix="busscrape-demo-", delete=False) as f:
            f.write("".join(json.dumps(spec) + "\n" for spec in site.specs()))
        try:
            summary = await execute(s, RunOptions(source=f.name, workers=workers, output=str(dataset)))
        finally:
            Path(f.name).unlink(missing_ok=True)
        if summary.interrupted:
            return summary, site.origin, summary
        spec = make_spec(s, [f"http://{site.origin}/"], depth=1, max_pages=CRAWL_PAGES, labels={"demo": "crawl"})
        crawled = await execute(s, RunOptions(source="", workers=workers, crawl=spec, output=str(dataset)))
        return summary, site.origin, crawled


def _folders(summary: RunSummary, origin: str) -> list[Path]:
    """This run's folders (earlier demos archived other ports' pages beside them)."""
    return [Path(loc.removeprefix("file://")) for loc in summary.locations if loc.startswith("file://")]


def _tree(summary: RunSummary, origin: str) -> Tree:
    from rich.tree import Tree

    root = Path(summary.archive)
    tree = Tree(f"[bold]{root}[/]")
    for folder in _folders(summary, origin):
        branch = tree.add(str(folder.relative_to(root)))
        for file in sorted(folder.iterdir()):
            branch.add(f"{file.name}  [dim]{file.stat().st_size:,} bytes[/]")
    dead = sorted(root.glob("deadletter/dt=*/*.json"))[-3:]
    for letter in dead:
        tree.add(f"[red]{letter.relative_to(root)}[/]")
    return tree


def _one_meta(summary: RunSummary, origin: str) -> Path | None:
    metas = [f / "meta.json" for f in _folders(summary, origin) if (f / "meta.json").exists()]
    return max(metas, key=lambda p: p.stat().st_mtime) if metas else None


def _crawl_verdict(crawled: RunSummary) -> int:
    if crawled.interrupted:
        return EXIT_INTERRUPTED
    if crawled.crawl is not None and crawled.archived == CRAWL_PAGES:
        out.print(f"[green]crawl ok:[/] {CRAWL_PAGES} pages of the demo site crawled from its home page "
                  f"(crawl {crawled.crawl.crawl_id})")
        return EXIT_OK
    err.print(f"[red]crawl incomplete:[/] {crawled.archived} archived, expected {CRAWL_PAGES}")
    return EXIT_PARTIAL


def _verdict(summary: RunSummary) -> int:
    from busscrape.ops.demo_shop import SHOP_PATHS
    from busscrape.ops.demo_site import DEMO_PATHS

    if summary.interrupted:
        return EXIT_INTERRUPTED
    expected_archived = len(DEMO_PATHS) + len(SHOP_PATHS) - len(EXPECTED_DEAD)
    expected_dead = {reason: 1 for reason in EXPECTED_DEAD.values()}
    if summary.archived == expected_archived and dict(summary.dead_reasons) == expected_dead:
        out.print(f"[green]demo ok:[/] {expected_archived} pages archived (3 products with their extracted record), "
                  "the broken link dead-lettered (http_404) and the product without a price (extraction_failed)")
        return EXIT_OK
    err.print(f"[red]demo incomplete:[/] {summary.archived} archived, dead: {dict(summary.dead_reasons)}; "
              f"expected {expected_archived} archived, one http_404 and one extraction_failed")
    return EXIT_PARTIAL
