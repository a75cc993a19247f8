"""``busscrape crawl SEED…``: follow links from the seeds within a scope, a depth and a budget
(and ``busscrape crawl status ID``)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import typer

from busscrape.cli import options
from busscrape.cli.app import ARCHIVE_HELP, app, archive_section, err, out, run, settings
from busscrape.errors import EXIT_PARTIAL

if TYPE_CHECKING:
    from rich.table import Table

    from busscrape.crawl.progress import CrawlSummary
    from busscrape.crawl.spec import CrawlSpec
    from busscrape.settings import Settings


HELP = """Crawl from SEED URLs: render each page, follow its links within --scope, up to --depth,
at most --max-pages pages, obeying robots.txt (--robots ignore to not), and archive every page.

Like `busscrape run`: without BUSSCRAPE_NATS__URL it runs the whole pipeline on an embedded
nats-server and returns when the crawl is done, with a summary; with a NATS URL it starts the
crawl on the fleet and waits (--detach: return at once, printing the crawl id). Every task
option (--steps, --artifacts, --label …) applies to every page of the crawl. The same command
again resumes the crawl (its id is a digest of the seeds and the options). `busscrape crawl
status ID` shows a crawl's progress. Exit codes: 0 done; 1 pages unfinished; 2 configuration;
130 interrupted.
"""


@app.command("crawl", help=HELP)
@options.task_options(hidden=("fmt", "rejects", "strict", "force"))
def crawl_cmd(
    seeds: list[str] = typer.Argument(..., metavar="SEED…", help="Start URLs (depth 0); `status ID` shows a crawl."),
    scope: str = typer.Option("host", "--scope", help="page, prefix, host, domain (registrable domain) or any."),
    include: list[str] = typer.Option([], "--include", metavar="REGEX", help="Follow only links matching one. "
                                      "Repeatable."),
    exclude: list[str] = typer.Option([], "--exclude", metavar="REGEX", help="Never follow links matching one. "
                                      "Repeatable."),
    depth: int = typer.Option(3, "--depth", help="Seeds are depth 0; links found at this depth are not followed."),
    max_pages: int | None = typer.Option(None, "--max-pages", help="At most this many pages, across the fleet."),
    sitemaps: bool = typer.Option(False, "--sitemaps", help="Also seed with the sites' sitemap URLs."),
    sitemap_since: str | None = typer.Option(None, "--sitemap-since", metavar="DATE",
                                             help="Only sitemap URLs modified since (ISO 8601)."),
    robots: str = typer.Option("obey", "--robots", help="obey or ignore robots.txt."),
    robots_agent: str = typer.Option("busscrape", "--robots-agent", help="User-agent token robots.txt is read for."),
    follow: str | None = typer.Option(None, "--follow", metavar="SELECTOR",
                                      help="CSS selector of the links to follow (default a[href], area[href], "
                                           "link[rel=next])."),
    workers: int | None = typer.Option(None, "--workers", "-w", help="Worker processes (default: cores / 2)."),
    concurrency: int | None = typer.Option(None, "--concurrency", "-c", help="Pages at once per worker."),
    archive: str | None = typer.Option(None, "--archive", metavar="WHERE", help=ARCHIVE_HELP),
    with_daemons: bool = typer.Option(False, "--with-daemons", help="With a NATS URL: run local daemons too."),
    detach: bool = typer.Option(False, "--detach", help="With a NATS URL: start the crawl and return."),
    allow: list[str] = typer.Option([], "--allow", metavar="CIDR|HOST:PORT",
                                    help="Open a non-public address to pages (repeatable)."),
    nats_url: str | None = typer.Option(None, "--nats-url", help="Use this NATS server instead of an embedded one."),
    wacz: str | None = typer.Option(None, "--wacz", metavar="NAME",
                                    help="Then package the crawl's WARCs as wacz/NAME.wacz (see busscrape wacz)."),
    output: str | None = options.OUTPUT,
    config: str | None = options.CONFIG,
    *,
    task: options.TaskFlags,
) -> None:
    import orjson

    from busscrape.cli.run import exit_code, quiet_logs

    if seeds[0] == "status":
        if len(seeds) != 2:
            options.usage("write `busscrape crawl status CRAWL_ID`")
        from busscrape.crawl.spec import CRAWL_ID

        if not CRAWL_ID.fullmatch(seeds[1]):
            options.usage(f"crawl id {seeds[1]!r}: a crawl id is 16 lower-case hex characters (printed when the "
                          "crawl starts)")
        s = settings(nats={"url": nats_url}, state_nats=True)
        progress = run(_status(s, seeds[1]))
        _print(progress, task.as_json)
        raise typer.Exit(0)
    task.check()
    options.check_output(output)
    _refuse_list_flags(task)
    if task.artifacts is None:  # a crawl is a web archive: its pages carry their WARC unless told otherwise
        from busscrape.model.messages import CRAWL_ARTIFACTS

        task.artifacts = ",".join(CRAWL_ARTIFACTS)
    base = settings()
    s = settings(nats={"url": nats_url}, worker={"concurrency": concurrency}, telemetry={"log_level": quiet_logs()},
                 archive=archive_section(archive), dispatch=task.dispatch_settings(),
                 network={"allow": [*base.network.allow, *allow]})
    task.check_extractor(s, local=not s.nats.url or with_daemons)
    spec = build_spec(s, seeds, task.defaults(), scope=scope, include=include, exclude=exclude, depth=depth,
                      max_pages=max_pages, sitemaps=sitemaps, sitemap_since=sitemap_since, robots=robots,
                      robots_agent=robots_agent, follow=follow)
    if detach:
        if not s.nats.url:
            options.usage("--detach needs a NATS URL (--nats-url, BUSSCRAPE_NATS__URL): an embedded crawl ends "
                          "with the command")
        record = run(_detach(s, spec))
        seeded = record.get("counts") or {}
        if task.as_json:
            sys.stdout.write(orjson.dumps({"crawl_id": spec.crawl_id, "seeds": seeded}).decode() + "\n")
        else:
            out.print(f"crawl {spec.crawl_id} started: {seeded.get('queued', 0)} seed(s) queued; "
                      f"`busscrape crawl status {spec.crawl_id}` follows it")
        raise typer.Exit(_seeds_said(len(record.get("queued") or ()), record.get("skipped") or []) or 0)
    from busscrape.cli.run import execute, show_outcome
    from busscrape.ops.runner import RunOptions

    opts = RunOptions(source="", defaults=task.defaults(), with_daemons=with_daemons, crawl=spec)
    opts.output = output
    if workers:
        opts.workers = workers
    summary = run(execute(s, opts))
    show_outcome(s, summary, as_json=task.as_json, wacz=wacz, archive=archive, stdout_taken=output == "-",
                 tables=(crawl_table(summary.crawl),) if summary.crawl is not None else ())
    said = None
    if summary.crawl is not None and not summary.interrupted and summary.failure is None:
        said = _seeds_said(summary.crawl.seeds_queued, summary.crawl.seeds_skipped)
    raise typer.Exit(said or exit_code(summary, False))


def _seeds_said(queued: int, skipped: list[dict[str, str]]) -> int | None:
    """Say which seeds were not queued and why; the exit code when none was (nothing to crawl)."""
    from busscrape.crawl.progress import SEED_SKIPS, unseeded

    nothing = unseeded(queued, skipped)
    if nothing is not None:
        err.print(nothing[1], soft_wrap=True, markup=False, highlight=False)
        return nothing[0]
    for seed in (s for s in skipped if s["reason"] == "blocked"):
        err.print(f"{seed['url']} not queued: {SEED_SKIPS['blocked']}", soft_wrap=True, markup=False,
                  highlight=False)
    return None


NOT_FOLLOWED = {"depth": "at --depth", "not_html": "that are not HTML",
                "redirected_out_of_scope": "redirected out of the scope",
                "follow_failed": "whose links could not be queued"}
"""Why a page's links were not followed, as the crawl table says it (``CrawlSummary.not_followed``)."""

