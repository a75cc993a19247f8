"""Packaging page WARCs as a WACZ in the archive (folder and S3), checked by ``wacz validate``."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import orjson
import pytest
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from busscrape.archive import wacz
from busscrape.errors import PermanentError
from tests.archive.test_storage import storage  # noqa: F401 - fixture (folder and S3)
from tests.support import cli

BIN = Path(sys.executable).parent


def page_warc(url: str, html: str) -> bytes:
    """A small WARC of one page, as the recorder writes them (a response and its request)."""
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=True, warc_version="1.1")
    body = html.encode()
    http = StatusAndHeaders("200 OK", [("Content-Type", "text/html"), ("Content-Length", str(len(body)))],
                            protocol="HTTP/1.1")
    response = writer.create_warc_record(url, "response", payload=io.BytesIO(body), length=len(body),
                                         http_headers=http)
    request = writer.create_warc_record(url, "request", http_headers=StatusAndHeaders(
        "GET / HTTP/1.1", [("Host", url.split("/")[2])], is_http_request=True))
    writer.write_request_response_pair(request, response)
    return out.getvalue()


def revisit_warc(url: str, original: bytes) -> bytes:
    """A WARC whose one response is a revisit of the response in ``original``."""
    from warcio.archiveiterator import ArchiveIterator

    first = next(r for r in ArchiveIterator(io.BytesIO(original)) if r.rec_type == "response")
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=True, warc_version="1.1")
    headers = first.rec_headers
    writer.write_record(writer.create_revisit_record(
        url, headers.get_header("WARC-Payload-Digest"), headers.get_header("WARC-Target-URI"),
        headers.get_header("WARC-Date"), http_headers=StatusAndHeaders("200 OK", [], protocol="HTTP/1.1")))
    return out.getvalue()


async def archive_page(store, task_id: str, url: str, *, with_warc: bool = True, warc: bytes | None = None) -> str:
    folder = f"dt=2026-12-02/host=example.org/{task_id}"
    objects = []
    if with_warc:
        await store.put_bytes(f"{folder}/page.warc.gz", warc or page_warc(url, f"<title>{task_id}</title>"),
                              content_type="application/warc")
        objects.append({"name": "page.warc.gz", "key": f"{folder}/page.warc.gz"})
    await store.put_bytes(f"{folder}/meta.json", orjson.dumps({"task_id": task_id, "url": url, "title": task_id,
                                                               "objects": objects}), content_type="application/json")
    return folder


async def package_pages(store, key: str, path: Path) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    data = await store.get(key)
    assert data is not None
    path.write_bytes(data)
    checked = subprocess.run([str(BIN / "wacz"), "validate", "-f", str(path)], capture_output=True, text=True,
                             timeout=120)
    with zipfile.ZipFile(path) as package:
        lines = [json.loads(line) for line in package.read("pages/pages.jsonl").splitlines() if line.strip()]
    return [p["url"] for p in lines if "url" in p], checked


async def test_pack_validates_lists_every_page_and_grows_when_packed_again(storage, tmp_path):  # noqa: F811
    one = await archive_page(storage, "a" * 32, "http://example.org/one")
    two = await archive_page(storage, "b" * 32, "http://example.org/two")
    bare = await archive_page(storage, "c" * 32, "http://example.org/bare", with_warc=False)

    first = await wacz.pack(storage, [one, bare], "crawl")
    assert first.key == "wacz/crawl.wacz" and first.pages == 1
    assert first.skipped == [f"{bare}: no WARC (the task did not ask for the warc artifact)"]
    urls, checked = await package_pages(storage, first.key, tmp_path / "first.wacz")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert urls == ["http://example.org/one"]

    # The crawl grew: packing again under the same name keeps the first page and adds the new one.
    second = await wacz.pack(storage, [two], "crawl")
    urls, checked = await package_pages(storage, second.key, tmp_path / "second.wacz")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert sorted(urls) == ["http://example.org/one", "http://example.org/two"] and second.pages == 2


async def test_page_folders_finds_every_warc_under_a_prefix(storage):  # noqa: F811
    one = await archive_page(storage, "a" * 32, "http://example.org/one")
    await archive_page(storage, "c" * 32, "http://example.org/bare", with_warc=False)
    assert await wacz.page_folders(storage, "dt=2026-12-02") == [one]
    assert await wacz.page_folders(storage, "dt=2026-12-03") == []


async def test_nothing_to_pack_and_bad_names_are_clear_errors(storage):  # noqa: F811
    bare = await archive_page(storage, "c" * 32, "http://example.org/bare", with_warc=False)
    with pytest.raises(PermanentError, match="no page WARC to package"):
        await wacz.pack(storage, [bare], "crawl")
    with pytest.raises(PermanentError, match="plain file name"):
        await wacz.pack(storage, [bare], "../escape")


async def test_the_wacz_command_packs_what_is_under_a_prefix_and_says_when_there_is_nothing(tmp_path):
    from busscrape.archive.storage.local import FileStorage

    async with FileStorage(tmp_path / "archive") as store:
        await archive_page(store, "a" * 32, "http://example.org/one")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUSSCRAPE_")}

    def wacz_cmd(*args: str) -> subprocess.CompletedProcess[str]:
        return cli.busscrape("wacz", *args, "--archive", str(tmp_path / "archive"), timeout=120,
                             env={**env, "COLUMNS": "200"})

    done = wacz_cmd("crawl", "--under", "dt=2026-12-02")
    assert done.returncode == 0 and "wacz: wacz/crawl.wacz · 1 pages" in done.stdout, done.stdout + done.stderr
    assert (tmp_path / "archive" / "wacz" / "crawl.wacz").exists()
    empty = wacz_cmd("other", "--under", "dt=1999-01-01")
    assert empty.returncode == 2 and "no page WARC to package" in empty.stderr, empty.stdout + empty.stderr


async def test_a_package_says_when_a_revisit_has_no_original_in_it(storage):  # noqa: F811
    """A revisit (``warc_revisits = "worker"``) of a page left out of the package is counted."""
    original = page_warc("http://example.org/one", "<title>same</title>")
    one = await archive_page(storage, "a" * 32, "http://example.org/one", warc=original)
    two = await archive_page(storage, "b" * 32, "http://example.org/two",
                             warc=revisit_warc("http://example.org/two", original))
    assert (await wacz.pack(storage, [two], "alone")).dangling == 1
    assert (await wacz.pack(storage, [one, two], "together")).dangling == 0
