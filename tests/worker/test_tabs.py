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
from tests.worker.test_daemon import run_worker

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


async def render_in_turn(wbus, wsettings, site, isolation, pages):
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
async def test_state_set_by_one_task_is_invisible_to_the_next(wbus, wsettings, site, isolation):
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
        await wait_until(lambda: asyncio.sleep(0, first._paused), timeout=30, every=0.05)
        before, since = await first.page.evaluate("[window.ticks, performance.now()]")
        # half a second of the page's own clock: running, it would tick ~50 times
        await wait_until(lambda: _page_clock_past(first.page, since + 500), timeout=30, every=0.1)
        assert await first.page.evaluate("window.ticks") - before <= 1
        async with pool.tab() as second, pool.tab() as third:
            assert first not in (second, third)
            # No tab is ready now: a task asking for one starts the waiting wipe instead of
            # sitting out its 600 s, and gets the wiped tab.
            async with asyncio.timeout(60), pool.tab() as fourth:
                assert fourth is first
                await fourth.page.goto(site.url("/plain"))
                assert await fourth.page.evaluate("document.cookie") == ""
                await fourth.page.goto(site.url("/tick"))
                # scripts run again after the wipe
                await wait_until(lambda: _ticked(fourth.page, 5), timeout=30, every=0.1)


async def _page_clock_past(page, ms: float) -> bool:
    return await page.evaluate("performance.now()") >= ms


async def _ticked(page, n: int) -> bool:
    return await page.evaluate("window.ticks") > n


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
async def test_credentials_one_task_gave_a_site_are_not_sent_for_the_next(wbus, wsettings, site, isolation):
    sent = []

    @site.route("/protected")
    async def protected(request):
        # By the page that asked (a task retried on a loaded machine asks again).
        sent.append((request.headers.get("Referer", "").rsplit("/", 1)[-1], request.headers.get("Authorization")))
        if request.headers.get("Authorization") == "Basic dXNlcjpwdw==":  # user:pw
            return web.Response(text="secret")
        return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="r"'})

    await render_in_turn(wbus, wsettings, site, isolation, {"/a": AUTHORISING, "/b": ASKING})
    # Task A: challenged, then answered. Task B: its requests carry no credentials.
    assert ("a", None) in sent and ("a", "Basic dXNlcjpwdw==") in sent
    assert [auth for page, auth in sent if page == "b"] and all(auth is None for page, auth in sent if page == "b")


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
async def test_storage_a_cross_site_frame_left_is_invisible_to_the_next_task(wbus, wsettings, site, isolation):
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


async def test_with_rest_after_the_other_tabs_open_only_once_the_first_task_is_back():
    async with BrowserPool(BrowserSettings(), proxy_url=None, recycle_after_tasks=1000, recycle_rss=2**40) as pool:
        await pool.prewarm(3, ready=1, rest_after=600)
        async with asyncio.timeout(60), pool.tab():
            # The first task renders alone: a renderer starts in well under this on any machine.
            await asyncio.sleep(3)
            assert pool.contexts == 1
        async with asyncio.timeout(60), pool.tab() as a, pool.tab() as b, pool.tab() as c:
            assert len({a, b, c}) == 3
            assert pool.contexts == 3
    async with BrowserPool(BrowserSettings(), proxy_url=None, recycle_after_tasks=1000, recycle_rss=2**40) as pool:
        # A first task that takes longer than rest_after does not hold the other slots.
        await pool.prewarm(3, ready=1, rest_after=0.5)
        async with asyncio.timeout(60), pool.tab():
            async with pool.tab() as b, pool.tab() as c:
                assert b is not c
                assert pool.contexts == 3


# Task A: its own headers, viewport and blocked resource types, and a frame of another origin
# that stores something there.
DRESSED = """<title>dressed</title><img src=/a.png><iframe src="{frame}"></iframe><script>
window.addEventListener('message', () => document.body.insertAdjacentHTML('beforeend', '<p id=done>set</p>'));
</script>"""
FRAME = """<script>localStorage.setItem('frame-leak', 'x'); parent.postMessage('set', '*');</script>"""
# Task B, on the frame's origin, with the default options: what it sees of task A.
PLAIN = """<title>plain</title><img src=/b.png><pre id=out></pre><script>
window.addEventListener('load', () => {
  document.getElementById('out').textContent = JSON.stringify({frame: localStorage.getItem('frame-leak'),
    width: innerWidth, height: innerHeight, agent: navigator.userAgent});
  document.body.insertAdjacentHTML('beforeend', '<p id=done>read</p>');
});</script>"""


