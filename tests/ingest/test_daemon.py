"""The ingester against a real nats-server and a real S3-protocol server (or folder) on loopback.

Results are produced the way a worker does: artifacts into ARTIFACTS, an encoded ScrapeResult
on RESULTS with a Nats-Msg-Id.
"""

import asyncio
import gzip
import hashlib
import os
import shutil
import signal
import time
import uuid
from datetime import UTC, datetime, timedelta

import obstore
import orjson
import pytest

from busscrape.archive.layout import plan
from busscrape.archive.storage import Storage
from busscrape.archive.storage.clouds import AzureStorage
from busscrape.archive.storage.local import PARTIAL_DIR, FileStorage
from busscrape.archive.storage.s3 import S3Storage
from busscrape.artifacts.store import ArtifactStore, object_name
from busscrape.bus import names, provision, topology
from busscrape.deadletters import filing
from busscrape.errors import StreamsMissing
from busscrape.ingest.archiver import Archiver
from busscrape.ingest.daemon import Ingester
from busscrape.model.messages import DeadLetter, ScrapeResult, decode, encode
from busscrape.status.records import StatusBoard
from tests.conftest import make_settings
from tests.support.bus import dead_letters, wait_until
from tests.support.procs import env_for, kill9, spawn
from tests.support.relay import Relay, result_ack

HTML = b"<!doctype html><title>t</title>" + b"".join(b"<p>paragraph %d</p>\n" % i for i in range(3000))
PNG = b"\x89PNG\r\n\x1a\n" + os.urandom(40_000)
HAR = orjson.dumps({"log": {"version": "1.2", "entries": [{"request": {"url": f"/r{i}"}} for i in range(500)]}})
SCRAPED = datetime(2025, 6, 30, 23, 59, 58, tzinfo=UTC)


async def produce(js, *, url: str = "http://127.0.0.2:8000/page", files: dict[str, bytes] | None = None,
                  task_id: str | None = None, attempt: int = 1, scraped_at: datetime = SCRAPED,
                  corrupt: str | None = None) -> ScrapeResult:
    """Put a result's artifacts into ARTIFACTS and publish the result, as a worker does."""
    task_id = task_id or uuid.uuid4().hex
    files = files if files is not None else {"page.html": HTML, "screenshot.png": PNG, "page.har": HAR}
    kinds = {"page.html": ("html", "text/html; charset=utf-8"), "screenshot.png": ("screenshot", "image/png"),
             "page.har": ("har", "application/json"), "page.txt": ("text", "text/plain; charset=utf-8")}
    store = ArtifactStore(js)
    refs = []
    for name, data in files.items():
        kind, ctype = kinds.get(name, ("extra_screenshot", "image/png"))
        ref = await store.put(object_name(task_id, 1, attempt, name), data, ctype, kind=kind, file=name)
        refs.append(ref.model_copy(update={"sha256": "0" * 64}) if name == corrupt else ref)
    result = ScrapeResult(task_id=task_id, task_seq=1, url=url, original_url=url, final_url=url + "?final", status=200,
                          artifacts=tuple(refs), worker="worker-test", attempt=attempt, scraped_at=scraped_at,
                          labels={"job": "tests"}, timings={"total": 12.5}, title="t")
    await js.publish(names.result_subject(task_id), encode(result),
                     headers={names.MSG_ID: f"result-{task_id}-1-{attempt}"})
    return result


def tuned(settings, **ingester):
    """Test settings: short retry delays."""
    return settings.with_overrides(ingester={"retry_base_delay": "0.2s", "retry_max_delay": "1s", **ingester})


async def ingest(bus, storage: Storage, settings, **ingester) -> Ingester:
    """Run an ingester to its bound (max_results / exit_when_idle) and return it."""
    svc = Ingester(bus, storage, tuned(settings, **ingester))
    async with svc:
        await asyncio.wait_for(svc.run(), 120)
    return svc


async def snapshot(storage: Storage) -> dict[str, bytes]:
    return {key: await storage.get(key) for key in await storage.keys()}


async def lag(js, stream=names.RESULTS_STREAM, durable=names.INGESTERS_CONSUMER) -> int:
    info = await js.consumer_info(stream, durable)
    return info.num_pending + info.num_ack_pending


def folder_of(result: ScrapeResult, prefix: str = "") -> str:
    return plan(result, prefix=prefix).folder


