"""The network policy end to end: a blocked loopback address plays the internal service."""

from __future__ import annotations

import pytest
from aiohttp import web

from busscrape.artifacts.store import ArtifactStore
from busscrape.model.steps import Goto, WaitFor
from busscrape.worker.daemon import Worker
from tests.support import pages
from tests.support.bus import dead_letters, enqueue, results
from tests.support.site import Site
from tests.worker.test_daemon import run_worker

pytestmark = pytest.mark.browser


@pytest.fixture
def internal():
    """An "internal" service on 127.0.0.9, which the allow-list does not open."""
    with Site(hosts=("127.0.0.9",)) as s:
        s.page("/secret", "<h1>internal secret</h1>")
        yield s


async def test_every_form_of_a_blocked_address_is_refused(wbus, wsettings, site, internal):
    port = internal.port
    forms = [f"http://127.0.0.9:{port}/secret", f"http://0x7f000009:{port}/secret",
             f"http://2130706441:{port}/secret", f"http://0177.0.0.011:{port}/secret",
             f"http://[::ffff:127.0.0.9]:{port}/secret", f"http://localhost:{port}/secret"]
    for url in forms:
        await enqueue(wbus.js, url)

    @site.route("/to-internal")
    async def redirect(request):
        raise web.HTTPFound(f"http://127.0.0.9:{port}/secret")

    await enqueue(wbus.js, site.url("/to-internal"))
    await run_worker(wbus, wsettings)
    letters = await dead_letters(wbus.js)
    assert len(letters) == len(forms) + 1
    assert all(d.reason == "blocked_address" and d.stage == "worker" for d in letters)
    via_redirect = next(d for d in letters if d.url == site.url("/to-internal"))
    assert "127.0.0.9" in via_redirect.error and "not in the allow-list" in via_redirect.error
    assert await results(wbus.js) == []
    assert sum(internal.hits.values()) == 0  # not one byte reached the internal service


async def test_a_blocked_sub_resource_is_refused_and_the_page_still_renders(wbus, wsettings, site, internal):
    site.page("/leaky", f'<title>leaky</title><img src="http://127.0.0.9:{internal.port}/secret">'
                        f'<script src="http://127.0.0.9:{internal.port}/secret.js"></script><p>visible</p>')
    await enqueue(wbus.js, site.url("/leaky"))
    await run_worker(wbus, wsettings)
    [result] = await results(wbus.js)
    assert result.title == "leaky"
    assert sorted(result.blocked_requests) == sorted([f"http://127.0.0.9:{internal.port}/secret",
                                                      f"http://127.0.0.9:{internal.port}/secret.js"])
    assert sum(internal.hits.values()) == 0


async def test_the_allow_list_opens_exactly_what_it_names(wbus, wsettings, internal):
    opened = wsettings.with_overrides(network={"allow": [f"127.0.0.9:{internal.port}"]})
    await enqueue(wbus.js, f"http://127.0.0.9:{internal.port}/secret")
    await run_worker(wbus, opened)
    [result] = await results(wbus.js)
    assert result.status == 200 and internal.hits[("127.0.0.9", "/secret")] == 1


async def test_a_goto_step_to_a_blocked_address_is_refused_before_it_leaves(wbus, wsettings, site, internal):
    pages.install(site)
    secret = f"http://127.0.0.9:{internal.port}/secret"
    await enqueue(wbus.js, site.url("/static"), steps=(Goto(url=secret),))
    await run_worker(wbus, wsettings)
    [letter] = await dead_letters(wbus.js)
    assert letter.reason == "blocked_address" and len(letter.attempts) == 1
    # the worker's own check, before the browser tried (the egress proxy's refusal reads otherwise)
    assert letter.error == f"navigation to {secret} refused: loopback address 127.0.0.9 is not in the allow-list"
    assert sum(internal.hits.values()) == 0


async def test_a_websocket_to_a_blocked_address_is_refused(wbus, wsettings, site, internal):
    @internal.route("/ws")
    async def ws(request):
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        await socket.send_str("internal secret")
        await socket.close()
        return socket

    site.page("/sockets", f"""<title>sockets</title><script>
        const ws = new WebSocket('ws://127.0.0.9:{internal.port}/ws');
        ws.onmessage = (e) => document.body.insertAdjacentHTML('beforeend', '<p id=got>' + e.data + '</p>');
        ws.onerror = () => document.body.insertAdjacentHTML('beforeend', '<p id=refused>refused</p>');
        </script>""")
    await enqueue(wbus.js, site.url("/sockets"), steps=(WaitFor(selector="#refused, #got"),))
    await run_worker(wbus, wsettings)
    [result] = await results(wbus.js)
    html = (await ArtifactStore(wbus.js).read(next(a for a in result.artifacts if a.kind == "html"))).decode()
    assert '<p id="refused">refused</p>' in html and "internal secret" not in html
    assert sum(internal.hits.values()) == 0


async def test_a_navigation_the_pre_check_let_through_is_refused_by_the_egress_proxy(wbus, wsettings, internal):
    """Chromium itself cannot reach a blocked address: every connection goes through the SOCKS
    egress proxy, which checks the address it connects to. Shown with the worker's own check
    of the task's URL switched off."""
    secret = f"http://127.0.0.9:{internal.port}/secret"
    await enqueue(wbus.js, secret)
    async with Worker(wbus, wsettings) as worker:
        async def let_through(url: str) -> None:
            return None

        worker.policy.check_url = let_through
        await worker.run()
    [letter] = await dead_letters(wbus.js)
    assert letter.reason == "blocked_address" and "not in the allow-list" in letter.error
    assert sum(internal.hits.values()) == 0 and await results(wbus.js) == []
