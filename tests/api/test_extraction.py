"""The API's side of extraction: ``extractor`` in POST /tasks, ``where`` in GET /search."""

from __future__ import annotations

from datetime import UTC, datetime

from busscrape.model.messages import TaskOptions, task_key
from busscrape.search import open_index
from busscrape.search.index import IndexedPage
from tests.api.test_server import api, api_settings, call, error_of, http  # noqa: F401 - fixtures


async def test_post_tasks_takes_an_extractor_for_urls_and_per_spec(applied, http):  # noqa: F811
    status, body = await call(http, "POST", "/tasks", json={"urls": ["https://example.com/p1"],
                                                            "extractor": "demo-product"})
    assert status == 202, body
    assert body["tasks"][0]["task_id"] == task_key("https://example.com/p1", (), TaskOptions(extractor="demo-product"))
    status, body = await call(http, "POST", "/tasks", json={"tasks": [
        {"url": "https://example.com/p2", "extractor": "demo-product"},
        {"url": "https://example.com/p3", "extractor": "Not A Name"}]})
    assert status == 202, body
    good, bad = body["tasks"]
    assert good["task_id"] == task_key("https://example.com/p2", (), TaskOptions(extractor="demo-product"))
    assert bad["outcome"] == "rejected" and "extractor" in bad["detail"]
    status, body = await call(http, "POST", "/tasks", json={"url": "https://example.com/", "extractor": "Bad Name"})
    assert status == 400 and error_of(body) == "invalid_request" and "extractor" in body["error"]["message"]


async def test_search_filters_on_extracted_fields(api_settings, http):  # noqa: F811
    now = datetime.now(UTC)
    async with open_index(api_settings) as index:
        await index.add([IndexedPage(archive_key=f"dt=x/host=a/{name}", task_id=name * 32, url=f"http://a/{name}",
                                     host="a", title="Kettle", text="kettle", scraped_at=now,
                                     extractor="demo-product", record={"price": price})
                         for name, price in (("1", "12.50"), ("2", "120.00"))])
    status, body = await call(http, "GET", "/search", params=[("q", "kettle"), ("where", "price<100")])
    assert status == 200, body
    assert [h["record"] for h in body["results"]] == [{"price": "12.50"}]
    assert body["results"][0]["extractor"] == "demo-product"
    status, body = await call(http, "GET", "/search", params=[("q", "kettle"), ("where", "price>10"),
                                                              ("where", "price<=120")])
    assert status == 200 and len(body["results"]) == 2
    status, body = await call(http, "GET", "/search", params=[("q", "kettle"), ("where", "price~3")])
    assert status == 400 and error_of(body) == "invalid_query"
