"""The console's Pages view and ``GET /search`` with filters inside the query, on both backends: more
pages of one crawl and status than a page of results holds, every one of them reached by following
"next" (no repeat, none missed), with or without words; ``busscrape search`` takes the same filters.
"""

from __future__ import annotations

import html
import re

import aiohttp
import orjson
import pytest

from busscrape.api.server import ApiServer
from busscrape.search import open_index
from busscrape.settings import settings_env
from tests.api.test_server import AUTH, api_settings, call  # noqa: F401  (fixtures)
from tests.search.test_filters import CRAWL_A, CRAWL_B, pages, wanted
from tests.support import cli

KEY = re.compile(r'<li class="hit" data-key="([^"]+)"')
NEXT = re.compile(r'<a id="next" href="([^"]+)"')


@pytest.fixture(params=["sqlite", "postgres"])
def on_backend(request, api_settings, tmp_path):  # noqa: F811
    """API settings on one backend (PostgreSQL: a fresh database on the session's server)."""
    search = {"backend": request.param, "sqlite_path": str(tmp_path / "idx.sqlite3")}
    if request.param == "postgres":
        search["postgres_dsn"] = request.getfixturevalue("pg_dsn")
    return api_settings.with_overrides(search=search)


@pytest.fixture
async def indexed(on_backend):
    """Those settings, their index holding ``pages()`` (130 pages, 60 of crawl A that answered 200)."""
    s = on_backend
    async with open_index(s) as index:
        await index.add(pages())
    return s


async def follow(http: aiohttp.ClientSession, path: str) -> tuple[list[str], int]:
    """The archive keys listed by a Pages view and every page its "next" link leads to."""
    keys, views = [], 0
    next_path: str | None = path
    while next_path is not None:
        async with http.get(next_path) as response:
            assert response.status == 200, await response.text()
            body = await response.text()
        views += 1
        keys += [html.unescape(k) for k in KEY.findall(body)]
        found = NEXT.search(body)
        next_path = html.unescape(found.group(1)) if found else None
    return keys, views


async def test_the_pages_view_pages_through_every_page_of_a_crawl_and_status(applied, indexed):
    a200 = wanted(lambda p: p.crawl_id == CRAWL_A and p.status == 200)
    async with ApiServer(applied, indexed) as api, aiohttp.ClientSession(base_url=api.url, headers=AUTH) as http:
        for words in ("q=quokka&", ""):
            keys, views = await follow(http, f"/console/pages?{words}crawl={CRAWL_A}&status=200")
            assert len(keys) == len(set(keys)) == len(a200) > 50 and set(keys) == a200, words
            assert views == 2  # 50 on the first, the other 10 on the second
        # A crawl's pages listed newest first, from the crawl page's own link.
        keys, _ = await follow(http, f"/console/pages?crawl={CRAWL_B}")
        assert keys == [p.archive_key for p in sorted((p for p in pages() if p.crawl_id == CRAWL_B),
                                                      key=lambda p: (p.scraped_at, p.archive_key), reverse=True)]
        async with http.get("/console/pages", params={"crawl": "nothex", "status": "200"}) as response:
            assert response.status == 400 and "a crawl id is 16 lower-case hex" in await response.text()


async def test_get_search_takes_the_same_filters_and_pages(applied, indexed):
    a404 = wanted(lambda p: p.crawl_id == CRAWL_A and p.status == 404)
    async with ApiServer(applied, indexed) as api, aiohttp.ClientSession(base_url=api.url, headers=AUTH) as http:
        seen, offset = [], 0
        while True:
            status, body = await call(http, "GET", "/search",
                                      params={"crawl": CRAWL_A, "status": "404", "limit": "3", "offset": str(offset)})
            assert status == 200 and body["offset"] == offset and body["query"] == ""
            seen += [h["archive_key"] for h in body["results"]]
            if not body["more"]:
                break
            offset += 3
        assert sorted(seen) == sorted(a404) and all(h["status"] == 404 for h in body["results"])
        for params, says in [({"status": "ok"}, "status must be an integer"), ({"status": "99"}, "HTTP status"),
                             ({"q": "x", "offset": "-1"}, "offset"), ({"crawl": "x" * 17}, "crawl id")]:
            status, body = await call(http, "GET", "/search", params=params)
            assert status == 400 and says in body["error"]["message"], (params, body)


def test_the_search_command_takes_crawl_status_and_offset(indexed):
    def search(*args: str) -> dict:
        done = cli.busscrape("search", "--json", *args, env=settings_env(indexed), timeout=60)
        assert done.returncode == 0, done.stderr
        return orjson.loads(done.stdout)

    a200 = wanted(lambda p: p.crawl_id == CRAWL_A and p.status == 200)
    first = search("--crawl", CRAWL_A, "--status", "200", "--limit", "40")
    rest = search("--crawl", CRAWL_A, "--status", "200", "--limit", "40", "--offset", "40")
    assert first["more"] and not rest["more"] and len(first["results"]) == 40 and len(rest["results"]) == 20
    assert {h["archive_key"] for h in first["results"] + rest["results"]} == a200
    ranked = search("quokka", "--crawl", CRAWL_A, "--status", "200", "--limit", "100")
    assert {h["archive_key"] for h in ranked["results"]} == a200 and not ranked["more"]
