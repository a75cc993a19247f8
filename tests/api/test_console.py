"""The web console (``busscrape api`` at ``/``) in a real Chromium, against a real fleet in this
process: nats-server, a worker rendering loopback pages in Chromium, an ingester archiving to a
folder and indexing in SQLite, and the API server the console is part of."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from playwright.async_api import expect

from busscrape.api.server import ApiServer
from busscrape.archive.storage import open_storage
from busscrape.bus import provision, topology
from busscrape.deadletters import filing
from busscrape.ingest.daemon import Ingester
from busscrape.model.messages import DeadLetter, TaskOptions
from busscrape.status.records import StatusBoard
from busscrape.worker.daemon import Worker
from tests.conftest import make_settings
from tests.support.bus import count, enqueue, wait_until
from tests.support.chromium import launched

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TOKEN = "console-test-token"
HOSTILE_TITLE = "<script>alert(1)</script>"
PRODUCT = """<!doctype html><title>Blue kettle</title>
<h1 class="product-name">Blue kettle</h1><p>A quokka-approved kettle.</p>
<span class="price" data-currency="EUR">49.90</span>
<span class="availability" data-availability="InStock">in stock</span>"""


@pytest.fixture
def fleet_settings(tmp_path, nats_url, site):
    return make_settings(tmp_path, nats_url, network={"allow": [f"{h}/32" for h in site.hosts]},
                         worker={"concurrency": 2, "navigation_timeout": "10s", "retry_base_delay": "200ms",
                                 "retry_max_delay": "1s"},
                         streams={"worker_max_deliver": 2}, api={"port": 0, "token": TOKEN})


@contextlib.asynccontextmanager
async def fleet(bus, s) -> AsyncIterator[ApiServer]:
    """A worker and an ingester working, and the API serving, until the block ends."""
    await provision.apply(bus.js, topology.load(s))
    async with open_storage(s) as storage, Worker(bus, s) as worker, Ingester(bus, storage, s) as ingester, \
            ApiServer(bus, s) as api:
        jobs = [asyncio.ensure_future(d.run()) for d in (worker, ingester)]
        try:
            yield api
        finally:
            worker.stop()
            ingester.stop()
            await asyncio.gather(*jobs, return_exceptions=True)


@pytest.fixture
async def browser():
    async with launched() as chromium:
        yield chromium


async def logged_in(browser, api: ApiServer) -> Any:
    """A browser page logged in to the console through its form."""
    context = await browser.new_context(base_url=api.url)
    page = await context.new_page()
    response = await page.goto("/")
    assert response.status == 401 and await page.locator("form.login").count() == 1
    await page.fill("input[name=token]", TOKEN)
    await page.click("form.login button")
    await page.wait_for_url(f"{api.url}/")
    return page


async def archived(bus, task_id: str) -> bool:
    latest = await StatusBoard(bus.js).latest(task_id)
    return latest is not None and latest[0].state == "archived"


async def test_a_page_found_by_search_shows_its_screenshot_and_record(bus, fleet_settings, site, browser):
    site.page("/shop/kettle", PRODUCT)
    async with fleet(bus, fleet_settings) as api:
        task = await enqueue(bus.js, site.url("/shop/kettle"), options=TaskOptions(extractor="demo-product"))
        await wait_until(lambda: archived(bus, task.task_id), timeout=90)
        page = await logged_in(browser, api)
        await page.goto("/console/pages")
        await page.fill("input[name=q]", "quokka")
        await page.fill("input[name=where]", "price<100")
        await page.click("#search-form button")
        await page.wait_for_selector(".hit")
        assert await page.locator(".hit").count() == 1
        assert "49.90" in await page.locator(".hit dl.record").inner_text()
        await page.click(".hit a.title")
        await page.wait_for_selector("#record")
        record = await page.locator("#record").inner_text()
        assert "Blue kettle" in record and "49.90" in record and "EUR" in record
        assert await page.locator("#page-status").inner_text() == "200"
        shot = page.locator("img.screenshot").first
        await shot.wait_for()
        # The screenshot loaded as an image (a broken <img> has no natural size).
        assert await shot.evaluate("img => img.complete && img.naturalWidth > 0")
        href = await page.locator(".downloads a", has_text="HTML").get_attribute("href")
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http, \
                http.get(api.url + href) as download:
            assert download.status == 200
            assert download.headers["Content-Disposition"].startswith("attachment")
            assert download.content_type != "text/html" and "sandbox" in download.headers["Content-Security-Policy"]
        await page.context.close()


async def test_a_crawl_started_from_the_form_runs(bus, fleet_settings, site, browser):
    links = "".join(f'<a href="/c/{n}">page {n}</a>' for n in range(1, 4))
    site.page("/c/", f"<title>crawl home</title>{links}")
    for n in range(1, 4):
        site.page(f"/c/{n}", f"<title>crawl page {n}</title><p>leaf {n}</p>")
    async with fleet(bus, fleet_settings) as api:
        page = await logged_in(browser, api)
        await page.goto("/console/crawls")
        await page.fill("textarea[name=seeds]", site.url("/c/"))
        await page.fill("input[name=depth]", "1")
        await page.click("#crawl-form button[type=submit]")
        await page.wait_for_url(f"{api.url}/console/crawls/*")
        # The page refreshes itself (console.js) until the crawl's four pages are archived.
        await expect(page.locator("#crawl-archived")).to_have_text("4", timeout=120_000)
        assert await page.locator("#crawl-percent").inner_text() == "100%"
        # By depth: the seed archived at depth 0, its three links at depth 1 (theirs at 2: none).
        rows = await page.locator("#by-depth tbody tr").all_inner_texts()
        assert [r.split("\t")[0] + ":" + r.split("\t")[-2] for r in rows] == ["0:1", "1:3", "2:0", "all:4"], rows
        assert await page.evaluate("document.body.dataset.refreshed") is not None
        # The crawl page's link lists the crawl's pages (no words: the crawl filter in the query),
        # each with its status, once the ingester's feed has indexed them.
        href = await page.locator("a", has_text="Its archived pages").get_attribute("href")

        async def listed() -> bool:
            await page.goto(href)
            return await page.locator(".hit").count() == 4

        await wait_until(listed, timeout=60, every=1)
        assert await page.locator(".hit .status").all_inner_texts() == ["200"] * 4
        assert set(await page.locator(".hit a.title").all_inner_texts()) == {
            "crawl home", "crawl page 1", "crawl page 2", "crawl page 3"}
        await page.context.close()


async def test_a_dead_letter_replayed_from_the_console_is_archived(bus, fleet_settings, site, browser):
    served = {"status": 503}

    @site.route("/fixme")
    async def fixme(request: web.Request) -> web.Response:
        return web.Response(status=served["status"], text=f"<title>fixme</title><p>served {served['status']}</p>",
                            content_type="text/html")

    async with fleet(bus, fleet_settings) as api:
        task = await enqueue(bus.js, site.url("/fixme"))
        await wait_until(lambda: _letters(bus, 1), timeout=90)
        served["status"] = 200  # the cause is fixed
        page = await logged_in(browser, api)
        await page.goto("/console/deadletters")
        await page.click("a.reason", timeout=10_000)
        assert site.url("/fixme") in await page.locator("table.letters").inner_text()
        await page.click("#replay-reason")
        assert "1 letter selected, 1 replayable" in await page.locator("#replay-question").inner_text()
        assert await count(bus.js, "DEADLETTER") == 1  # nothing happens before the confirmation
        await page.click("#replay-confirm")
        assert "replayed 1" in await page.locator("#replay-done").inner_text()
        await wait_until(lambda: archived(bus, task.task_id), timeout=90)
        assert await count(bus.js, "DEADLETTER") == 0
        await page.context.close()


async def _letters(bus, n: int) -> bool:
    return await count(bus.js, "DEADLETTER") == n


async def test_hostile_titles_and_urls_are_shown_as_text_under_the_csp(bus, fleet_settings, site, browser):
    site.page("/evil", f"<title>{HOSTILE_TITLE}</title><p>quokka evil page</p>")
    url = site.url("/evil") + "?next=javascript:alert(2)"
    async with fleet(bus, fleet_settings) as api:
        task = await enqueue(bus.js, url)
        await wait_until(lambda: archived(bus, task.task_id), timeout=90)
        # A dead letter whose URL is a javascript: URL (as a hostile message could carry).
        letter = DeadLetter(task_id="f" * 32, url="javascript:alert(3)", stage="worker", reason="http_404",
                            error=f"{HOSTILE_TITLE} <img src=x onerror=alert(4)>", )
        await filing.file(bus.js, letter, msg_id="console-test-letter")
        page = await logged_in(browser, api)
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), asyncio.ensure_future(d.dismiss())))
        response = await page.goto("/console/pages?q=quokka")
        csp = response.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "object-src 'none'" in csp and "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp
        assert await page.locator(".hit a.title").inner_text() == HOSTILE_TITLE
        await page.click(".hit a.title")
        await page.wait_for_selector("#page-title")
        assert await page.locator("#page-title").inner_text() == HOSTILE_TITLE
        assert url in await page.locator("#page-url").inner_text()
        await page.goto("/console/deadletters")
        text = await page.locator("table.letters").inner_text()
        assert "javascript:alert(3)" in text and "<img src=x onerror=alert(4)>" in text
        for where in ("/", "/console/pages?q=quokka", "/console/deadletters"):
            await page.goto(where)
            hrefs = await page.eval_on_selector_all("a[href]", "as => as.map(a => a.getAttribute('href'))")
            assert not [h for h in hrefs if h.strip().lower().startswith("javascript:")], hrefs
            assert await page.locator("script:not([src])").count() == 0
        await asyncio.sleep(0.5)  # a dialog, had one opened, is reported by now
        assert dialogs == []
        await page.context.close()


async def test_without_the_token_every_page_and_action_is_refused(applied, fleet_settings, browser):
    async with ApiServer(applied, fleet_settings) as api:
        gets = ["/", "/console/crawls", f"/console/crawls/{'a' * 16}", "/console/pages?q=x",
                f"/console/page?key=dt=2026-01-01/host=a/{'a' * 32}",
                f"/console/file?key=dt=2026-01-01/host=a/{'a' * 32}&name=page.html.gz", "/console/deadletters",
                "/console/deadletters/1", "/console/replay?reason=x", "/console/nowhere"]
        posts = ["/console/crawls", "/console/replay", "/console/logout"]
        wrong = [{}, {"Authorization": "Bearer not-the-token"}, {"Cookie": "busscrape_session=forged"},
                 {"Authorization": f"Basic {TOKEN}"}]
        for headers in wrong:
            async with aiohttp.ClientSession(base_url=api.url, headers=headers) as http:
                for path in gets:
                    async with http.get(path, allow_redirects=False) as r:
                        assert r.status == 401, (path, headers, r.status)
                        assert "form" in await r.text() and "Content-Security-Policy" in r.headers
                for path in posts:
                    async with http.post(path, data={"seeds": "http://x/", "reason": "x"},
                                         allow_redirects=False) as r:
                        assert r.status == 401, (path, headers, r.status)
        async with aiohttp.ClientSession(base_url=api.url) as http:
            async with http.post("/console/login", data={"token": "wrong"}, allow_redirects=False) as r:
                assert r.status == 401 and "Set-Cookie" not in r.headers
            # The login goes back to a console page, never to another site.
            for elsewhere in ("//127.0.0.9/", "http://127.0.0.9/", "/\\127.0.0.9/", "/healthz"):
                async with http.post("/console/login", data={"token": TOKEN, "next": elsewhere},
                                     allow_redirects=False) as r:
                    assert (r.status, r.headers["Location"]) == (303, "/"), elsewhere

        # Logged in through the form: an HttpOnly, SameSite=Strict cookie, not the token.
        page = await logged_in(browser, api)
        [cookie] = await page.context.cookies()
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and TOKEN not in cookie["value"]
        # A form posted without this console's CSRF token (as another site would) is refused.
        refused = await page.request.post("/console/replay", form={"reason": "x"})
        assert refused.status == 403 and "CSRF" in await refused.text()
        refused = await page.request.post("/console/crawls", form={"seeds": "http://x/", "csrf": "f" * 64})
        assert refused.status == 403
        # The bearer header works too.
        async with aiohttp.ClientSession(base_url=api.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http, \
                http.get("/console/deadletters") as r:
            assert r.status == 200
        await page.context.close()

    # No token: loopback only, under a loopback Host (a rebound DNS name is refused).
    open_settings = fleet_settings.model_copy(update={"api": fleet_settings.api.model_copy(update={"token": None})})
    async with ApiServer(applied, open_settings) as api, aiohttp.ClientSession(base_url=api.url) as http:
        async with http.get("/") as r:
            assert r.status == 200
        async with http.get("/", headers={"Host": "attacker.example"}) as r:
            assert r.status == 403 and "loopback" in await r.text()
        async with http.post("/console/replay", data={"reason": "x"}) as r:
            assert r.status == 403 and "CSRF" in await r.text()


async def test_a_console_page_the_bus_cannot_answer_loads_itself_again_once_it_can(bus, fleet_settings, browser):
    """A read the bus does not answer (here: TASKS gone, as in the moment a stream is being
    re-created) is a 503 page that says it tries again, and the overview comes back on its own
    once the bus answers, without a click."""
    await provision.apply(bus.js, topology.load(fleet_settings))
    async with ApiServer(bus, fleet_settings) as api:
        await bus.js.delete_stream("TASKS")
        page = await logged_in(browser, api)
        assert "tries again every 5 seconds" in await page.locator("#error-retry").inner_text()
        await provision.apply(bus.js, topology.load(fleet_settings))
        await expect(page.locator("#total-archived")).to_have_text("0", timeout=30_000)
        await page.context.close()
