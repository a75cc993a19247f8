"""Reused tabs keep tasks apart: state set by one task is invisible to the next (real worker)."""

from __future__ import annotations

import json

import pytest
from aiohttp import web

from busscrape.artifacts import ArtifactStore
from busscrape.messages import TaskOptions
from busscrape.steps import WaitFor

from .support.bus import enqueue, results
from .test_worker import run_worker, wbus, wsettings  # noqa: F401 - fixtures

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


@pytest.mark.parametrize("isolation", ["tab", "context"])
async def test_state_set_by_one_task_is_invisible_to_the_next(wbus, wsettings, site, isolation):  # noqa: F811
    site.page("/set", SETTER)
    site.page("/get", READER)
    fetched = []

    @site.route("/cacheable")
    async def cacheable(request):
        fetched.append(request.headers.get("Cookie", ""))
        return web.Response(text="x", headers={"Cache-Control": "max-age=3600"})

    done = (WaitFor(selector="#done", selector_state="attached"),)
    await enqueue(wbus.js, site.url("/set"), steps=done)
    await enqueue(wbus.js, site.url("/get"), steps=done, options=TaskOptions(artifacts=("html",)))
    # One slot: the second task runs in the same tab (or its replacement context) right after.
    worker = await run_worker(wbus, wsettings, concurrency=1, isolation=isolation)
    assert worker.counters["completed"] == 2
    reader = next(r for r in await results(wbus.js) if r.url == site.url("/get"))
    html = (await ArtifactStore(wbus.js).read(reader.artifacts[0])).decode()
    seen = json.loads(html.split('<pre id="out">')[1].split("</pre>")[0].replace("&quot;", '"'))
    # history: about:blank, then this page — what a brand-new page shows too; the setter's page is gone.
    assert seen == {"cookie": "", "local": None, "session": None, "name": "", "idb": [], "caches": [],
                    "history": 2}
    # The HTTP cache was dropped too: the reader fetched the cacheable resource again (the setter's
    # fetch carried the cookie it had just set; the reader's carries none).
    assert fetched == ["leak=cookie", ""]
