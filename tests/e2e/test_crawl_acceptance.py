"""#35's "done means", as one ``busscrape crawl`` (real nats-server, two Chromium workers, an
ingester, the CLI) over a loopback site that has every hard part at once:

- a robots.txt over 16 KiB sent in 8 KiB writes, whose only rules (``Disallow: /secret`` and
  ``Crawl-delay: 2``) are its last lines (``tests.crawl.test_robots.big_robots``);
- a sitemap of 3,000 URLs (and the long-links page, a leaf, and a disallowed page);
- a page of 5,000 links of 330 characters (``tests.crawl.test_sizes``);
- every page in a session whose login types a password; the site forgets the first login when
  the leaf is asked for, so that page fails the session's check and the session logs in again.

The crawl obeys every rule (no disallowed page is ever requested, page requests are at least the
Crawl-delay apart as the site sees them), seeds every sitemap URL within its budget (the rest
counted as cut by the budget), archives the long-links page once on its first attempt, finishes
on its own, and no archived file (HTML, HAR, WARC, the WACZ and what it holds) has the password.
The workers log at info (``<state>/logs``) so that a failure here can be read.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import threading
import time
import zipfile
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

import pytest
from aiohttp import web

from tests.crawl.test_robots import big_robots, serve_in_writes
from tests.crawl.test_sitemaps import urlset
from tests.e2e.test_crawl import archived_paths
from tests.e2e.test_run import cli, metas, run_env
from tests.worker.test_sessions import PASSWORD, password_sessions_file

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]

SITEMAP_URLS, LINKS, LENGTH = 3000, 5000, 330
CRAWL_DELAY = 2.0  # big_robots' Crawl-delay
BUDGET = 6
NOT_PAGES = {"/robots.txt", "/sitemap.xml", "/login", "/welcome", "/favicon.ico"}


class SessionSite:
    """Pages that need the session's cookie (else a "login please" page without ``#logout``),
    and a login form whose password is checked. ``forget_on``: the path whose first request
    with the first login's cookie makes the site forget that login."""

    def __init__(self, site, forget_on: str) -> None:
        self.site, self.forget_on = site, forget_on
        self.logins = 0
        self.valid_from = 1
        self.pages: list[tuple[str, float]] = []
        """(path, arrival) of every page request on the seed host, wall clock."""
        self.lock = threading.Lock()

    def install(self, bodies: dict[str, str]) -> None:
        site = self.site

        @site.route("/login")
        async def login(request: web.Request) -> web.StreamResponse:
            if request.method == "POST":
                form = await request.post()
                if form.get("pw") != PASSWORD:
                    return web.Response(status=403, text="wrong password")
                self.logins += 1
                response = web.HTTPSeeOther("/welcome")
                response.set_cookie("sid", f"ok.{self.logins}", httponly=True)
                raise response
            return web.Response(text="<title>login</title><form method=post action=/login><input id=user name=user>"
                                     "<input id=pw name=pw type=password><button id=go type=submit>in</button></form>",
                                content_type="text/html")

        site.page("/welcome", "<title>welcome</title>")

        async def page(request: web.Request) -> web.StreamResponse:
            with self.lock:
                self.pages.append((request.path, time.time()))
            login = int(request.cookies.get("sid", "ok.0").removeprefix("ok.") or 0)
            if request.path == self.forget_on and login == 1:
                self.valid_from = 2  # the site forgets the first login: this page fails the check
            if login < max(self.valid_from, 1):
                return web.Response(text="<title>login please</title>", content_type="text/html")
            return web.Response(text=bodies.get(request.path, f"<title>{request.path}</title><p>page</p>")
                                + "<a id=logout href=/logout>out</a>", content_type="text/html")

        for path in bodies:
            site.route(path)(page)
        for i in range(SITEMAP_URLS):
            site.route(f"/s/{i}")(page)
        for i in range(3):
            site.route(f"/secret/{i}")(page)


def gaps(times: Iterable[float]) -> list[float]:
    return [later - earlier for earlier, later in itertools.pairwise(sorted(times))]


# The HAR's phases from a request's start to the first byte of its answer ("ssl" is part of "connect").
TO_FIRST_BYTE = ("blocked", "dns", "connect", "send", "wait")


def page_requests(archive: Path) -> tuple[list[float], float]:
    """Each archived page's request as its HAR has it (the epoch seconds Chromium started it), and
    the longest any of them took from that start to the first byte of the site's answer (seconds):
    the site's handler saw each request within that much of its start."""
    started, to_first_byte = [], [0.0]
    for meta_file in archive.glob("dt=*/host=*/*/meta.json"):
        url = json.loads(meta_file.read_text())["url"]
        har = json.loads(gzip.decompress((meta_file.parent / "page.har.gz").read_bytes()))
        [entry] = [e for e in har["log"]["entries"] if e["request"]["url"] == url][:1]
        started.append(datetime.fromisoformat(entry["startedDateTime"]).timestamp())
        to_first_byte.append(sum(max(entry["timings"].get(phase, 0), 0) for phase in TO_FIRST_BYTE) / 1000)
    return started, max(to_first_byte)


