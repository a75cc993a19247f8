"""The WARC recorder on a real Chromium, checked by tools nobody here wrote: ``warcio check``
(every digest), ``cdxj-indexer`` (every capture indexed), warcio's own reader."""

from __future__ import annotations

import asyncio
import base64
import gzip
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from aiohttp import web
from warcio.archiveiterator import ArchiveIterator

from busscrape.worker.warc import PayloadIndex, Resource, WarcRecorder

# The shared Chromium (conftest ``chromium``) lives on the session's loop.
pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]

BIN = Path(sys.executable).parent
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
BIG_CSS = "body{color:red}\n" + "/* padding */\n" * 200  # over MIN_REVISIT: identical copies are revisits


def warc_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=120)


def records(path: Path) -> list:
    out = []
    with path.open("rb") as handle:
        for record in ArchiveIterator(handle):
            out.append((record.rec_type, dict(record.rec_headers.headers), record.http_headers,
                        record.content_stream().read()))
    return out


def by_type(recs: list, kind: str) -> list:
    return [r for r in recs if r[0] == kind]


@pytest.fixture
def browser(chromium):
    return chromium


@pytest.fixture
def traffic(site):
    site.page("/", "<title>T</title><link rel=stylesheet href=/a.css><link rel=stylesheet href=/b.css>"
                   "<img src=/p.png><img src=/gone.png><div id=out></div>"
                   "<script>fetch('/api', {method: 'POST', body: 'q=1'}).then(r => r.json())"
                   ".then(j => document.getElementById('out').textContent = 'rendered ' + j.n)</script>")
    site.page("/a.css", BIG_CSS, headers={"Content-Type": "text/css"})
    site.page("/b.css", BIG_CSS, headers={"Content-Type": "text/css"})

    @site.route("/p.png")
    async def png(request):
        return web.Response(body=PNG, content_type="image/png", headers={"Set-Cookie": "a=1"})

    @site.route("/api")
    async def api(request):
        return web.json_response({"n": 42}, headers={"Set-Cookie": "b=2"})

    @site.route("/moved")
    async def moved(request):
        raise web.HTTPFound("/")

    return site


async def record(browser, url: str, path: Path, *, wait_until: str = "load", payloads: PayloadIndex | None = None,
                 settle_js: str | None = None, finished: tuple[str, int] | None = None, **limits) -> WarcRecorder:
    """Record ``url`` until ``settle_js`` is true in the page and (``finished``: a path's end and a
    count) that many requests to that path have finished in the browser as the recorder saw them:
    a script sees a response before its network events reach the recorder."""
    page = await (await browser.new_context()).new_page()
    warc = WarcRecorder(page, max_body_bytes=limits.get("max_body_bytes", 1 << 20),
                        max_total_bytes=limits.get("max_total_bytes", 8 << 20), payloads=payloads,
                        browser_version="test")
    done = asyncio.Event()
    seen = []
    if finished is not None:
        # After the recorder's own listener, so it has seen each request this one counts.
        page.on("requestfinished", lambda r: (seen.append(r), len(seen) >= finished[1] and done.set())
                if r.url.endswith(finished[0]) else None)
    await page.goto(url, wait_until=wait_until)
    if settle_js:
        await page.wait_for_function(settle_js)
    if finished is not None:
        await asyncio.wait_for(done.wait(), 30)
    spool = await warc.finish({"url": url, "final_url": page.url, "title": await page.title()},
                              [Resource(f"urn:dom:{page.url}", "text/html", (await page.content()).encode())])
    path.write_bytes(spool.read())
    spool.close()
    await page.context.close()
    return warc


