"""Filters (host, since, crawl, HTTP status, record fields) inside the search query on both backends,
with and without text, and paging through every matching page in a stable order.

More pages match than one page of results holds (and more than the console's 50), so a filter
that only narrowed the best hits, or a page order that repeated or skipped rows, shows.
"""

from __future__ import annotations

import sqlite3
from datetime import timedelta

import pytest

from busscrape.search import open_index
from busscrape.search.index import IndexedPage, InvalidQuery, SearchPage, SearchQuery
from tests.search.test_search import NOW, backend  # noqa: F401  (the both-backends fixture)

CRAWL_A, CRAWL_B = "a" * 16, "b" * 16


def pages() -> list[IndexedPage]:
    """130 pages holding "quokka": crawl A 70 (60 answered 200, 10 404), crawl B 40, no crawl 20.
    Every tenth page shares its scrape time with the one before: only the tie-break orders them."""
    made = []
    for n in range(130):
        crawl = CRAWL_A if n < 70 else CRAWL_B if n < 110 else None
        status = 404 if n % 7 == 0 and n < 70 else 200
        host = "a.example" if n % 2 else "b.example"
        minutes = n - 1 if n % 10 == 1 else n
        made.append(IndexedPage(archive_key=f"dt=x/host={host}/{n:032x}", task_id=f"{n:032x}",
                                url=f"http://{host}/p{n}", host=host, title=f"page {n}",
                                text=f"a quokka, page {n}" + (" marsupial" if n % 3 == 0 else ""),
                                scraped_at=NOW - timedelta(minutes=minutes), crawl_id=crawl, status=status,
                                extractor="demo", record={"n": n}))
    return made


def wanted(test) -> set[str]:
    return {p.archive_key for p in pages() if test(p)}


async def every_page(index, text: str, limit: int = 25, **filters) -> list:
    """Every result of a query, a page of results at a time."""
    found, offset = [], 0
    while True:
        batch = await index.page(SearchQuery.parse(text, limit=limit, offset=offset, **filters))
        found += batch.hits
        if not batch.more:
            return found
        offset += limit


async def test_filters_keep_every_matching_page_across_pages_of_results(backend):  # noqa: F811
    async with open_index(backend) as index:
        await index.add(pages())
        a200 = wanted(lambda p: p.crawl_id == CRAWL_A and p.status == 200)
        assert len(a200) > 50
        for text in ("quokka", ""):
            hits = await every_page(index, text, crawl=CRAWL_A, status=200)
            keys = [h.archive_key for h in hits]
            assert len(keys) == len(set(keys)) and set(keys) == a200, text
            assert {(h.crawl_id, h.status) for h in hits} == {(CRAWL_A, 200)}

        # No text: newest first, the archive key breaking ties.
        listed = await every_page(index, "", limit=30, crawl=CRAWL_A)
        assert [h.archive_key for h in listed] == [
            p.archive_key for p in sorted((p for p in pages() if p.crawl_id == CRAWL_A),
                                          key=lambda p: (p.scraped_at, p.archive_key), reverse=True)]
        assert all(h.snippet.startswith("a quokka, page") and h.score == 0 for h in listed)

        # Text and every kind of filter at once.
        since = NOW - timedelta(minutes=100)
        hits = await every_page(index, "marsupial", limit=3, crawl=CRAWL_B, status=200, host="a.example", since=since,
                                where=["n>=80"])
        assert {h.archive_key for h in hits} == wanted(
            lambda p: p.crawl_id == CRAWL_B and p.host == "a.example" and p.scraped_at >= since
            and p.record["n"] >= 80 and "marsupial" in p.text)
        assert hits and len(hits) > 1
        assert {h.archive_key for h in await every_page(index, "", status=404)} == wanted(lambda p: p.status == 404)
        assert await index.page(SearchQuery.parse("quokka", crawl="c" * 16)) == SearchPage(hits=[], more=False)


async def test_pages_of_ranked_results_neither_repeat_nor_skip(backend):  # noqa: F811
    async with open_index(backend) as index:
        await index.add(pages())
        whole = await index.search(SearchQuery.parse("quokka", limit=130, max_limit=1000))
        paged = await every_page(index, "quokka", limit=9)
        assert [h.archive_key for h in paged] == [h.archive_key for h in whole]
        assert len(paged) == 130


@pytest.mark.parametrize(("kwargs", "says"), [
    ({}, "the query is empty"), ({"crawl": "abc"}, "crawl id"), ({"crawl": "A" * 17}, "crawl id"),
    ({"status": 99}, "status"), ({"status": 600}, "status"), ({"offset": -1}, "offset"),
    ({"offset": 100_001, "host": "a"}, "offset")])
def test_bad_filters_are_refused_by_name(kwargs, says):
    with pytest.raises(InvalidQuery) as refused:
        SearchQuery.parse(" ", **kwargs)
    assert says in refused.value.message


async def test_an_index_file_of_version_2_gains_the_crawl_and_status_columns(tmp_path, nats_url):
    from tests.conftest import make_settings

    settings = make_settings(tmp_path, nats_url, search={"backend": "sqlite", "sqlite_path": str(tmp_path / "i.db")})
    async with open_index(settings) as index:
        await index.add(pages()[:3])
    # What version 2 wrote: no crawl or status columns (nor their indexes).
    db = sqlite3.connect(tmp_path / "i.db")
    db.executescript("DROP INDEX pages_crawl; DROP INDEX pages_newest; ALTER TABLE pages DROP COLUMN crawl_id;"
                     "ALTER TABLE pages DROP COLUMN status; PRAGMA user_version=2;")
    db.close()
    async with open_index(settings) as index:
        assert await index.search(SearchQuery.parse("", status=200)) == []  # rows of version 2: not known
        await index.add(pages()[:3])
        assert {h.status for h in await index.search(SearchQuery.parse("quokka", crawl=CRAWL_A))} == {200, 404}
