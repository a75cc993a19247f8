"""Hostile pages: each ends archived or dead-lettered within its budget, and the worker then
serves a normal page. Also the limits that protect the fleet, each with its clear error."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from aiohttp import web

from busscrape.artifacts.store import ArtifactStore
from busscrape.bus import provision, topology
from busscrape.model.messages import TaskOptions
from busscrape.model.steps import Click, Scroll, Sleep, WaitFor
from tests.support import pages
from tests.support.bus import dead_letters, enqueue, results
from tests.worker.test_daemon import png_size, run_worker

pytestmark = [pytest.mark.browser, pytest.mark.slow]

BUDGET = 120  # seconds any one hostile page may cost the worker, retries included

PDF = (b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj 2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj "
       b"3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 200 200]>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n")


@pytest.fixture
def hostile(site):
    pages.install(site)

    @site.route("/loop")
    async def loop(request):
        raise web.HTTPFound("/loop")

    @site.route("/huge")
    async def huge(request):
        return web.Response(body=b"<p>" + b"x" * (50 * 1024 * 1024) + b"</p>", content_type="text/html")

    @site.route("/download")
    async def download(request):
        return web.Response(body=b"a,b\n1,2\n", content_type="text/csv",
                            headers={"Content-Disposition": 'attachment; filename="data.csv"'})

    @site.route("/huge-chunked")
    async def huge_chunked(request):
        # No Content-Length (chunked): only the size of the rendered HTML can tell.
        response = web.StreamResponse(headers={"Content-Type": "text/html"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(b"<title>chunked</title><p>")
        for _ in range(4):
            await response.write(b"y" * (512 * 1024))
        await response.write(b"</p>")
        await response.write_eof()
        return response

    @site.route("/doc.pdf")
    async def pdf(request):
        return web.Response(body=PDF, content_type="application/pdf")

    site.page("/hog", "<title>hog</title><script>const keep = []; "
                      "while (true) { keep.push(new Array(5e6).fill(Math.random())); }</script>")
    # Playwright dismisses every dialog by itself when no handler is set; what only ours does is
    # accept "leave this page?", so a step that navigates away (a click: a user gesture, without
    # which Chromium shows no beforeunload dialog) gets there.
    site.page("/dialogs", """<title>dialogs</title><p id=answers></p><a id=away href="/static?left=1">away</a>
        <script>
        const answers = [alert('hello'), confirm('sure?'), prompt('name?')];
        document.getElementById('answers').textContent = JSON.stringify(answers);
        window.addEventListener('beforeunload', (e) => { e.preventDefault(); e.returnValue = 'stay'; });
        </script>""")
    # The opener watches its popups and says so once every one of them is closed, which the
    # worker must do while the task runs (the wipe afterwards would be too late for this page).
    site.page("/popups", """<title>popups</title><p>opener</p><script>
        const opened = [];
        for (let i = 0; i < 5; i++) opened.push(window.open('/static?popup=' + i, '_blank'));
        const check = setInterval(() => {
          if (opened.every((w) => w && w.closed)) {
            clearInterval(check);
            document.body.insertAdjacentHTML('beforeend', '<p id=all-closed>all closed</p>');
          }
        }, 50);</script>""")
    site.page("/endless", """<title>endless</title><div id=feed></div><script>
        let n = 0; const add = () => { for (let i = 0; i < 5; i++) document.getElementById('feed')
          .insertAdjacentHTML('beforeend', '<div style="height:400px">item ' + (++n) + '</div>'); };
        add(); window.addEventListener('scroll', add);</script>""")
    @site.route("/protected")
    async def protected(request):
        return web.Response(status=401, text="who are you?", headers={"WWW-Authenticate": 'Basic realm="r"'})

    site.page("/asks-for-login", "<title>asks</title><img src=/protected><script src=/protected></script><script>"
                                 "fetch('/protected').then(r => document.title = 'asked: ' + r.status)</script>")
    site.page("/tall", "<title>tall</title>" + "".join(f"<div style='height:500px'>row {i}</div>" for i in range(100)))
    return site


async def outcome_then_normal(bus, settings, site, url: str, *, steps=(), options=None, **worker):
    """Run the hostile URL, then a normal page, through one worker; returns (letters, results)."""
    await enqueue(bus.js, url, steps=steps, options=options)
    await enqueue(bus.js, site.url("/static?after=1"))
    await asyncio.wait_for(run_worker(bus, settings, concurrency=1, **worker), BUDGET)
    done = await results(bus.js)
    assert any(r.url == site.url("/static?after=1") and r.status == 200 for r in done), "normal page not served"
    return await dead_letters(bus.js), [r for r in done if r.url == url]


async def test_a_page_that_never_finishes_loading(wbus, wsettings, hostile):
    letters, _ = await outcome_then_normal(wbus, wsettings, hostile, hostile.url("/never"), navigation_timeout=1)
    assert [d.reason for d in letters] == ["timeout"]


async def test_an_infinite_redirect_loop(wbus, wsettings, hostile):
    letters, _ = await outcome_then_normal(wbus, wsettings, hostile, hostile.url("/loop"))
    assert [d.reason for d in letters] == ["redirect_loop"] and len(letters[0].attempts) == 1


async def test_a_50mb_page_is_refused_by_its_content_length(wbus, wsettings, hostile):
    letters, _ = await outcome_then_normal(wbus, wsettings, hostile, hostile.url("/huge"))
    assert [d.reason for d in letters] == ["page_too_large"]
    # the Content-Length check's words (the rendered-size check says "rendered HTML is …")
    size = len(b"<p>" + b"x" * (50 * 1024 * 1024) + b"</p>")
    assert letters[0].error.startswith(f"{hostile.url('/huge')} is {size} bytes, over max_page_bytes")


async def test_a_page_without_a_content_length_is_refused_by_its_rendered_size(wbus, wsettings, hostile):
    letters, _ = await outcome_then_normal(wbus, wsettings, hostile, hostile.url("/huge-chunked"),
                                           max_page_bytes=1024 * 1024)
    assert [d.reason for d in letters] == ["page_too_large"]
    assert letters[0].error.startswith("rendered HTML is ") and "over max_page_bytes 1048576" in letters[0].error


async def test_a_page_that_eats_memory_until_its_tab_crashes(wbus, wsettings, hostile):
    short = wsettings.with_overrides(streams={"worker_max_deliver": 2})
    await provision.apply(wbus.js, topology.load(short))
    letters, _ = await outcome_then_normal(wbus, short, hostile, hostile.url("/hog"), navigation_timeout=60)
    assert [d.reason for d in letters] == ["page_crashed"] and len(letters[0].attempts) == 2


async def test_subresources_that_ask_for_a_login_do_not_hold_the_page(wbus, wsettings, hostile):
    # Nobody can answer a login prompt: the 401s reach the page as they are, and it loads.
    letters, [result] = await outcome_then_normal(wbus, wsettings, hostile, hostile.url("/asks-for-login"),
                                                  steps=(WaitFor(selector="title", selector_state="attached"),))
    assert letters == [] and result.status == 200


async def test_a_page_that_asks_for_a_login_is_its_status(wbus, wsettings, hostile):
    # A 401 document is an HTTP status for the status policy (401 dead-letters at once by
    # default), not a network error retried until the attempts run out.
    letters, _ = await outcome_then_normal(wbus, wsettings, hostile, hostile.url("/protected"))
    assert [d.reason for d in letters] == ["http_401"] and len(letters[0].attempts) == 1


async def test_dialogs_are_dismissed_and_leaving_the_page_is_allowed(wbus, wsettings, hostile):
    steps = (WaitFor(selector="#answers:not(:empty)"), Click(selector="#away"), WaitFor(selector="h1"))
    letters, [result] = await outcome_then_normal(wbus, wsettings, hostile, hostile.url("/dialogs"), steps=steps)
    assert letters == [] and result.final_url == hostile.url("/static?left=1") and result.title == "Static page"


async def test_a_download_is_dead_lettered_not_saved(wbus, wsettings, hostile):
    letters, _ = await outcome_then_normal(wbus, wsettings, hostile, hostile.url("/download"))
    assert [d.reason for d in letters] == ["download"] and len(letters[0].attempts) == 1  # dead at once


async def test_a_pdf(wbus, wsettings, hostile):
    letters, done = await outcome_then_normal(wbus, wsettings, hostile, hostile.url("/doc.pdf"))
    # Headless Chromium hands a PDF to its download path: a clear dead letter at once, not a hang
    # (docs/worker.md's promise).
    assert done == [] and [d.reason for d in letters] == ["download"] and len(letters[0].attempts) == 1


async def test_popups_are_closed_and_the_opener_archived(wbus, wsettings, hostile):
    # The step waits (within the navigation timeout) for the page to see all five popups closed.
    letters, [result] = await outcome_then_normal(wbus, wsettings, hostile, hostile.url("/popups"),
                                                  steps=(WaitFor(selector="#all-closed"),))
    assert letters == [] and result.title == "popups"


async def test_infinite_scroll_stops_at_the_cap(wbus, wsettings, hostile):
    steps = (Scroll(mode="infinite", max_scrolls=4, delay=0.1),)
    letters, [result] = await outcome_then_normal(wbus, wsettings, hostile, hostile.url("/endless"), steps=steps)
    html = (await ArtifactStore(wbus.js).read(next(a for a in result.artifacts if a.kind == "html"))).decode()
    assert letters == [] and 10 <= html.count(">item ") <= 5 * 6


# -- limits ---------------------------------------------------------------------------------------


async def test_max_har_bytes(wbus, wsettings, hostile):
    hostile.page("/many", "<title>many</title>" + "".join(f"<img src=/pixel.svg?{i}>" for i in range(60)))
    letters, _ = await outcome_then_normal(wbus, wsettings, hostile, hostile.url("/many"), max_har_bytes=10_000)
    assert [d.reason for d in letters] == ["har_too_large"] and "without bodies" in letters[0].error


async def test_max_screenshot_height(wbus, wsettings, hostile):
    letters, [result] = await outcome_then_normal(wbus, wsettings, hostile, hostile.url("/tall"),
                                                  options=TaskOptions(artifacts=("screenshot",), screenshot="full"),
                                                  max_screenshot_height=3000)
    [shot] = result.artifacts
    assert letters == [] and png_size(await ArtifactStore(wbus.js).read(shot)) == (1280, 3000)


async def test_the_default_screenshot_is_the_viewport(wbus, wsettings, hostile):
    letters, [result] = await outcome_then_normal(wbus, wsettings, hostile, hostile.url("/tall"),
                                                  options=TaskOptions(artifacts=("screenshot",)))
    [shot] = result.artifacts
    assert letters == [] and png_size(await ArtifactStore(wbus.js).read(shot)) == (1280, 800)


async def test_max_steps(wbus, wsettings, hostile):
    steps = tuple(WaitFor(state="load") for _ in range(5))
    letters, _ = await outcome_then_normal(wbus, wsettings, hostile, hostile.url("/static?s=1"), steps=steps,
                                           max_steps=3)
    assert [d.reason for d in letters] == ["too_many_steps"] and "over max_steps 3" in letters[0].error


async def test_task_total_timeout(wbus, wsettings, hostile):
    """A ten-second step under a five-second ``task_timeout``. The normal page after it has the
    same bound and one delivery: two seconds were seen to be too little for it on a loaded machine."""
    short = wsettings.with_overrides(streams={"worker_max_deliver": 1})
    await provision.apply(wbus.js, topology.load(short))
    letters, _ = await outcome_then_normal(wbus, short, hostile, hostile.url("/static?t=1"),
                                           steps=(Sleep(duration=10),), task_timeout=5)
    assert [d.reason for d in letters] == ["task_timeout"] and "task_timeout" in letters[0].error


async def test_max_warc_bytes_bounds_a_heavy_page_and_its_warc_stays_valid(wbus, wsettings, hostile, tmp_path):
    # Big bodies (one with no Content-Length), an endless stream and a download in one page:
    # the worker's WARC of it is valid and within max_warc_bytes (plus its records' headers).
    import os
    import subprocess
    import sys
    from pathlib import Path

    @hostile.route("/heavy.bin")
    async def heavy(request):
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        for _ in range(2):  # incompressible and unlike any other (no revisit): the WARC's size is its payload's
            await response.write(os.urandom(1024 * 1024))
        await response.write_eof()
        return response

    @hostile.route("/stream")
    async def stream(request):
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        while True:
            await response.write(b"x" * 65536)
            await asyncio.sleep(0.05)

    hostile.page("/heavy", "<title>heavy</title><iframe src=/download></iframe><script>"
                           "fetch('/stream').then(r => r.body.getReader().read());"
                           "Promise.all([1, 2, 3].map(i => fetch('/heavy.bin?' + i).then(r => r.arrayBuffer())))"
                           ".then(() => document.body.insertAdjacentHTML('beforeend', '<p id=loaded>ok</p>'))</script>")
    limit = 4 * 1024 * 1024 + 64 * 1024  # two heavy bodies and the page itself
    letters, [result] = await outcome_then_normal(
        wbus, wsettings, hostile, hostile.url("/heavy"), steps=(WaitFor(selector="#loaded"),),
        options=TaskOptions(artifacts=("html", "warc")), max_warc_bytes=limit, max_warc_body_bytes=3 * 1024 * 1024)
    [ref] = [a for a in result.artifacts if a.kind == "warc"]
    assert letters == [] and ref.name == "page.warc.gz" and ref.size < limit + 64 * 1024  # + records' headers
    path = tmp_path / "page.warc.gz"
    path.write_bytes(await ArtifactStore(wbus.js).read(ref))
    check = subprocess.run([str(Path(sys.executable).parent / "warcio"), "check", "-v", str(path)],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0 and "digest fail" not in check.stdout, check.stdout[-2000:]
    from warcio.archiveiterator import ArchiveIterator

    with path.open("rb") as handle:
        cut = {r.rec_headers.get_header("WARC-Target-URI").rsplit("/", 1)[1]:
               r.rec_headers.get_header("WARC-Truncated") for r in ArchiveIterator(handle) if r.rec_type == "response"}
    # Two 2 MiB bodies fit in 4 MiB, the third does not; the endless stream is cut at the capture.
    heavy_cuts = sorted(str(cut.get(f"heavy.bin?{i}", "missing")) for i in (1, 2, 3))
    assert cut["stream"] == "time" and heavy_cuts == ["None", "None", "length"], warc_notes(path)


def warc_notes(path):
    from warcio.archiveiterator import ArchiveIterator

    with path.open("rb") as handle:
        return [orjson.loads(r.content_stream().read()) for r in ArchiveIterator(handle) if r.rec_type == "metadata"]