async def test_a_page_as_warc_passes_warcio_check_and_indexes(browser, traffic, tmp_path):
    path = tmp_path / "page.warc.gz"
    await record(browser, traffic.url("/moved"), path, settle_js="document.getElementById('out').textContent")
    check = warc_tool("warcio", "check", "-v", str(path))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "digest pass" in check.stdout and "digest fail" not in check.stdout
    index = warc_tool("cdxj-indexer", str(path))
    assert index.returncode == 0, index.stderr
    indexed = index.stdout
    for target in ("/moved", ")/a.css", ")/p.png", ")/gone.png", ")/api"):
        assert target in indexed, (target, indexed)

    recs = records(path)
    assert recs[0][0] == "warcinfo" and recs[0][1]["WARC-Type"] == "warcinfo"
    assert all(r[1].get("WARC-Date") for r in recs)
    responses = {r[1]["WARC-Target-URI"].rsplit("/", 1)[1]: r for r in by_type(recs, "response")}
    requests = by_type(recs, "request")
    ids = {r[1]["WARC-Record-ID"] for r in recs if r[0] in ("response", "revisit")}
    assert requests and all(r[1]["WARC-Concurrent-To"] in ids for r in requests)
    assert responses["moved"][2].get_statuscode() == "302" and responses["moved"][3] == b""
    assert responses["p.png"][3] == PNG
    assert responses["gone.png"][2].get_statuscode() == "404"
    # Repeated headers stay separate headers; decoded bodies do not claim an encoding.
    assert responses["p.png"][2].get_header("Set-Cookie") == "a=1"
    post = next(r for r in requests if r[1]["WARC-Target-URI"].endswith("/api"))
    assert post[2].protocol.startswith("POST") and post[3] == b"q=1"
    # Two stylesheets with one payload: the second is a revisit of the first.
    [revisit] = by_type(recs, "revisit")
    css = [r for r in recs if r[0] in ("response", "revisit") and r[1]["WARC-Target-URI"].endswith(".css")]
    first = next(r for r in css if r[0] == "response")
    assert revisit[1]["WARC-Refers-To-Target-URI"] == first[1]["WARC-Target-URI"]
    assert revisit[1]["WARC-Payload-Digest"] == first[1]["WARC-Payload-Digest"]
    assert revisit[1]["WARC-Profile"].endswith("identical-payload-digest")
    [meta] = by_type(recs, "metadata")
    [dom] = by_type(recs, "resource")
    main = responses[""][1]["WARC-Record-ID"]
    assert meta[1]["WARC-Concurrent-To"] == main and dom[1]["WARC-Concurrent-To"] == main
    assert b"rendered 42" in dom[3] and dom[1]["WARC-Target-URI"].startswith("urn:dom:")
    assert meta[1]["WARC-Target-URI"].startswith("urn:pageinfo:")  # never taken for a capture of the page


async def test_revisits_span_pages_of_one_worker_once_the_first_is_handed_over(browser, traffic, tmp_path):
    payloads = PayloadIndex()
    first = await record(browser, traffic.url("/a.css"), tmp_path / "one.warc.gz", payloads=payloads)
    await record(browser, traffic.url("/b.css"), tmp_path / "alone.warc.gz", payloads=payloads)
    assert not by_type(records(tmp_path / "alone.warc.gz"), "revisit")  # the first page's result does not stand yet
    payloads.add(first.stored)  # what the worker does once the first page's result stands
    await record(browser, traffic.url("/b.css"), tmp_path / "two.warc.gz", payloads=payloads)
    assert not by_type(records(tmp_path / "one.warc.gz"), "revisit")
    [revisit] = by_type(records(tmp_path / "two.warc.gz"), "revisit")
    assert revisit[1]["WARC-Refers-To-Target-URI"].endswith("/a.css")


async def test_bodies_over_the_caps_are_cut_and_marked(browser, traffic, tmp_path):
    path = tmp_path / "page.warc.gz"
    warc = await record(browser, traffic.url("/"), path, max_body_bytes=1024, max_total_bytes=3000)
    assert warc_tool("warcio", "check", str(path)).returncode == 0
    recs = records(path)
    cut = [r for r in recs if r[1].get("WARC-Truncated") == "length"]
    assert cut and all(len(r[3]) <= 1024 for r in cut)
    payload = sum(len(r[3]) for r in recs if r[0] in ("response", "resource"))
    assert payload <= 3000
    assert warc.notes and all("over the limit" in n["note"] or "cut" in n["note"] for n in warc.notes
                              if "urn:" not in n["url"])


async def test_request_bodies_count_against_the_pages_warc(browser, site, tmp_path):
    """Twenty POSTs of 100 KB under max_warc_bytes 300 KB: the WARC's bodies, requests' as
    responses', stay within it; the cut ones say so."""
    site.page("/", "<title>posts</title><div id=out></div><script>(async () => {"
                   "for (let i = 0; i < 20; i++) await fetch('/up', {method: 'POST', body: 'p'.repeat(100000)});"
                   "document.getElementById('out').textContent = 'sent'})()</script>")

    @site.route("/up")
    async def up(request):
        await request.read()
        return web.Response(text="ok")

    path = tmp_path / "page.warc.gz"
    warc = await record(browser, site.url("/"), path, settle_js="document.getElementById('out').textContent",
                        finished=("/up", 20), max_body_bytes=1 << 20, max_total_bytes=300_000)
    assert warc_tool("warcio", "check", str(path)).returncode == 0
    recs = records(path)
    posts = [r for r in by_type(recs, "request") if r[1]["WARC-Target-URI"].endswith("/up")]
    assert len(posts) == 20
    assert sum(len(r[3]) for r in recs if r[0] in ("request", "response", "resource")) <= 300_000
    assert any(r[1].get("WARC-Truncated") == "length" for r in posts)
    assert any("request body cut" in n["note"] for n in warc.notes)