async def assert_archived(storage: Storage, result: ScrapeResult, files: dict[str, bytes], prefix: str = "") -> dict:
    """Every expected file listed in meta.json and stored at its key (nothing else in the folder),
    its bytes as meta.json says, and the originals inside."""
    folder = folder_of(result, prefix)
    meta = orjson.loads(await storage.get(f"{folder}/meta.json"))
    assert meta["task_id"] == result.task_id and meta["final_url"] == result.final_url
    assert meta["attempt"] == result.attempt and meta["worker"] == result.worker and meta["labels"] == result.labels
    # every expected file is listed, and the folder holds nothing else
    assert sorted(obj["name"].removesuffix(".gz") for obj in meta["objects"]) == sorted(files)
    assert await storage.keys(f"{folder}/") == sorted([f"{folder}/meta.json", *(o["key"] for o in meta["objects"])])
    for obj in meta["objects"]:
        stored = await storage.get(obj["key"])
        assert obj["key"] == f"{folder}/{obj['name']}"
        assert len(stored) == obj["size"] and hashlib.sha256(stored).hexdigest() == obj["sha256"]
        original = gzip.decompress(stored) if obj["content_encoding"] == "gzip" else stored
        assert original == files[obj["name"].removesuffix(".gz")]
        assert hashlib.sha256(original).hexdigest() == obj["original_sha256"]
    return meta


@pytest.fixture
async def s3_storage(s3, settings):
    async with S3Storage(settings.with_overrides(s3=s3.settings(f"t-{uuid.uuid4().hex[:12]}")).s3) as store:
        yield store


@pytest.fixture
async def folder_storage(tmp_path):
    async with FileStorage(tmp_path / "archive") as store:
        yield store


@pytest.mark.s3
async def test_a_result_is_archived_at_the_documented_keys_and_its_artifacts_released(applied, s3_storage, settings):
    files = {"page.html": HTML, "screenshot.png": PNG, "page.har": HAR, "page.txt": b"plain text",
             "shot-footer.png": PNG[:5000]}
    result = await produce(applied.js, url="http://Shop.Example:8080/item?id=1", files=files)
    ingester = await ingest(applied, s3_storage, settings, max_results=1)

    folder = f"dt=2025-06-30/host=shop.example/{result.task_id}"
    assert await s3_storage.keys() == sorted(f"{folder}/{name}" for name in (
        "page.html.gz", "screenshot.png", "page.har.gz", "page.txt.gz", "shot-footer.png", "meta.json"))
    meta = await assert_archived(s3_storage, result, files)
    assert meta["scraped_at"].startswith("2025-06-30T23:59:58")
    html = await obstore.get_async(s3_storage.store, f"{folder}/page.html.gz")
    assert html.attributes == {"Content-Type": "text/html; charset=utf-8", "Content-Encoding": "gzip"}
    png = await obstore.get_async(s3_storage.store, f"{folder}/screenshot.png")
    assert png.attributes == {"Content-Type": "image/png"}
    assert ingester.counters["archived"] == 1
    store = ArtifactStore(applied.js)
    assert not any([await store.exists(ref) for ref in result.artifacts])  # released after the ack
    assert await lag(applied.js) == 0


@pytest.mark.s3
@pytest.mark.parametrize("crash", ["before_meta", "before_ack"])
async def test_a_redelivered_result_leaves_the_same_keys_and_bytes(bus, s3_storage, tmp_path, crash):
    settings = make_settings(tmp_path, bus.settings.nats.url,
                             streams={"ingester_ack_wait": "2s", "folder_lease_ttl": "3s"})
    await provision.apply(bus.js, topology.load(settings))
    result = await produce(bus.js)
    # A first ingester takes the result, writes everything, and dies before its ack.
    sub = await bus.js.pull_subscribe_bind(names.INGESTERS_CONSUMER, names.RESULTS_STREAM)
    (msg,) = await sub.fetch(1, timeout=5)
    await Archiver(s3_storage, ArtifactStore(bus.js)).archive(decode(ScrapeResult, msg.data))
    first = await snapshot(s3_storage)
    assert len(first) == 4
    if crash == "before_meta":
        await s3_storage.delete(f"{folder_of(result)}/meta.json")

    ingester = await ingest(bus, s3_storage, settings, max_results=1)  # the redelivery, after ack_wait
    assert await snapshot(s3_storage) == first  # same keys, byte for byte, meta.json included
    counter = "archived" if crash == "before_meta" else "already_archived"
    assert ingester.counters[counter] == 1
    assert await lag(bus.js) == 0
    assert not any([await ArtifactStore(bus.js).exists(ref) for ref in result.artifacts])