LIST_FLAGS = {
    "--format": "a crawl's input is its SEED arguments, not a file of URL lines",
    "--rejects": "a crawl rejects no input line: its skipped links are counted by reason in its summary",
    "--strict": "a crawl rejects no input line (a bad seed already stops it with exit 2)",
    "--force": "a crawl queues each page once per crawl id; change a rule or an option to crawl again",
}
"""The shared task flags that are about a list of URL lines: refused by ``crawl``, never ignored."""


def _refuse_list_flags(task: options.TaskFlags) -> None:
    given = {"--format": task.fmt != "auto", "--rejects": task.rejects is not None, "--strict": task.strict,
             "--force": task.force}
    for flag, why in LIST_FLAGS.items():
        if given[flag]:
            options.usage(f"{flag} is not for `busscrape crawl`: {why}")


def build_spec(s: Settings, seeds: list[str], defaults: Any, **rules: Any) -> CrawlSpec:
    """The crawl's rules from the flags (exit 2 naming what is wrong)."""
    from pydantic import ValidationError

    from busscrape.crawl.run import make_spec
    from busscrape.errors import InputError

    try:
        return make_spec(s, seeds, steps=defaults.steps, options=defaults.options, labels=defaults.labels, **rules)
    except InputError as exc:
        options.usage(exc.message)
    except ValidationError as exc:
        options.usage("; ".join(flag_error(e) for e in exc.errors()[:5]))