async def test_a_request_that_finishes_during_the_capture_is_recorded_once(browser, site, tmp_path):
    """A body still loading when the page is captured is recorded as such (``time``), once: the
    request finishing while that record is written adds no second record behind it (it did, in
    CI: 21 request records for 20 POSTs). The test's own wrapper holds the record's write until
    the request has finished in the browser, so the interleaving happens every run."""
    release = threading.Event()
    site.page("/", "<title>slow</title><script>fetch('/slow').then(r => r.text())</script>")

    @site.route("/slow")
    async def half_then_the_rest(request):
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(b"first half ")
        await asyncio.to_thread(release.wait, 30)
        await response.write(b"second half")
        await response.write_eof()
        return response

    page = await (await browser.new_context()).new_page()
    warc = WarcRecorder(page, max_body_bytes=1 << 20, max_total_bytes=8 << 20, browser_version="test")
    async with page.expect_response("**/slow"):
        await page.goto(site.url("/"))
    store = warc._store

    async def store_as_the_request_finishes(response, body, truncated, why):
        if truncated == "time":
            async with page.expect_event("requestfinished", lambda r: r.url.endswith("/slow")):
                release.set()
            await asyncio.sleep(0.2)  # the finished event's handlers run
        await store(response, body, truncated, why)

    warc._store = store_as_the_request_finishes
    spool = await warc.finish({"url": site.url("/")}, [])
    for _ in range(50):  # whatever the finished event set going has finished too
        if not warc._recording:
            break
        await asyncio.sleep(0.1)
    path = tmp_path / "page.warc.gz"
    path.write_bytes(spool.read())
    spool.close()
    await page.context.close()
    assert warc_tool("warcio", "check", str(path)).returncode == 0
    slow = [r for r in records(path) if r[0] == "response" and r[1]["WARC-Target-URI"].endswith("/slow")]
    assert [r[1].get("WARC-Truncated") for r in slow] == ["time"]


# -- hostile pages ------------------------------------------------------------------------------


@pytest.fixture
def hostile(site):
    site.page("/", "<title>hostile</title><p>here</p><iframe src=/download></iframe>"
                   "<script>fetch('/forever').then(r => r.body.getReader().read());"
                   "fetch('/big.js').then(r => r.text()).then(t => document.title = 'big ' + t.length)</script>")

    @site.route("/forever")
    async def forever(request):
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        while True:  # an endless stream: the request never finishes
            await response.write(b"x" * 65536)
            await asyncio.sleep(0.05)

    @site.route("/big.js")
    async def big(request):
        response = web.StreamResponse(headers={"Content-Type": "text/javascript"})  # chunked: no length
        await response.prepare(request)
        for _ in range(30):
            await response.write(b"/" * (1024 * 1024))
        await response.write_eof()
        return response

    @site.route("/download")
    async def download(request):
        return web.Response(body=b"a,b\n1,2\n", content_type="text/csv",
                            headers={"Content-Disposition": 'attachment; filename="data.csv"'})

    return site


async def test_hostile_pages_give_bounded_valid_warcs(browser, hostile, tmp_path):
    path = tmp_path / "page.warc.gz"
    warc = await record(browser, hostile.url("/"), path, settle_js="document.title.startsWith('big')",
                        max_body_bytes=4 << 20, max_total_bytes=6 << 20)
    check = warc_tool("warcio", "check", "-v", str(path))
    assert check.returncode == 0 and "digest fail" not in check.stdout, check.stdout
    recs = records(path)
    assert path.stat().st_size < 6 << 20
    by_uri = {r[1]["WARC-Target-URI"].rsplit("/", 1)[1]: r for r in recs if r[0] == "response"}
    assert by_uri["forever"][1]["WARC-Truncated"] == "time" and by_uri["forever"][3] == b""
    assert by_uri["big.js"][1]["WARC-Truncated"] == "length" and len(by_uri["big.js"][3]) <= 4 << 20
    notes = {n["url"].rsplit("/", 1)[1]: n["note"] for n in warc.notes}
    assert "forever" in notes and "big.js" in notes
    assert "download" in notes or "download" in by_uri  # a download is a note or a response, never a crash


# -- what the wire said, as the WARC keeps it ------------------------------------------------------

SECRET = "Bearer warc-secret-4242"
STYLE = "body{color:#123456}\n" * 50