@pytest.fixture(params=["s3", "azure"])
async def outage_target(request, settings, monkeypatch):
    """A cloud store and the server behind it, which the test can take down: S3 (moto) and Azure (Azurite)."""
    if request.param == "s3":
        server = request.getfixturevalue("s3")
        store = S3Storage(settings.with_overrides(s3=server.settings(f"t-{uuid.uuid4().hex[:12]}")).s3)
    else:
        server = request.getfixturevalue("azurite")
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        container = f"t{uuid.uuid4().hex[:12]}"
        server.create_container(container)
        store = AzureStorage(container, "archive", part_size=settings.s3.part_size)
    async with store:
        yield server, store


@pytest.mark.s3
@pytest.mark.slow
async def test_a_storage_outage_delays_results_and_loses_none(applied, outage_target, settings):
    server, storage = outage_target
    count = 6
    ingester = Ingester(applied, storage, tuned(settings, concurrency=3))
    async with ingester:
        running = asyncio.create_task(ingester.run())
        # The proxy refuses connections, which is what a stopped or restarting S3 server looks like to
        # the client; the server keeps its objects behind it (our stand-in for "same data folder").
        server.outage()
        try:
            results = [await produce(applied.js, files={"page.html": HTML + bytes([i]), "screenshot.png": PNG})
                       for i in range(count)]
            await wait_until(lambda: asyncio.sleep(0, ingester.counters["retried"] >= 2 * count), timeout=60)
            assert ingester.counters["archived"] == 0
            assert await lag(applied.js) == count  # nothing acked: every result waits in RESULTS
            assert (await applied.js.stream_info(names.RESULTS_STREAM)).state.messages == count
            assert all([await ArtifactStore(applied.js).exists(ref) for r in results for ref in r.artifacts])
        finally:
            server.restore()
        await wait_until(lambda: asyncio.sleep(0, ingester.counters["archived"] == count), timeout=60)
        ingester.stop()
        counters = await asyncio.wait_for(running, 30)
    assert counters["archived"] == count and counters["dead_lettered"] == 0
    assert len(await storage.keys()) == 3 * count
    for i, result in enumerate(results):
        await assert_archived(storage, result, {"page.html": HTML + bytes([i]), "screenshot.png": PNG})
    assert await lag(applied.js) == 0


async def test_a_result_is_kept_until_its_archived_status_is_recorded(applied, folder_storage, settings):
    """`busscrape run` waits for the `archived` record: without the STATUS bucket the result is
    archived but not acked; once the bucket is back, the redelivery records it and acks."""
    await applied.js.delete_key_value(names.STATUS_BUCKET)
    ingester = Ingester(applied, folder_storage, tuned(settings))
    async with ingester:
        running = asyncio.create_task(ingester.run())
        result = await produce(applied.js)
        await wait_until(lambda: asyncio.sleep(0, ingester.counters["retried"] >= 2), timeout=60)
        assert await folder_storage.get(f"{folder_of(result)}/meta.json") is not None  # archived …
        assert await lag(applied.js) == 1  # … and still waiting in RESULTS
        await provision.apply(applied.js, topology.load(settings))  # STATUS is back
        await wait_until(lambda: _drained(applied.js), timeout=60)
        ingester.stop()
        await asyncio.wait_for(running, 30)
    history = await StatusBoard(applied.js).history(result.task_id)
    assert [s.state for s in history] == ["archived"] and history[0].archive.endswith(folder_of(result))
    assert not any([await ArtifactStore(applied.js).exists(ref) for ref in result.artifacts])


async def _drained(js) -> bool:
    return await lag(js) == 0