def flag_error(error: Any) -> str:
    """One pydantic error of a crawl rule as the flag, the value and what the flag accepts
    (``--scope 'bogus': must be one of 'page', 'prefix', 'host', 'domain' or 'any'``)."""
    field = str(error["loc"][0]) if error["loc"] else ""
    flag, given, ctx = "--" + field.replace("_", "-"), error.get("input"), error.get("ctx") or {}
    if error["type"] == "value_error":  # the rule's own validator names the value
        return f"{flag}: {ctx.get('error', error['msg'])}"
    if error["type"] == "literal_error":
        why = f"must be one of {ctx['expected']}"
    elif field == "sitemap_since":
        why = "must be an ISO 8601 date or time (2026-01-31, 2026-01-31T12:00:00Z)"
    elif "ge" in ctx or "le" in ctx:
        why = "must be " + " and ".join(part for part in (f"at least {ctx['ge']}" if "ge" in ctx else "",
                                             f"at most {ctx['le']}" if "le" in ctx else "") if part)
    else:
        why = error["msg"]
    return f"{flag} {given!r}: {why}" if field else why


async def _detach(s: Settings, spec: CrawlSpec) -> dict[str, Any]:
    from busscrape.bus.connection import Bus
    from busscrape.crawl.run import start_crawl

    async with await Bus.connect(s, name="busscrape-crawl") as bus:
        return await start_crawl(bus, s, spec)


async def _status(s: Settings, crawl_id: str) -> CrawlSummary:
    from busscrape.bus.connection import Bus
    from busscrape.crawl.run import crawl_status

    async with await Bus.connect(s, name="busscrape-crawl-status") as bus:
        summary = await crawl_status(bus, crawl_id)
    if summary is None:  # as `dlq show` of no letter: not found is 1, a malformed id 2
        err.print(f"no crawl {crawl_id} on this server", soft_wrap=True, markup=False, highlight=False)
        raise typer.Exit(EXIT_PARTIAL)
    return summary


def _print(summary: CrawlSummary, as_json: bool) -> None:
    import orjson

    if as_json:
        sys.stdout.write(orjson.dumps(summary.as_dict(), option=orjson.OPT_NON_STR_KEYS).decode() + "\n")
    else:
        out.print(crawl_table(summary))


def crawl_table(summary: CrawlSummary) -> Table:
    from rich.table import Table

    depths = sorted(summary.by_depth)
    table = Table("links", "total", *(f"depth {d}" for d in depths), title=f"crawl {summary.crawl_id}",
                  title_justify="left")
    for outcome, total in summary.links.items():
        if total or outcome in ("discovered", "queued"):
            table.add_row(outcome.replace("_", " "), f"{total:,}",
                          *(f"{summary.by_depth[d].get(outcome, 0):,}" for d in depths))
    queued = (f"{summary.budget_used:,} of --max-pages {summary.max_pages:,} queued" if summary.max_pages is not None
              else f"{summary.budget_used:,} queued")
    table.caption = f"{summary.archived:,} pages archived, {summary.dead:,} dead, {queued}"
    if summary.not_followed:
        table.caption += "; links not followed on " + ", ".join(
            f"{n:,} page(s) {NOT_FOLLOWED.get(why, why)}" for why, n in summary.not_followed.items())
    for seed, landed in summary.seeds_redirected.items():
        table.caption += f"; seed {seed} redirected to {landed} (in the scope now)"
    return table

