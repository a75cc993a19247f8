"""``busscrape.run`` and ``busscrape.crawl`` from Python, embedded: a real nats-server, Chromium
workers and an ingester, pages served on loopback; the datasets they write read by DuckDB."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import orjson
import pytest

import busscrape
from busscrape.ops.lifeline import running
from tests.e2e.test_run import children_of, pid_files
from tests.support import crawl_site, pages

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def embedded(tmp_path, monkeypatch, site):
    """The API's keyword arguments every test gives: the site's hosts opened, one worker process."""
    monkeypatch.chdir(tmp_path)  # the state dir (.busscrape/) and the archive under the test's folder
    before = set(children_of(os.getpid()))
    yield {"allow": [f"{h}/32" for h in site.hosts], "workers": 1, "concurrency": 2}
    left = {pid: cmd for pid, cmd in children_of(os.getpid()).items() if pid not in before and running(pid)}
    assert left == {}, left  # the run stopped every process it started


def assert_stopped(state: Path) -> None:
    """Nothing the run started is running: its pid files are gone (or name dead processes)."""
    assert [name for name, pid in pid_files(state).items() if running(pid)] == []


async def test_awaited_run_returns_the_summary_and_writes_the_dataset(tmp_path, site, embedded):
    pages.install(site)
    urls = [site.url("/static"), site.url("/js"), site.url("/status?code=404")]
    summary = await busscrape.run(urls, output=str(tmp_path / "pages.jsonl"), **embedded)
    assert (summary.tasks, summary.archived, summary.dead, summary.dead_by_reason) == (3, 2, 1, {"http_404": 1})
    assert summary.as_dict()["archived"] == 2 and summary.interrupted is False
    rows = duckdb.sql(f"select url, status, title, dead_reason, extracted from "
                      f"read_json_auto('{tmp_path}/pages.jsonl') order by url").fetchall()
    assert rows == [(site.url("/js"), 200, "JS page", None, None),
                    (site.url("/static"), 200, "Static page", None, None),
                    (site.url("/status?code=404"), None, None, "http_404", None)]
    assert_stopped(tmp_path / ".busscrape")


async def test_iterated_run_yields_every_page_once_with_its_folder(tmp_path, site, embedded):
    pages.install(site)
    urls = [site.url("/static"), {"url": site.url("/js"), "labels": {"k": "v"}}, site.url("/status?code=404")]
    seen = []
    async with busscrape.run(urls, **embedded) as run:
        async for page in run:
            seen.append(page)
    assert sorted(p.url for p in seen) == sorted([site.url("/js"), site.url("/static"), site.url("/status?code=404")])
    static = next(p for p in seen if p.url.endswith("/static"))
    assert static.dead is None and static.status == 200 and static.title == "Static page" and static.extracted is None
    assert Path(static.folder, "meta.json").is_file()
    assert b"Plain server-rendered text." in static.read("page.html")
    dead = next(p for p in seen if p.dead)
    assert dead.dead == "http_404" and dead.folder is None
    assert run.summary.archived == 2 and run.summary.dead == 1


async def test_leaving_a_crawl_early_stops_everything_and_a_resumed_crawl_yields_the_rest(tmp_path, site, embedded):
    crawl_site.install(site)
    rules = {"depth": 2, "robots": "ignore", "strip_tracking": True, "output": str(tmp_path / "crawl.jsonl"),
             **embedded}
    first = []
    async with busscrape.crawl(site.url("/"), **rules) as crawl:
        async for page in crawl:
            first.append(page.url)
            break
    assert_stopped(tmp_path / ".busscrape")
    assert crawl.summary is not None and crawl.summary.interrupted
    rest = []
    async with busscrape.crawl(site.url("/"), **rules) as crawl:
        async for page in crawl:
            rest.append(page.url)
    assert crawl.summary.unfinished == 0 and not crawl.summary.interrupted
    assert rest and not set(first) & set(rest)  # the first page is not yielded again
    # The dataset of both has every page of the crawl once (pages the first one archived while
    # it was stopping are there too: -o keeps writing until the run has stopped).
    rows = duckdb.sql(f"select url from read_json_auto('{tmp_path}/crawl.jsonl')").fetchall()
    urls = [url for (url,) in rows]
    assert len(urls) == len(set(urls)) and set(first) | set(rest) <= set(urls)
    assert {u.split("/", 3)[3] for u in urls} == {"", "a/1", "b", "js", "out", "calendar?d=1", "a/2", "calendar?d=2",
                                                 "file.bin", "private/x"}


async def test_bad_arguments_raise_configuration_error_naming_them(tmp_path, embedded):
    with pytest.raises(busscrape.ConfigurationError, match=r"depth='x': not an integer$"):
        busscrape.crawl("http://127.0.0.2/", depth="x")
    with pytest.raises(busscrape.ConfigurationError, match=r"no argument bogus="):
        busscrape.run(["http://127.0.0.2/"], bogus=1)
    with pytest.raises(busscrape.ConfigurationError, match=r"concurrency= '0': must be at least 1"):
        busscrape.run(["http://127.0.0.2/"], concurrency=0)
    with pytest.raises(busscrape.ConfigurationError, match=r"output= x.xlsx: write a .jsonl"):  # before the run
        await busscrape.run(["http://127.0.0.2/"], output="x.xlsx")


async def test_python_extractors_run_in_the_worker_and_their_failures_fail_only_their_task(tmp_path, site, embedded,
                                                                                         monkeypatch):
    pages.install(site)
    folder = tmp_path / "extractors"
    folder.mkdir()
    (folder / "heading.py").write_text("def extract(page):\n    return {'title': page.css('title::text').get(), "
                                       "'status': page.status, 'words': page.text.split()[:2]}\n")
    (folder / "broken.py").write_text("def extract(page):\n    raise KeyError('price')\n")
    monkeypatch.setenv("BUSSCRAPE_EXTRACT__DIR", str(folder))
    specs = [{"url": site.url("/static"), "extractor": "heading"}, {"url": site.url("/js"), "extractor": "broken"}]
    async with busscrape.run(specs, output=str(tmp_path / "pages.parquet"), **embedded) as run:
        seen = {page.url: page async for page in run}
    assert seen[site.url("/static")].extracted == {"title": "Static page", "status": 200, "words": ["Static", "Plain"]}
    broken = seen[site.url("/js")]
    assert broken.dead == "extraction_failed" and "KeyError: 'price'" in broken.error
    rows = duckdb.sql(f"select url, extracted.title, extracted.words, dead_reason from '{tmp_path}/pages.parquet' "
                      "order by url").fetchall()
    assert rows == [(site.url("/js"), None, None, "extraction_failed"),
                    (site.url("/static"), "Static page", ["Static", "Plain"], None)]


async def test_a_python_extractor_that_hangs_or_returns_no_json_fails_its_task_not_the_worker(tmp_path, site, embedded,
                                                                                           monkeypatch):
    pages.install(site)
    folder = tmp_path / "extractors"
    folder.mkdir()
    (folder / "hangs.py").write_text("import time\n\ndef extract(page):\n    time.sleep(3600)\n")
    (folder / "odd.py").write_text("def extract(page):\n    return {'at': object()}\n")
    (folder / "fine.py").write_text("def extract(page):\n    return {'title': page.css('title::text').get()}\n")
    monkeypatch.setenv("BUSSCRAPE_EXTRACT__DIR", str(folder))
    specs = [{"url": site.url("/js"), "extractor": "odd"}, {"url": site.url("/noise"), "extractor": "fine"}]
    async with busscrape.run(specs, **embedded) as run:
        seen = {page.url: page async for page in run}
    odd = seen[site.url("/js")]
    assert odd.dead == "extraction_not_json" and "not JSON" in odd.error, odd
    assert seen[site.url("/noise")].dead is None and seen[site.url("/noise")].extracted == {"title": "Noise"}
    # A hang on its own (a stall replaces the pool's processes: an extraction beside it in them
    # would be retried, and with one attempt it would die of the stall too).
    monkeypatch.setenv("BUSSCRAPE_EXTRACT__TIMEOUT", "3s")
    monkeypatch.setenv("BUSSCRAPE_STREAMS__WORKER_MAX_DELIVER", "1")  # one attempt: the stall is not retried
    async with busscrape.run([{"url": site.url("/static"), "extractor": "hangs"}], **embedded) as run:
        [hung] = [page async for page in run]
    assert hung.dead == "extraction_timeout" and "its process was replaced" in hung.error, hung
    assert not run.summary.failed_daemons  # the worker did not die of it


async def test_a_page_whose_worker_was_killed_mid_render_is_yielded_once(tmp_path, site, embedded, monkeypatch):
    import asyncio
    import signal

    pages.install(site)
    hits = []
    rendering = asyncio.Event()

    @site.route("/first-hangs")
    async def first_hangs(_):
        hits.append(1)
        rendering.set()
        if len(hits) == 1:
            await asyncio.sleep(3600)  # the first render never ends: its worker is killed meanwhile
        from aiohttp import web

        return web.Response(text="<title>second time</title>", content_type="text/html")

    monkeypatch.setenv("BUSSCRAPE_STREAMS__WORKER_ACK_WAIT", "10s")  # the redelivery after the kill
    seen = []
    async with busscrape.run([site.url("/first-hangs"), site.url("/static")], **embedded) as run:
        async def kill_the_worker_once_it_renders():
            await rendering.wait()
            os.kill(pid_files(tmp_path / ".busscrape")["worker-1"], signal.SIGKILL)

        killer = asyncio.create_task(kill_the_worker_once_it_renders())
        async for page in run:
            seen.append(page.url)
        await killer
    assert sorted(seen) == sorted([site.url("/first-hangs"), site.url("/static")])  # each once
    assert len(hits) >= 2 and run.summary.archived == 2 and run.summary.failed_daemons == []


@pytest.mark.s3
async def test_a_page_archived_to_s3_reads_its_artifacts_through_the_archive_settings(tmp_path, site, embedded, s3,
                                                                                     monkeypatch):
    pages.install(site)
    bucket = f"api-{os.getpid()}"
    for key, value in s3.settings(bucket).items():
        monkeypatch.setenv(f"BUSSCRAPE_S3__{key.upper()}", str(value))
    async with busscrape.run([site.url("/static")], **embedded) as run:
        seen = [page async for page in run]
    assert [p.dead for p in seen] == [None]
    page = seen[0]
    assert page.folder.startswith(f"s3://{bucket}/") and page.title == "Static page"
    assert b"Plain server-rendered text." in page.read("page.html")  # stored as page.html.gz, read unpacked
    assert orjson.loads(page.read("meta.json"))["url"] == site.url("/static")
    with pytest.raises(FileNotFoundError, match=r"no nothing.txt"):
        page.read("nothing.txt")
    assert not (tmp_path / ".busscrape" / "archive").exists() or not any((tmp_path / ".busscrape" / "archive").rglob(
        "meta.json"))  # nothing of it on disk: what read() returned came from S3
