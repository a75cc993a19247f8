"""Reused tabs keep tasks apart: state set by one task is invisible to the next (real worker)."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from busscrape.artifacts.store import ArtifactStore
from busscrape.model.messages import TaskOptions
from busscrape.model.steps import WaitFor
from busscrape.settings import BrowserSettings
from busscrape.worker.browser.pool import BrowserPool
from tests.support.bus import enqueue, results, wait_until
from tests.worker.test_daemon import run_worker, wbus, wsettings  # noqa: F401 - fixtures

pytestmark = pytest.mark.browser

# Leaves every kind of state a page can leave behind, then says so.
SETTER = """<title>setter</title><script>
(async () => {
  document.cookie = 'leak=cookie; max-age=3600; path=/';
  localStorage.setItem('leak', 'local'); sessionStorage.setItem('leak', 'session'); window.name = 'leak-name';
  await new Promise(r => { const q = indexedDB.open('leakdb', 1);
    q.onupgradeneeded = () => q.result.createObjectStore('o');
    q.onsuccess = () => { const t = q.result.transaction('o', 'readwrite'); t.objectStore('o').put('v', 'k');
                          t.oncomplete = r; }; });
  await (await caches.open('leak-cache')).put('/x', new Response('cached'));
  await fetch('/cacheable');
  document.body.insertAdjacentHTML('beforeend', '<p id=done>state set</p>');
})();</script>"""

# Reports what it can see of a previous visitor.
READER = """<title>reader</title><pre id=out></pre><script>
(async () => {
  const seen = {cookie: document.cookie, local: localStorage.getItem('leak'),
    session: sessionStorage.getItem('leak'), name: window.name,
    idb: (await indexedDB.databases()).map(d => d.name), caches: await caches.keys(),
    history: history.length};
  await fetch('/cacheable');
  document.getElementById('out').textContent = JSON.stringify(seen);
  document.body.insertAdjacentHTML('beforeend', '<p id=done>read</p>');
})();</script>"""


async def render_in_turn(wbus, wsettings, site, isolation, pages):  # noqa: F811
    """Serves `pages` (path -> HTML) and renders them in order in one slot: each task runs in the tab
    (or the replacement context) the one before it used, right after it. Each page signals `#done`
    when it has run."""
    done = (WaitFor(selector="#done", selector_state="attached"),)
    for path, html in pages.items():
        site.page(path, html)
        await enqueue(wbus.js, site.url(path), steps=done, options=TaskOptions(artifacts=("html",)))
    worker = await run_worker(wbus, wsettings, concurrency=1, isolation=isolation)
    assert worker.counters["completed"] == len(pages)


@pytest.mark.parametrize("isolation", ["tab", "context"])
async def test_state_set_by_one_task_is_invisible_to_the_next(wbus, wsettings, site, isolation):  # noqa: F811
    fetched = []

    @site.route("/cacheable")
    async def cacheable(request):
        fetched.append(request.headers.get("Cookie", ""))
        return web.Response(text="x", headers={"Cache-Control": "max-age=3600"})

    await render_in_turn(wbus, wsettings, site, isolation, {"/set": SETTER, "/get": READER})
    reader = next(r for r in await results(wbus.js) if r.url == site.url("/get"))
    html = (await ArtifactStore(wbus.js).read(reader.artifacts[0])).decode()
    seen = json.loads(html.split('<pre id="out">')[1].split("</pre>")[0].replace("&quot;", '"'))
    # history: about:blank, then this page — what a brand-new page shows too; the setter's page is gone.
    assert seen == {"cookie": "", "local": None, "session": None, "name": "", "idb": [], "caches": [],
                    "history": 2}
    # The HTTP cache was dropped too: the reader fetched the cacheable resource again (the setter's
    # fetch carried the cookie it had just set; the reader's carries none).
    assert fetched == ["leak=cookie", ""]


TICKER = """<title>ticker</title><script>
document.cookie = 'left=behind; max-age=3600; path=/';
window.ticks = 0; setInterval(() => window.ticks++, 10);</script>"""


async def test_a_deferred_wipe_pauses_the_page_and_gives_way_to_a_task_waiting_for_a_tab(site):
    site.page("/tick", TICKER)
    site.page("/plain", "<title>plain</title><p>plain</p>")
    async with BrowserPool(BrowserSettings(), proxy_url=None, recycle_after_tasks=1000, recycle_rss=2**40,
                           tab_wipe_delay=600.0) as pool:
        await pool.prewarm(3)
        async with pool.tab() as first:
            await first.page.goto(site.url("/tick"))
        # Two tabs were still ready, so the wipe waits; meanwhile the page runs no scripts.
        await asyncio.sleep(0.3)
        before = await first.page.evaluate("window.ticks")
        await asyncio.sleep(0.5)
        assert await first.page.evaluate("window.ticks") - before <= 1  # running, it would tick ~50 times
        async with pool.tab() as second, pool.tab() as third:
            assert first not in (second, third)
            # No tab is ready now: a task asking for one starts the waiting wipe instead of
            # sitting out its 600 s, and gets the wiped tab.
            async with asyncio.timeout(60), pool.tab() as fourth:
                assert fourth is first
                await fourth.page.goto(site.url("/plain"))
                assert await fourth.page.evaluate("document.cookie") == ""
                await fourth.page.goto(site.url("/tick"))
                await asyncio.sleep(0.3)
                assert await fourth.page.evaluate("window.ticks") > 5  # scripts run again after the wipe


# Task A's page answers a Basic challenge itself (XHR with a user and password); Chromium files
# the credentials in the context's HTTP auth cache, which no CDP call clears.
AUTHORISING = """<title>a</title><script>
const x = new XMLHttpRequest(); x.open('GET', '/protected', true, 'user', 'pw');
x.onloadend = () => document.body.insertAdjacentHTML('beforeend', '<p id=done>' + x.status + '</p>'); x.send();
</script>"""
# Task B asks for the same resource with no credentials of its own.
ASKING = """<title>b</title><script>
fetch('/protected').then(r => document.body.insertAdjacentHTML('beforeend', '<p id=done>' + r.status + '</p>'));
</script>"""


@pytest.mark.parametrize("isolation", ["tab", "context"])
async def test_credentials_one_task_gave_a_site_are_not_sent_for_the_next(wbus, wsettings, site, isolation):  # noqa: F811
    sent = []

    @site.route("/protected")
    async def protected(request):
        sent.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") == "Basic dXNlcjpwdw==":  # user:pw
            return web.Response(text="secret")
        return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="r"'})

    await render_in_turn(wbus, wsettings, site, isolation, {"/a": AUTHORISING, "/b": ASKING})
    # Task A: challenged, then answered. Task B: one request, and it carries no credentials.
    assert sent == [None, "Basic dXNlcjpwdw==", None]


async def test_tabs_kept_ready_are_bounded_over_all_user_agents(site):
    site.page("/plain", "<title>plain</title><p>plain</p>")
    async with BrowserPool(BrowserSettings(), proxy_url=None, recycle_after_tasks=1000, recycle_rss=2**40,
                           idle_tabs=2) as pool:
        # Ten tasks, each with its own user agent: each needs a tab of its own kind.
        for n in range(10):
            async with pool.tab(user_agent=f"agent-{n}") as tab:
                await tab.page.goto(site.url("/plain"))
                last = tab
            await asyncio.sleep(0.05)
        await wait_until(lambda: asyncio.sleep(0, pool.contexts <= 2), timeout=30)  # the last wipes finish
        assert pool.contexts == 2
        # The ready ones are the most recent: agent-9's tab is reused, not reopened.
        async with pool.tab(user_agent="agent-9") as tab:
            assert tab is last and await tab.page.evaluate("navigator.userAgent") == "agent-9"


# A page that embeds a frame of another site and says when the frame has reported back.
def framing(frame_url: str) -> str:
    return (f"<title>top</title><iframe src='{frame_url}'></iframe><script>"
            "addEventListener('message', () => document.body.insertAdjacentHTML('beforeend', '<p id=done>x</p>'));"
            "</script>")


# Third-party storage is partitioned by the top-level site: the frame's localStorage and IndexedDB
# live under (top site, frame origin), a key the wipe must reach as well.
FRAME_SETTER = """<script>(async () => {
  localStorage.setItem('leak', 'frame-local');
  await new Promise(r => { const q = indexedDB.open('framedb', 1);
    q.onupgradeneeded = () => q.result.createObjectStore('o'); q.onsuccess = r; });
  parent.postMessage('set', '*');
})();</script>"""
FRAME_READER = """<script>(async () => {
  const seen = {local: localStorage.getItem('leak'), idb: (await indexedDB.databases()).map(d => d.name)};
  await fetch('/report?seen=' + encodeURIComponent(JSON.stringify(seen)));
  parent.postMessage('read', '*');
})();</script>"""


@pytest.mark.parametrize("isolation", ["tab", "context"])
async def test_storage_a_cross_site_frame_left_is_invisible_to_the_next_task(wbus, wsettings, site, isolation):  # noqa: F811
    reports = []

    @site.route("/report")
    async def report(request):
        reports.append(json.loads(request.query["seen"]))
        return web.Response(text="ok")

    site.page("/frame-set", FRAME_SETTER)
    site.page("/frame-get", FRAME_READER)
    await render_in_turn(wbus, wsettings, site, isolation, {
        "/top-set": framing(site.url("/frame-set", host=1)), "/top-get": framing(site.url("/frame-get", host=1))})
    assert reports == [{"local": None, "idb": []}]


async def test_prewarm_with_ready_returns_at_the_first_tab_and_tasks_get_the_rest_as_they_open():
    async with BrowserPool(BrowserSettings(), proxy_url=None, recycle_after_tasks=1000, recycle_rss=2**40) as pool:
        await pool.prewarm(3, ready=1)
        assert pool.contexts >= 1
        async with asyncio.timeout(60), pool.tab() as a, pool.tab() as b, pool.tab() as c:
            assert len({a, b, c}) == 3
            # The tasks waited for the tabs being opened instead of opening their own.
            assert pool.contexts == 3