async def test_unusable_results_are_dead_lettered_and_archived_and_the_ingester_carries_on(applied, folder_storage,
                                                                                           settings):
    await applied.js.publish(names.result_subject("junk"), b"{not json", headers={names.MSG_ID: "junk"})
    missing = await produce(applied.js, files={"page.html": HTML, "screenshot.png": PNG})
    await ArtifactStore(applied.js).delete(missing.artifacts[1].object)  # expired before the ingester came
    corrupt = await produce(applied.js, files={"page.html": HTML, "screenshot.png": PNG}, corrupt="screenshot.png")
    good = await produce(applied.js)
    ingester = Ingester(applied, folder_storage, tuned(settings))
    async with ingester:
        running = asyncio.create_task(ingester.run())
        await wait_until(lambda: has_keys(folder_storage, "deadletter/", 3), timeout=30)
        ingester.stop()
        counters = await asyncio.wait_for(running, 30)

    assert (counters["malformed"], counters["dead_lettered"], counters["archived"]) == (1, 2, 1)
    assert counters["archivist_archived"] == 3
    letters = {letter.reason: letter for letter in await dead_letters(applied.js)}
    assert set(letters) == {"not_json", "artifact_missing", "artifact_checksum_mismatch"}
    assert letters["not_json"].stage == "ingester" and letters["not_json"].payload == "{not json"
    assert letters["artifact_missing"].result == missing and letters["artifact_missing"].task_id == missing.task_id
    assert letters["artifact_checksum_mismatch"].result == corrupt
    # Nothing half-written stays behind for the dead ones; the good one is complete.
    assert await folder_storage.keys(folder_of(missing)) == []
    assert await folder_storage.keys(folder_of(corrupt)) == []
    await assert_archived(folder_storage, good, {"page.html": HTML, "screenshot.png": PNG, "page.har": HAR})
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    seq = letters["not_json"].source.seq
    assert set(await folder_storage.keys("deadletter/")) == {
        f"deadletter/dt={today}/{missing.task_id}.json", f"deadletter/dt={today}/{corrupt.task_id}.json",
        f"deadletter/dt={today}/poison-RESULTS-{seq}.json"}
    archived = decode(DeadLetter, await folder_storage.get(f"deadletter/dt={today}/{corrupt.task_id}.json"))
    assert archived == letters["artifact_checksum_mismatch"]
    assert await lag(applied.js) == 0


async def has_keys(storage: Storage, prefix: str, count: int) -> bool:
    return len(await storage.keys(prefix)) >= count


async def test_dead_letters_are_archived_by_day_and_the_latest_word_stays(applied, folder_storage, settings):
    task_id = uuid.uuid4().hex
    later = datetime(2025, 2, 3, 18, 0, tzinfo=UTC)
    letter = DeadLetter(task_id=task_id, stage="worker", reason="http_404", error="404 Not Found",
                        url="http://127.0.0.2/x", dead_at=later)
    await filing.file(applied.js, letter, msg_id="l1")
    await applied.js.publish(names.deadletter_subject("worker", "garbage"), b"\xff\xfe not a letter")
    ingester = Ingester(applied, folder_storage, tuned(settings))
    async with ingester:
        running = asyncio.create_task(ingester.run())
        await wait_until(lambda: has_keys(folder_storage, "deadletter/", 2), timeout=30)
        # An earlier letter for the same task arriving late does not replace the later one.
        await filing.file(applied.js, letter.model_copy(update={"dead_at": later - timedelta(hours=1),
                                                                     "reason": "timeout"}), msg_id="l2")
        await wait_until(lambda: asyncio.sleep(0, ingester.archivist.counters["superseded"] == 1), timeout=30)
        ingester.stop()
        counters = await asyncio.wait_for(running, 30)
    key = f"deadletter/dt=2025-02-03/{task_id}.json"
    assert decode(DeadLetter, await folder_storage.get(key)) == letter
    (poison_key,) = [k for k in await folder_storage.keys("deadletter/") if k != key]
    poison = decode(DeadLetter, await folder_storage.get(poison_key))
    assert poison_key.endswith(f"/poison-DEADLETTER-{poison.source.seq}.json") and poison.reason == "not_json"
    assert counters["archivist_unreadable"] == 1 and counters["archivist_superseded"] == 1
    assert await lag(applied.js, names.DEADLETTER_STREAM, names.ARCHIVIST_CONSUMER) == 0


async def test_a_newer_result_of_the_same_task_replaces_the_folder_cleanly(applied, folder_storage, settings):
    first = await produce(applied.js, files={"page.html": HTML, "screenshot.png": PNG, "shot-x.png": PNG})
    await ingest(applied, folder_storage, settings, max_results=1)
    retry = await produce(applied.js, task_id=first.task_id, attempt=2, files={"page.html": b"<p>second</p>"})
    ingester = await ingest(applied, folder_storage, settings, max_results=1)
    assert ingester.counters["archived"] == 1
    folder = folder_of(first)
    assert await folder_storage.keys(folder) == [f"{folder}/meta.json", f"{folder}/page.html.gz"]
    meta = await assert_archived(folder_storage, retry, {"page.html": b"<p>second</p>"})
    assert meta["attempt"] == 2


