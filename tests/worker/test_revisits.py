"""WARC revisits never point at a record that was not archived, with a real Chromium worker on a
real nats-server: a page whose capture succeeded but whose task failed after it (its extractor
found nothing) leaves no payload for a later page to refer to; only once a page's result stands
do later pages of the same worker refer to it (``warc_revisits = "worker"``); by default every
page's WARC stands alone."""

from __future__ import annotations

import gzip
import io

import pytest
from warcio.archiveiterator import ArchiveIterator

from busscrape.artifacts.store import ArtifactStore
from busscrape.bus import provision, topology
from busscrape.model.messages import TaskOptions
from busscrape.worker.daemon import Worker
from tests.support.bus import dead_letters, enqueue, results

pytestmark = pytest.mark.browser

CSS = "body{color:red}\n" + "/* padding */\n" * 200  # over MIN_REVISIT
NEED_PRICE = 'version = 1\n[fields.price]\ncss = "p.price"\nrequired = true\n'


def shared_css_site(site) -> None:
    site.page("/style.css", CSS, headers={"Content-Type": "text/css"})
    for name in ("failed", "second", "third"):
        site.page(f"/{name}", f"<title>{name}</title><link rel=stylesheet href=/style.css><p>{name}</p>")


async def css_record_of(bus, url: str) -> str:
    """The WARC-Type of the stylesheet's record in the WARC of the page at ``url``."""
    [result] = [r for r in await results(bus.js) if r.url == url]
    ref = next(a for a in result.artifacts if a.kind == "warc")
    data = gzip.decompress(await ArtifactStore(bus.js).read(ref))
    kinds = [r.rec_type for r in ArchiveIterator(io.BytesIO(data))
             if r.rec_type in ("response", "revisit") and r.rec_headers.get_header("WARC-Target-URI").endswith(".css")]
    assert len(kinds) == 1, kinds
    return kinds[0]


@pytest.mark.parametrize("mode", ["worker", "page"])
async def test_revisits_refer_only_to_pages_whose_result_stands(bus, wsettings, site, tmp_path, mode):
    shared_css_site(site)
    folder = tmp_path / "extractors"
    folder.mkdir()
    (folder / "need-price.toml").write_text(NEED_PRICE)
    s = wsettings.with_overrides(worker={"concurrency": 1, "warc_revisits": mode}, extract={"dir": str(folder)})
    await provision.apply(bus.js, topology.load(s))
    # One worker, one page at a time, in this order: its PayloadIndex is what a revisit comes from.
    await enqueue(bus.js, site.url("/failed"), options=TaskOptions(artifacts=("warc",), extractor="need-price"))
    await enqueue(bus.js, site.url("/second"), options=TaskOptions(artifacts=("warc",)))
    await enqueue(bus.js, site.url("/third"), options=TaskOptions(artifacts=("warc",)))
    async with Worker(bus, s) as worker:
        await worker.run()
    assert [d.reason for d in await dead_letters(bus.js)] == ["extraction_failed"]
    assert await css_record_of(bus, site.url("/second")) == "response"  # never a revisit of /failed's
    assert await css_record_of(bus, site.url("/third")) == ("revisit" if mode == "worker" else "response")