def unpacked(path: Path) -> list[bytes]:
    """The file's bytes as a reader of the archive gets them: gunzipped, a WACZ's every member
    (each gunzipped too)."""
    data = path.read_bytes()
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as wacz:
            return [data, *(gunzip(wacz.read(name)) for name in wacz.namelist())]
    return [data, gunzip(data)]


def gunzip(data: bytes) -> bytes:
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


async def test_a_crawl_with_every_hard_part_obeys_seeds_archives_once_finishes_and_keeps_no_password(tmp_path, site):
    seed_host = site.hosts[0]
    stem = site.url("/far/", host=1)
    hrefs = [f"{stem}{i:05d}-" + "x" * (LENGTH - len(stem) - 6) for i in range(LINKS)]
    assert all(len(h) == LENGTH for h in hrefs)
    bodies = {
        "/": "<title>home</title><a href='/b'>b</a><a href='/many'>many</a><a href='/secret/0'>s</a>"
             "<a href='/s/0'>s0</a>",
        "/many": "<title>many</title>" + "".join(f"<a href='{h}'>l</a>" for h in hrefs),
        "/b": "<title>leaf</title><a href='/secret/1'>s</a>",
    }
    pages = SessionSite(site, forget_on="/b")
    pages.install(bodies)
    robots = big_robots(40_000)
    assert len(robots) > 16 * 1024 and robots.endswith(b"Crawl-delay: 2\nDisallow: /secret\n")
    serve_in_writes(site, "/robots.txt", robots)
    listed = [site.url("/many"), site.url("/b"), site.url("/secret/2"),
              *(site.url(f"/s/{i}") for i in range(SITEMAP_URLS))]
    serve_in_writes(site, "/sitemap.xml", urlset(listed), "application/xml")
    sessions = password_sessions_file(tmp_path, "shop", site.url("/login"))
    env = run_env(tmp_path, site, BUSSCRAPE_WORKER__SESSIONS_FILE=str(sessions), BUSSCRAPE_TELEMETRY__LOG_LEVEL="info")
    proc = cli(["crawl", site.url("/"), "--workers", "2", "--json", "--sitemaps", "--depth", "1",
                "--max-pages", str(BUDGET), "--session", "shop", "--artifacts", "html,har,warc",
                "--timeout", "90s", "--wacz", "acceptance"], tmp_path, env)
    output, _ = await asyncio.to_thread(proc.communicate, timeout=900)  # finishes on its own
    (tmp_path / "crawl.out").write_text(output)
    assert proc.returncode == 0, output[-3000:]
    summary = json.loads([line for line in output.splitlines() if line.startswith("{")][-1])
    crawl = summary["crawl"]

    # Obeys every rule: robots.txt's last lines, as the site's own log shows.
    asked = {path for (host, path), n in site.hits.items() if host == seed_host and n}
    assert not any(p.startswith("/secret") for p in asked), sorted(asked)
    assert site.hits[(seed_host, "/robots.txt")] >= 1
    # The Crawl-delay between page requests: as the browser sent them (each page's HAR, Chromium's
    # own start of the request), and as the site saw them, less the longest a page's request took
    # to its first byte of answer. The site stamps a request in its handler, somewhere between
    # the request's start and that first byte, and a loaded machine runs it late: the home page
    # once waited 1.06 s for its answer and its stamp came 1.11 s before the next; a request once
    # reached the handler ~80 ms after it started while the next came at once (1.95 s between the
    # stamps, 2.0 s between the starts), which the wait alone (29 ms) did not cover.
    archive = tmp_path / "state" / "archive"
    sent, first_byte_within = page_requests(archive)
    between = gaps(sent)
    assert len(sent) == BUDGET and min(between) >= CRAWL_DELAY, between
    seen = gaps(t for path, t in pages.pages if path not in NOT_PAGES)
    assert seen and min(seen) >= CRAWL_DELAY - first_byte_within, (seen, first_byte_within)

    # Seeds every sitemap URL within the budget: the budget's pages archived, the rest counted.
    paths = archived_paths(archive)
    assert sum(paths.values()) == BUDGET and all(n == 1 for n in paths.values()), paths
    assert {"", "many", "b"} <= set(paths), paths
    assert crawl["seeds_queued"] == BUDGET, crawl["seeds_queued"]
    links = crawl["links"]
    assert links["robots_disallowed"] >= 2, links  # /secret/2 from the sitemap, /secret/0 from the index
    assert links["budget_cut"] >= SITEMAP_URLS - BUDGET, links

    # The long-links page: archived once, on its first attempt, nothing dead.
    [many] = [m for m in metas(archive).values() if m["url"] == site.url("/many")]
    assert many["attempt"] == 1 and crawl["dead"] == 0, (many["attempt"], crawl)

    # The session logged in again (the leaf failed its check), and no archived file holds the
    # password: every file under the archive, gunzipped, and the WACZ's every member.
    assert pages.logins == 2  # the first login, and once again for the fleet (stored at once: #35 acceptance)
    files = [p for p in archive.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wacz" for p in files) and any(p.name == "page.har.gz" for p in files)
    for path in files:
        for data in unpacked(path):
            assert PASSWORD.encode() not in data, path