@pytest.mark.parametrize("isolation", ["tab", "context"])
async def test_a_tasks_options_and_its_frames_storage_do_not_carry_over(wbus, wsettings, site, isolation):
    headers_seen = {}

    def page_with_headers(path: str, html: str) -> None:
        @site.route(path)
        async def serve(request):
            headers_seen.setdefault(path, []).append(request.headers.get("X-Leak"))
            return web.Response(text=html, content_type="text/html")

    png = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                        "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")
    for name in ("/a.png", "/b.png"):
        site.route(name)(lambda request: _png(png))
    page_with_headers("/dressed", DRESSED.format(frame=site.url("/frame", host=1)))
    site.page("/frame", FRAME)
    page_with_headers("/plain", PLAIN)
    done = (WaitFor(selector="#done", selector_state="attached"),)
    dressed = TaskOptions(artifacts=("html",), headers={"X-Leak": "a"}, viewport={"width": 640, "height": 480},
                          block_resources=("image",))
    await enqueue(wbus.js, site.url("/dressed"), steps=done, options=dressed)
    await enqueue(wbus.js, site.url("/plain", host=1), steps=done, options=TaskOptions(artifacts=("html",)))
    await enqueue(wbus.js, site.url("/plain?agent=1", host=1), steps=done,
                  options=TaskOptions(artifacts=("html",), user_agent="LeakAgent/1.0"))
    await enqueue(wbus.js, site.url("/plain?after-agent=1", host=1), steps=done,
                  options=TaskOptions(artifacts=("html",)))
    worker = await run_worker(wbus, wsettings, concurrency=1, isolation=isolation)
    assert worker.counters["completed"] == 4
    seen = {}
    for r in await results(wbus.js):
        html = (await ArtifactStore(wbus.js).read(r.artifacts[0])).decode()
        if '<pre id="out">' in html:
            seen[r.url] = json.loads(html.split('<pre id="out">')[1].split("</pre>")[0].replace("&quot;", '"'))
    plain, agent, after = (seen[site.url(p, host=1)] for p in ("/plain", "/plain?agent=1", "/plain?after-agent=1"))
    # Task A's options held for A: its header sent, its images blocked ...
    assert headers_seen["/dressed"] == ["a"] and site.hits[(site.hosts[0], "/a.png")] == 0
    # ... and none of them, nor its frame's storage, reached B.
    assert headers_seen["/plain"] == [None, None, None] and site.hits[(site.hosts[1], "/b.png")] == 3
    assert plain["frame"] is None and (plain["width"], plain["height"]) == (1280, 800)
    assert agent["agent"] == "LeakAgent/1.0" and after["agent"] != "LeakAgent/1.0"


async def _png(data: bytes) -> web.Response:
    return web.Response(body=data, content_type="image/png")


async def test_a_tab_is_replaced_after_max_uses_and_after_a_failed_wipe(site):
    site.page("/plain", "<title>plain</title><p>plain</p>")
    async with BrowserPool(BrowserSettings(), proxy_url=None, recycle_after_tasks=1000, recycle_rss=2**40,
                           tab_max_uses=2, idle_tabs=1) as pool:
        used = []
        for _ in range(3):
            async with pool.tab() as tab:
                await tab.begin(viewport=(1280, 800), headers={})  # a task's start counts a use
                await tab.page.goto(site.url("/plain"))
                used.append(tab)
            await wait_until(lambda: asyncio.sleep(0, not pool._wiping), timeout=30)
        # the first tab served two tasks, then was closed (its context with it) for a new one
        assert used[0] is used[1] and used[2] is not used[0] and used[0].context not in pool._browser.contexts

        async def fails() -> None:
            raise RuntimeError("the wipe did not finish")

        used[2].wipe = fails  # this tab cannot be trusted after its task
        async with pool.tab() as tab:
            assert tab is used[2]
        await wait_until(lambda: asyncio.sleep(0, not pool._wiping), timeout=30)
        async with pool.tab() as tab:
            assert tab is not used[2] and used[2].context not in pool._browser.contexts


async def test_the_browser_is_recycled_when_its_processes_use_more_than_recycle_rss(site):
    """RSS is read every 25 tasks; over the limit (1 byte here: always), the next task gets a new
    Chromium process."""
    site.page("/plain", "<title>plain</title><p>plain</p>")
    async with BrowserPool(BrowserSettings(), proxy_url=None, recycle_after_tasks=1000, recycle_rss=1,
                           idle_tabs=1) as pool:
        first = pool.pids()[0]
        for _ in range(25):
            async with pool.tab() as tab:
                await tab.page.goto(site.url("/plain"))
        assert pool.restarts == 0  # not yet: the 25th task's end found it over the limit
        async with pool.tab() as tab:
            await tab.page.goto(site.url("/plain"))
            assert pool.restarts == 1 and pool.pids()[0] != first


# A page that tries to install a service worker (which would outlive the task in its origin) ...
INSTALLER = """<title>sw</title><pre id=out></pre><script>
navigator.serviceWorker.register('/sw.js').then((r) => new Promise((done) => {
    const w = r.installing || r.waiting || r.active;
    if (w.state === 'activated') done();
    else w.addEventListener('statechange', () => w.state === 'activated' && done());
  })).then(() => 'registered', (e) => 'refused: ' + e.name)
  .then((outcome) => { document.getElementById('out').textContent = outcome;
                       document.body.insertAdjacentHTML('beforeend', '<p id=done>tried</p>'); });
</script>"""
# ... and the next task on that origin, asking what is registered there.
REGISTRATIONS = """<title>sw2</title><pre id=out></pre><script>
navigator.serviceWorker.getRegistrations().then((all) => {
  document.getElementById('out').textContent = 'registrations: ' + all.length;
  document.body.insertAdjacentHTML('beforeend', '<p id=done>read</p>'); });
</script>"""


@pytest.mark.parametrize("isolation", ["tab", "context"])
async def test_a_page_cannot_install_a_service_worker_for_the_next_task(wbus, wsettings, site, isolation):
    @site.route("/sw.js")
    async def worker_script(request):
        return web.Response(text="self.addEventListener('fetch', () => {});", content_type="text/javascript")

    await render_in_turn(wbus, wsettings, site, isolation, {"/sw": INSTALLER, "/sw-next": REGISTRATIONS})
    seen = {}
    for r in await results(wbus.js):
        html = (await ArtifactStore(wbus.js).read(r.artifacts[0])).decode()
        seen[r.url] = html.split('<pre id="out">')[1].split("</pre>")[0]
    # Blocked (the context's service_workers="block"): the worker never becomes active, and the
    # next task on the origin finds nothing registered (the wipe clears what was attempted).
    assert seen[site.url("/sw")].startswith("refused: ") and seen[site.url("/sw-next")] == "registrations: 0"
