"""Extracted records in the search index, on both backends: their text is found, their fields filter."""

from __future__ import annotations

import sqlite3

import pytest

from busscrape.search import open_index
from busscrape.search.index import InvalidQuery, SearchQuery
from tests.search.test_search import backend, page  # noqa: F401 - the fixture is used by name

KETTLE = {"name": "Trail Kettle", "price": "1299.00", "currency": "EUR", "availability": "InStock",
          "reviews": [{"author": "Ana", "rating": 5, "date": "2025-03-02"}]}
LANTERN = {"name": "Night Lantern", "price": "24.50", "currency": "EUR", "availability": "PreOrder",
           "reviews": [{"author": "Noor", "rating": 4, "date": "2025-05-01"}]}


def product(key: str, record: dict | None, text: str = "a product page") -> object:
    base = page(key, f"Shop: {key}", text)
    return type(base)(**{**{f: getattr(base, f) for f in base.__slots__}, "extractor": "demo-product",
                         "record": record})


async def test_extracted_values_are_found_and_fields_filter(backend):  # noqa: F811
    async with open_index(backend) as index:
        await index.add([product("kettle", KETTLE), product("lantern", LANTERN), page("plain", "Plain", "a page")])
        # "Ana" is only in the record (a reviewer): found through the extracted text.
        hits = await index.search(SearchQuery.parse("Ana"))
        assert [h.archive_key.rsplit("/", 1)[1] for h in hits] == ["kettle"]
        assert hits[0].record == KETTLE and hits[0].extractor == "demo-product"

        def keys(hits):
            return sorted(h.archive_key.rsplit("/", 1)[1] for h in hits)

        # Decimals are strings in the record, compared as numbers: 1299.00 is not under 100.
        assert keys(await index.search(SearchQuery.parse("product", where=["price<100"]))) == ["lantern"]
        assert keys(await index.search(SearchQuery.parse("product", where=["price>=1000"]))) == ["kettle"]
        assert keys(await index.search(SearchQuery.parse("product", where=["currency=EUR"]))) == ["kettle",
                                                                                                   "lantern"]
        assert keys(await index.search(SearchQuery.parse("product", where=["currency=EUR",
                                                                           "availability!=InStock"]))) == ["lantern"]
        # A text field compared with a number is not a number: no match rather than a cast error.
        assert await index.search(SearchQuery.parse("product", where=["name<100"])) == []
        # A page without a record never passes a filter.
        assert keys(await index.search(SearchQuery.parse("page", where=["price>0"]))) == ["kettle", "lantern"]


@pytest.mark.parametrize("bad", ["price", "price<", "1price<3", "price~3", "pr ice<3"])
def test_malformed_filters_are_refused_with_the_form(bad):
    with pytest.raises(InvalidQuery, match="FIELD<VALUE"):
        SearchQuery.parse("x", where=[bad])


async def test_a_version_1_index_is_migrated_and_keeps_its_pages(tmp_path, nats_url):
    from tests.conftest import make_settings

    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE pages (id INTEGER PRIMARY KEY, archive_key TEXT NOT NULL UNIQUE, task_id TEXT NOT NULL,
            url TEXT NOT NULL, host TEXT NOT NULL, title TEXT NOT NULL, body TEXT NOT NULL,
            scraped_at TEXT NOT NULL, indexed_at TEXT NOT NULL DEFAULT '');
        CREATE VIRTUAL TABLE pages_fts USING fts5(title, body, url, content='pages', content_rowid='id');
        INSERT INTO pages (archive_key, task_id, url, host, title, body, scraped_at)
        VALUES ('dt=x/host=a/old', 'old', 'http://a/old', 'a', 'Old page', 'wombat', '2025-01-01T00:00:00+00:00');
        INSERT INTO pages_fts(pages_fts) VALUES ('rebuild');
        PRAGMA user_version=1;""")
    db.close()
    s = make_settings(tmp_path, nats_url, search={"backend": "sqlite", "sqlite_path": str(path)})
    async with open_index(s) as index:
        assert [h.title for h in await index.search(SearchQuery.parse("wombat"))] == ["Old page"]
        await index.add([product("kettle", KETTLE)])
        assert len(await index.search(SearchQuery.parse("Kettle", where=["price>1"]))) == 1