class CountingStorage(FileStorage):
    """A real folder that also records how many uploads ran at once."""

    active = peak = 0

    async def _write(self, key, chunks, durable):
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(0.02)
            await super()._write(key, chunks, durable)
        finally:
            self.active -= 1


async def test_uploads_run_concurrently_within_the_bound(applied, tmp_path, settings):
    results = [await produce(applied.js) for _ in range(8)]
    s = tuned(settings, concurrency=6, upload_concurrency=3, max_results=8)
    async with CountingStorage(tmp_path / "a", max_uploads=s.ingester.upload_concurrency) as storage:
        await ingest(applied, storage, s)
        assert storage.peak == 3
        assert len(await storage.keys()) == 4 * len(results)


async def test_the_filesystem_archive_has_the_same_layout_as_s3(applied, folder_storage, settings):
    result = await produce(applied.js, files={"page.html": HTML, "screenshot.png": PNG, "page.har": HAR})
    await ingest(applied, folder_storage, settings.with_overrides(archive={"prefix": "crawl"}), max_results=1)
    folder = f"crawl/dt=2025-06-30/host=127.0.0.2/{result.task_id}"
    assert await folder_storage.keys() == [f"{folder}/{n}" for n in
                                           ("meta.json", "page.har.gz", "page.html.gz", "screenshot.png")]
    await assert_archived(folder_storage, result, {"page.html": HTML, "screenshot.png": PNG, "page.har": HAR},
                          prefix="crawl")
    assert (folder_storage.root / folder / "page.html.gz").is_file()


async def test_without_the_dead_letter_consumer_the_ingester_refuses_to_start(applied, folder_storage):
    await applied.js.delete_consumer(names.DEADLETTER_STREAM, names.ARCHIVIST_CONSUMER)
    with pytest.raises(StreamsMissing, match="streams apply"):
        async with Ingester(applied, folder_storage):
            pass


async def test_without_the_results_consumer_the_ingester_command_exits_2_with_the_fix(applied, settings, tmp_path):
    await applied.js.delete_consumer(names.RESULTS_STREAM, names.INGESTERS_CONSUMER)
    proc = spawn(["ingester", "--archive", str(tmp_path / "a")], env_for(settings), tmp_path / "ingester.log")
    try:
        assert await asyncio.to_thread(proc.wait, 60) == 2
    finally:
        kill9(proc)
    log = " ".join((tmp_path / "ingester.log").read_text().split())  # the message may be wrapped
    assert "RESULTS/ingesters does not exist" in log and "busscrape streams apply" in log


async def test_a_bounded_run_exits_1_when_a_result_was_dead_lettered(applied, settings, tmp_path):
    good = await produce(applied.js)
    missing = await produce(applied.js, files={"page.html": HTML})
    await ArtifactStore(applied.js).delete(missing.artifacts[0].object)
    args = ["ingester", "--archive", str(tmp_path / "a"), "--max-results", "2"]
    proc = spawn(args, env_for(settings), tmp_path / "ingester.log")
    try:
        assert await asyncio.to_thread(proc.wait, 120) == 1, (tmp_path / "ingester.log").read_text()[-2000:]
    finally:
        kill9(proc)
    assert (tmp_path / "a" / folder_of(good) / "meta.json").exists()
    assert [d.reason for d in await dead_letters(applied.js)] == ["artifact_missing"]


