"""One folder, two results: a complete folder stays complete, and two ingesters never interleave."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import os
from datetime import timedelta

import orjson

from busscrape.archive.layout import plan
from busscrape.archive.storage import Storage
from busscrape.artifacts.store import ArtifactStore
from busscrape.bus import names
from tests.ingest.test_daemon import HTML, PNG, SCRAPED, folder_storage, ingest, produce  # noqa: F401 - fixture
from tests.support.bus import dead_letters, wait_until
from tests.support.procs import env_for, kill9, spawn


async def folder_files(storage: Storage, folder: str) -> dict[str, bytes]:
    return {key.rsplit("/", 1)[-1]: await storage.get(key) for key in await storage.keys(folder + "/")}


def consistent(files: dict[str, bytes]) -> dict:
    """meta.json lists exactly the files beside it, each with its true digest."""
    meta = orjson.loads(files["meta.json"])
    listed = {o["key"].rsplit("/", 1)[-1]: o for o in meta["objects"]}
    assert set(files) - {"meta.json"} == set(listed), (sorted(files), sorted(listed))
    for name, obj in listed.items():
        assert hashlib.sha256(files[name]).hexdigest() == obj["sha256"], name
    return meta


async def test_a_later_result_that_fails_leaves_the_complete_folder_complete(applied, folder_storage, settings):  # noqa: F811
    first = await produce(applied.js, files={"page.html": HTML, "screenshot.png": PNG},
                          scraped_at=SCRAPED - timedelta(seconds=1))
    await ingest(applied, folder_storage, settings, max_results=1)
    folder = plan(first).folder
    before = await folder_files(folder_storage, folder)
    # A recrawl of the same task later that day, whose screenshot is gone from ARTIFACTS.
    later = await produce(applied.js, task_id=first.task_id, attempt=2,
                          files={"page.html": b"<p>the recrawl</p>", "screenshot.png": b"\x89PNG recrawl"})
    gone = next(ref for ref in later.artifacts if ref.name == "screenshot.png")
    await ArtifactStore(applied.js).release(gone)
    ingester = await ingest(applied, folder_storage, settings, max_results=1)
    assert ingester.counters["dead_lettered"] == 1
    [letter] = await dead_letters(applied.js)
    assert letter.reason == "artifact_missing" and letter.result.attempt == 2
    after = await folder_files(folder_storage, folder)
    assert after == before  # byte for byte: the first scrape, complete
    assert consistent(after)["attempt"] == 1


async def test_an_older_result_arriving_late_does_not_replace_a_newer_one(applied, folder_storage, settings):  # noqa: F811
    newer = await produce(applied.js, files={"page.html": b"<p>new</p>"})
    await ingest(applied, folder_storage, settings, max_results=1)
    await produce(applied.js, task_id=newer.task_id, attempt=2, scraped_at=SCRAPED - timedelta(seconds=5),
                  files={"page.html": b"<p>old</p>"})
    ingester = await ingest(applied, folder_storage, settings, max_results=1)
    assert ingester.counters["superseded"] == 1
    files = await folder_files(folder_storage, plan(newer).folder)
    assert gzip.decompress(files["page.html.gz"]) == b"<p>new</p>" and consistent(files)["attempt"] == 1


async def test_two_ingester_processes_never_leave_an_inconsistent_folder(applied, settings, tmp_path):
    archive = tmp_path / "archive"
    s = settings.with_overrides(archive={"dir": archive})
    env = env_for(s, BUSSCRAPE_INGESTER__CONCURRENCY="3", BUSSCRAPE_ARCHIVE__DIR=str(archive))
    logs = [tmp_path / f"ingester-{i}.log" for i in range(2)]
    procs = [spawn(["ingester", "--exit-when-idle", "4s"], {**env, "BUSSCRAPE_INGESTER__NAME": f"ing-{i}"}, log)
             for i, log in enumerate(logs)]
    try:
        async def both_started() -> bool:
            return all(log.exists() and "ingester.started" in log.read_text() for log in logs)

        await wait_until(both_started, timeout=60)
        # Twelve scrapes of one task on one day, all at once. The first one's page is large and
        # incompressible: written without a lease, it would still be writing while the others
        # finish, and its meta.json would come last and name another scrape's screenshot.
        task_id = "f" * 32
        sizes = [40 * 2**20] + [64 * 1024] * 11
        versions = [await produce(applied.js, task_id=task_id, attempt=i + 1,
                                  scraped_at=SCRAPED - timedelta(seconds=20 - i),
                                  files={"page.html": os.urandom(size) + b"version %d" % i,
                                         "screenshot.png": PNG + bytes([i])})
                    for i, size in enumerate(sizes)]

        async def drained() -> bool:
            info = await applied.js.consumer_info(names.RESULTS_STREAM, names.INGESTERS_CONSUMER)
            return info.num_pending == 0 and info.num_ack_pending == 0

        await wait_until(drained, timeout=120)
        for proc in procs:
            await asyncio.to_thread(proc.wait, 30)
    finally:
        for proc in procs:
            kill9(proc)
    # Both processes wanted the folder (archived into it, or waited for the other).
    assert all("result.archived" in log.read_text() or "folder.busy" in log.read_text() for log in logs)
    assert await dead_letters(applied.js) == []
    from busscrape.archive.storage.local import FileStorage

    async with FileStorage(archive) as storage:
        files = await folder_files(storage, plan(versions[0]).folder)
    meta = consistent(files)
    assert meta["attempt"] == 12  # the latest scrape of the day
    assert gzip.decompress(files["page.html.gz"]).endswith(b"version 11")