@pytest.fixture
def wire(site):
    site.page("/", "<title>wire</title><link rel=stylesheet href=/zipped.css>"
                   "<script>fetch('/private', {headers: {Authorization: '" + SECRET + "'}})"
                   ".then(r => r.text()).then(t => fetch('/cut')).then(r => r.text())"
                   ".catch(e => 'cut').then(() => document.title = 'done')</script>")

    @site.route("/zipped.css")
    async def zipped(request):
        return web.Response(body=gzip.compress(STYLE.encode()), headers={"Content-Type": "text/css",
                                                                         "Content-Encoding": "gzip"})

    @site.route("/private")
    async def private(request):
        assert request.headers["Authorization"] == SECRET  # the page did send it
        return web.Response(text="for your eyes", content_type="text/plain")

    @site.route("/cut")
    async def cut(request):
        """Promises 100000 bytes, sends 1000 and hangs up: the browser sees the connection cut."""
        response = web.StreamResponse(headers={"Content-Type": "text/plain", "Content-Length": "100000"})
        await response.prepare(request)
        await response.write(b"x" * 1000)
        request.transport.close()
        return response

    return site


async def test_compressed_responses_authorization_and_a_cut_connection_in_the_warc(browser, wire, tmp_path):
    """A gzip response is stored decoded and says so (``X-Archive-Orig-Content-Encoding``, no
    ``Content-Encoding`` a replay tool would decode again); a request's ``Authorization`` is
    masked as in the HAR; a body cut by a disconnect is ``WARC-Truncated: disconnect``."""
    path = tmp_path / "page.warc.gz"
    await record(browser, wire.url("/"), path, settle_js="document.title === 'done'")
    check = warc_tool("warcio", "check", "-v", str(path))
    assert check.returncode == 0 and "digest fail" not in check.stdout, check.stdout + check.stderr
    recs = records(path)
    responses = {r[1]["WARC-Target-URI"].rsplit("/", 1)[1]: r for r in by_type(recs, "response")}
    css = responses["zipped.css"]
    assert css[3] == STYLE.encode()  # decoded, as the browser used it
    assert css[2].get_header("Content-Encoding") is None, css[2]
    assert css[2].get_header("X-Archive-Orig-Content-Encoding") == "gzip"
    assert css[2].get_header("Content-Length") == str(len(STYLE))
    requests = {r[1]["WARC-Target-URI"].rsplit("/", 1)[1]: r for r in by_type(recs, "request")}
    assert requests["private"][2].get_header("Authorization") == "[masked]"
    assert not any(SECRET in str(r[2]) for r in by_type(recs, "request"))  # in the page's script only
    assert responses["cut"][1]["WARC-Truncated"] == "disconnect", responses["cut"][1]


async def test_the_har_and_the_warc_share_one_fetch_of_each_body(browser, traffic, tmp_path):
    # #39: both recorders keep bodies; each body comes out of the browser once, into both files.
    import orjson

    from busscrape.worker.bodies import ResponseBodies
    from busscrape.worker.har import HarRecorder

    page = await (await browser.new_context()).new_page()
    bodies = ResponseBodies(readers=2)
    har = HarRecorder(page, embed_bodies=True, bodies=bodies)
    warc = WarcRecorder(page, max_body_bytes=1 << 20, max_total_bytes=8 << 20, browser_version="test",
                        bodies=bodies)
    url = traffic.url("/")
    await page.goto(url, wait_until="load")
    await page.wait_for_function("document.getElementById('out').textContent")
    await har.settle()
    spool = await warc.finish({"url": url, "final_url": page.url, "title": "T"}, [])
    path = tmp_path / "page.warc.gz"
    path.write_bytes(spool.read())
    spool.close()
    await page.context.close()

    doc = orjson.loads(har.build(browser_version="x", page_timings={}, max_bytes=10**7)[0])["log"]
    in_har = {e["request"]["url"]: e["response"]["content"] for e in doc["entries"]}
    in_warc = {r[1]["WARC-Target-URI"]: r[3] for r in by_type(records(path), "response")}
    kept = {u: body for u, body in in_warc.items() if body}
    assert {traffic.url(p) for p in ("/", "/a.css", "/p.png", "/api")} <= set(kept)
    for u, body in kept.items():
        content = in_har[u]
        text = content["text"]
        assert (base64.b64decode(text) if content.get("encoding") == "base64" else text.encode()) == body, u
    revisits = by_type(records(path), "revisit")  # /b.css: the same bytes as /a.css, fetched all the same
    assert [r[1]["WARC-Target-URI"] for r in revisits] == [traffic.url("/b.css")]
    # One fetch per response that has a body, not one per recorder (two before the shared fetch).
    assert bodies.fetched == len(kept) + len(revisits), (bodies.fetched, sorted(kept))
    assert not bodies._fetches, "a body both recorders finished with is still held"
