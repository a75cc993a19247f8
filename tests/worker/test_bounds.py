"""What a page controls is bounded: its result always fits in RESULTS, and a result that still
cannot (a task's own labels) is a permanent, named failure (real worker, Chromium, nats-server)."""

from __future__ import annotations

import pytest
from aiohttp import web

from busscrape.bus import provision, topology
from busscrape.model import bounds
from busscrape.model.messages import TaskOptions
from busscrape.model.steps import WaitFor
from tests.support.bus import dead_letters, enqueue, results
from tests.worker.test_daemon import run_worker

pytestmark = pytest.mark.browser

# A page that makes every field it controls huge: a 60 kB final URL (pushState), 300 sub-requests
# with 20 kB URLs to a blocked loopback address, and (from the server) 200 large response headers.
BLOATED = """<title>bloated</title><script>
history.pushState({}, '', '/bloated?' + 'q'.repeat(60000));
for (let i = 0; i < 300; i++) { const img = new Image(); img.src = 'http://127.0.0.9/' + i + '/' + 'p'.repeat(20000); }
setTimeout(() => document.body.insertAdjacentHTML('beforeend', '<p id=done>done</p>'), 1500);
</script>"""


async def test_a_page_cannot_make_its_result_too_large(wbus, wsettings, site):
    @site.route("/bloated")
    async def bloated(request):
        headers = {f"X-Filler-{i}": "v" * 1000 for i in range(200)}
        return web.Response(text=BLOATED, content_type="text/html", headers=headers)

    done = (WaitFor(selector="#done", selector_state="attached", timeout=10),)
    await enqueue(wbus.js, site.url("/bloated"), steps=done, options=TaskOptions(artifacts=("html",)))
    worker = await run_worker(wbus, wsettings, concurrency=1)
    assert worker.counters["completed"] == 1 and await dead_letters(wbus.js) == []
    [result] = await results(wbus.js)
    assert len(result.final_url) <= bounds.MAX_URL and result.final_url.endswith(bounds.TRUNCATED)
    assert 0 < len(result.blocked_requests) <= bounds.MAX_BLOCKED
    assert all(len(u) <= bounds.MAX_URL for u in result.blocked_requests)
    assert any(u.startswith(bounds.TRUNCATED) and u.endswith("more") for u in result.blocked_requests)
    assert len(result.response_headers) <= bounds.MAX_HEADERS + 1 and bounds.TRUNCATED in result.response_headers
    assert sum(len(k) + len(v) for k, v in result.response_headers.items()) <= bounds.MAX_HEADERS_TOTAL + 100


async def test_a_result_over_the_message_size_is_dead_lettered_at_once_with_its_reason(wbus, wsettings, site):
    small = wsettings.with_overrides(streams={"max_msg_size": "64KiB"})
    await provision.apply(wbus.js, topology.load(small))
    # The task fits in TASKS; its result, which carries the same labels and the page's headers, does not.
    site.page("/plain", "<title>plain</title>")
    labels = {"blob": "l" * (64 * 1024 - 1200)}
    await enqueue(wbus.js, site.url("/plain"), labels=labels, options=TaskOptions(artifacts=("html",)))
    worker = await run_worker(wbus, small, concurrency=1)
    [letter] = await dead_letters(wbus.js)
    assert letter.reason == "result_too_large" and len(letter.attempts) == 1 and "streams.max_msg_size" in letter.error
    assert await results(wbus.js) == [] and worker.counters["completed"] == 0