async def test_a_result_releases_its_artifacts_before_its_ack(applied, settings, tmp_path, nats_server):
    """A real SIGKILL of an ingester process just before its ack reaches the server: the archive
    is complete and the artifacts are already gone, so nothing is orphaned; the redelivery only
    records and acks."""
    short = settings.with_overrides(streams={"ingester_ack_wait": "2s"})
    await provision.apply(applied.js, topology.load(short))
    result = await produce(applied.js)
    root = tmp_path / "archive"
    async with Relay(nats_server.port) as relay:
        relay.hold = result_ack
        env = env_for(short, BUSSCRAPE_NATS__URL=relay.url)
        victim = spawn(["ingester", "--archive", str(root)], env, tmp_path / "victim.log")
        try:
            await asyncio.wait_for(relay.held.wait(), 60)
        finally:
            kill9(victim)
    assert await lag(applied.js) == 1  # never acked
    assert (await applied.js.stream_info(names.ARTIFACTS_STREAM)).state.messages == 0  # released already
    async with FileStorage(root) as storage:
        again = await ingest(applied, storage, short, exit_when_idle=4)
        await assert_archived(storage, result, {"page.html": HTML, "screenshot.png": PNG, "page.har": HAR})
    assert again.counters["already_archived"] == 1 and await lag(applied.js) == 0
    assert await dead_letters(applied.js) == []


@pytest.mark.slow
async def test_a_kill_mid_write_leaves_no_partial_file_visible(bus, tmp_path):
    settings = make_settings(tmp_path, bus.settings.nats.url,
                             streams={"ingester_ack_wait": "2s", "folder_lease_ttl": "3s"})
    await provision.apply(bus.js, topology.load(settings))
    big = os.urandom(48 * 1024 * 1024)  # incompressible: gzip takes a while, long enough to kill it mid-way
    files = {"screenshot.png": PNG, "page.html": big}
    result = await produce(bus.js, files=files)
    root = tmp_path / "archive"
    args = ["ingester", "--archive", str(root), "--concurrency", "1", "--max-results", "1"]
    env = env_for(settings, BUSSCRAPE_INGESTER__UPLOAD_CONCURRENCY="1")
    proc = spawn(args, env, tmp_path / "ingester-1.log")
    try:
        deadline = time.monotonic() + 60
        while not [p for p in (root / PARTIAL_DIR).glob("*page.html.gz") if p.stat().st_size > 1_000_000]:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "ingester-1.log").read_text()
            await asyncio.sleep(0.01)
        kill9(proc)
    finally:
        kill9(proc)

    async with FileStorage(root) as storage:
        visible = await snapshot(storage)
        assert f"{folder_of(result)}/page.html.gz" not in visible and f"{folder_of(result)}/meta.json" not in visible
        for key, data in visible.items():  # whatever is visible is whole (here: the screenshot, if it got there)
            assert data == files[key.rsplit("/", 1)[1]]
        assert [p.name for p in (root / PARTIAL_DIR).iterdir()]  # the half-written file, out of sight

    # The result was never acked: after ack_wait a new ingester archives it completely.
    again = spawn(args, env, tmp_path / "ingester-2.log")
    assert await asyncio.to_thread(again.wait, 120) == 0, (tmp_path / "ingester-2.log").read_text()
    async with FileStorage(root) as storage:
        await assert_archived(storage, result, files)
    assert await lag(bus.js) == 0


@pytest.mark.slow
async def test_the_command_drains_on_sigterm_and_logs_its_counters(applied, settings, tmp_path):
    result = await produce(applied.js)
    log = tmp_path / "ingester.log"
    proc = spawn(["ingester", "--archive", str(tmp_path / "a")], env_for(settings), log)
    try:
        meta = tmp_path / "a" / folder_of(result) / "meta.json"
        await wait_until(lambda: asyncio.sleep(0, meta.exists()), timeout=60)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0, log.read_text()
    finally:
        kill9(proc)
    summary = [orjson.loads(line) for line in log.read_text().splitlines() if '"ingester.summary"' in line]
    assert summary and summary[0]["archived"] == 1
    assert await lag(applied.js) == 0


async def test_a_results_folder_is_synced_once_after_its_meta_json(applied, folder_storage, settings, monkeypatch):
    """Every file's bytes are fsynced before its rename; the folder (which makes the names durable)
    once, by meta.json, written last: a folder without it is incomplete whatever else survived."""
    from busscrape.archive.storage import local as storage_module

    synced: list[tuple[str, list[str]]] = []
    real = storage_module._fsync_dir

    def spy(folder):
        synced.append((folder.name, sorted(p.name for p in folder.iterdir())))
        real(folder)

    monkeypatch.setattr(storage_module, "_fsync_dir", spy)
    files = {"page.html": HTML, "screenshot.png": PNG, "page.har": HAR, "page.txt": b"plain text"}
    result = await produce(applied.js, url="http://shop.example/a", files=files)
    await ingest(applied, folder_storage, settings, max_results=1)
    in_folder = [synced_names for name, synced_names in synced if name == result.task_id]
    assert in_folder == [["meta.json", "page.har.gz", "page.html.gz", "page.txt.gz", "screenshot.png"]]


# -- what the archive refuses ------------------------------------------------------------------

LONG_HOST = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 56]) + ".test"  # 253 characters: the longest name


async def test_the_longest_host_dispatch_accepts_is_archived_under_a_shortened_partition(applied, folder_storage,
                                                                                         settings):
    from busscrape.dispatch.urls import normalise

    url = normalise(f"http://{LONG_HOST}:8000/page")  # accepted by the dispatcher
    assert len(LONG_HOST) == 253
    result = await produce(applied.js, url=url)
    ingester = Ingester(applied, folder_storage, tuned(settings))
    async with ingester:
        running = asyncio.create_task(ingester.run())
        await wait_until(lambda: _drained(applied.js), timeout=30)
        ingester.stop()
        counters = await asyncio.wait_for(running, 30)
    assert counters["archived"] == 1 and counters["retried"] == 0
    folder = folder_of(result)
    host_part = next(part for part in folder.split("/") if part.startswith("host="))
    assert len(host_part.encode()) <= 255 and host_part.startswith("host=" + LONG_HOST[:95])
    meta = await assert_archived(folder_storage, result, {"page.html": HTML, "screenshot.png": PNG, "page.har": HAR})
    assert meta["url"] == url  # the URL itself is whole
    [status] = await StatusBoard(applied.js).history(result.task_id)
    assert status.state == "archived"


async def test_an_object_the_storage_refuses_is_dead_lettered_and_recorded_dead(applied, folder_storage, settings):
    """EFBIG (the file is over what this file system takes, here RLIMIT_FSIZE): the same write
    fails again, so the result is dead-lettered with the reason instead of retried for ever."""
    import resource

    big = await produce(applied.js, files={"page.html": HTML, "screenshot.png": os.urandom(600_000)})
    small = await produce(applied.js, files={"page.html": b"<p>small</p>"})
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (500_000, limits[1]))
    try:
        ingester = Ingester(applied, folder_storage, tuned(settings, concurrency=1))
        async with ingester:
            running = asyncio.create_task(ingester.run())
            await wait_until(lambda: _drained(applied.js), timeout=30)
            ingester.stop()
            counters = await asyncio.wait_for(running, 30)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    assert (counters["archived"], counters["dead_lettered"]) == (1, 1)
    [letter] = await dead_letters(applied.js)
    assert letter.reason == "storage_refused" and letter.result == big and "File too large" in letter.error
    [status] = await StatusBoard(applied.js).history(big.task_id)
    assert status.state == "dead" and status.reason == "storage_refused"
    assert await folder_storage.keys(folder_of(big)) == []  # nothing half-written left
    await assert_archived(folder_storage, small, {"page.html": b"<p>small</p>"})


@pytest.mark.slow
async def test_a_result_the_archive_cannot_take_before_results_drops_it_is_dead_lettered(applied, tmp_path, settings):
    """RESULTS drops a message at its max_age: a result still not archived by then would vanish
    unrecorded. In the last tenth of that age the ingester files it as a dead letter instead."""
    short = settings.with_overrides(streams={"results_max_age": "20s", "duplicate_window": "10s"})
    await provision.apply(applied.js, topology.load(short))
    result = await produce(applied.js)
    async with FileStorage(tmp_path / "archive") as storage:
        shutil.rmtree(storage.root)  # the disk went away: every write now fails (ENOTDIR), for a while
        storage.root.write_text("a file where the archive's folder should be")
        ingester = Ingester(applied, storage, tuned(short))
        async with ingester:
            running = asyncio.create_task(ingester.run())
            await wait_until(lambda: has_letters(applied.js, 1), timeout=40)
            ingester.stop()
            counters = await asyncio.wait_for(running, 30)
    assert counters["dead_lettered"] == 1 and counters["retried"] >= 5
    [letter] = await dead_letters(applied.js)
    assert letter.reason == "archive_unavailable" and letter.result == result and "max_age" in letter.error
    [status] = await StatusBoard(applied.js).history(result.task_id)
    assert status.state == "dead" and status.reason == "archive_unavailable"


async def has_letters(js, n: int) -> bool:
    return len(await dead_letters(js)) >= n
