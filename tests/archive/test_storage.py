"""Both storages behind one interface: a real folder, and a real S3-protocol server on loopback."""

import asyncio
import hashlib
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import obstore
import pytest

from busscrape.archive.storage import Storage, open_storage
from busscrape.archive.storage.local import PARTIAL_DIR, WRITE_BUFFER, FileStorage
from busscrape.archive.storage.s3 import S3Storage, endpoint_of
from busscrape.errors import ArtifactUnusable, AuthenticationFailed, ConfigurationError, StorageUnavailable
from busscrape.settings import Settings
from tests.support.bus import wait_until
from tests.support.net import refused_port
from tests.support.s3 import S3Server, bucket_exists

MiB = 1024 * 1024


def s3_settings(s3: S3Server, **extra) -> Settings:
    return Settings(s3={**s3.settings(f"t-{uuid.uuid4().hex[:12]}"), **extra})


@pytest.fixture(params=["file", "s3"])
async def storage(request, tmp_path):
    if request.param == "file":
        store: Storage = FileStorage(tmp_path / "archive", max_uploads=4)
    else:
        store = S3Storage(s3_settings(request.getfixturevalue("s3")).s3, max_uploads=4)
    async with store:
        yield store


async def chunks(data: bytes, size: int = 256 * 1024, fail: BaseException | None = None):
    for i in range(0, len(data), size):
        yield data[i:i + size]
        await asyncio.sleep(0)
    if fail is not None:
        raise fail


async def test_put_get_list_delete(storage):
    data = os.urandom(MiB + 3)
    await storage.put("dt=2025-01-01/host=a/t1/page.html.gz", chunks(data), content_type="text/html",
                      content_encoding="gzip")
    await storage.put_bytes("dt=2025-01-01/host=a/t1/meta.json", b"{}\n", content_type="application/json")
    await storage.put_bytes("dt=2025-01-02/host=b/t2/meta.json", b"{}\n", content_type="application/json")
    assert await storage.get("dt=2025-01-01/host=a/t1/page.html.gz") == data
    assert await storage.get("dt=2025-01-01/host=a/t1/nothing") is None
    assert await storage.keys("dt=2025-01-01/") == ["dt=2025-01-01/host=a/t1/meta.json",
                                                   "dt=2025-01-01/host=a/t1/page.html.gz"]
    assert len(await storage.keys()) == 3
    await storage.put_bytes("dt=2025-01-01/host=a/t1/meta.json", b"[1]\n", content_type="application/json")
    assert await storage.get("dt=2025-01-01/host=a/t1/meta.json") == b"[1]\n"  # replaced
    await storage.delete("dt=2025-01-01/host=a/t1/meta.json")
    await storage.delete("dt=2025-01-01/host=a/t1/meta.json")  # idempotent
    assert await storage.keys("dt=2025-01-01/") == ["dt=2025-01-01/host=a/t1/page.html.gz"]


@pytest.mark.parametrize("size", [300 * 1024, 11 * MiB])  # one PUT, and a multipart upload
async def test_a_failing_source_leaves_nothing_under_the_key(storage, size):
    if isinstance(storage, S3Storage):
        storage.part_size = 5 * MiB
    broken = ArtifactUnusable("checksum", reason="artifact_checksum_mismatch")
    with pytest.raises(ArtifactUnusable):  # passes through as it is: not a storage problem
        await storage.put("k/page.html", chunks(os.urandom(size), fail=broken), content_type="text/html")
    assert await storage.get("k/page.html") is None
    assert await storage.keys() == []


@pytest.mark.s3
async def test_s3_large_objects_go_up_in_parts_with_their_headers(s3):
    cfg = s3_settings(s3, part_size="5MiB").s3
    data = os.urandom(12 * MiB)
    async with S3Storage(cfg) as store:
        await store.put("big/page.html.gz", chunks(data), content_type="text/html", content_encoding="gzip")
        stat = await obstore.get_async(store.store, "big/page.html.gz")
        assert (stat.meta["e_tag"] or "").strip('"').endswith("-3")  # 5 + 5 + 2 MiB: a multipart upload
        assert stat.attributes == {"Content-Type": "text/html", "Content-Encoding": "gzip"}
        got = await store.get("big/page.html.gz")
        assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()


@pytest.mark.s3
async def test_s3_creates_the_bucket_and_a_second_opener_finds_it(s3):
    cfg = s3_settings(s3).s3
    async with S3Storage(cfg) as first:
        assert bucket_exists(s3, cfg.bucket)
        await first.put_bytes("a", b"1", content_type="text/plain")
    async with S3Storage(cfg) as second:
        assert await second.get("a") == b"1"


@pytest.mark.s3
async def test_s3_unreachable_at_start_is_a_configuration_error():
    cfg = Settings(s3={"endpoint": f"127.0.0.1:{refused_port()}", "access_key": "a", "secret_key": "b"}).s3
    with pytest.raises(ConfigurationError, match="cannot reach S3") as info:
        async with S3Storage(cfg):
            pass
    assert not isinstance(info.value, AuthenticationFailed)


@pytest.mark.s3
async def test_s3_outage_while_running_is_retryable_and_passes(s3):
    async with S3Storage(s3_settings(s3).s3) as store:
        await store.put_bytes("before", b"1", content_type="text/plain")
        s3.outage()
        try:
            for call in (store.put_bytes("during", b"2", content_type="text/plain"), store.get("before"),
                         store.delete("before"), store.keys()):
                with pytest.raises(StorageUnavailable):
                    await call
        finally:
            s3.restore()
        assert await store.get("before") == b"1"  # nothing lost while the endpoint was down
        await store.put_bytes("after", b"3", content_type="text/plain")
        assert await store.keys() == ["after", "before"]


@pytest.fixture(scope="module")
def strict_s3(tmp_path_factory):
    """A second S3 server that checks credentials (moto only does when told to)."""
    saved = os.environ.get("INITIAL_NO_AUTH_ACTION_COUNT")
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
    try:
        server = S3Server(tmp_path_factory.mktemp("strict-s3")).start()
    finally:
        if saved is None:
            os.environ.pop("INITIAL_NO_AUTH_ACTION_COUNT")
        else:
            os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = saved
    yield server
    server.stop()


@pytest.mark.s3
async def test_refused_credentials_are_authentication_failed(strict_s3):
    cfg = Settings(s3={**strict_s3.settings("strict"), "secret_key": "wrong"}).s3
    with pytest.raises(AuthenticationFailed, match="BUSSCRAPE_S3__ACCESS_KEY"):
        async with S3Storage(cfg):
            pass


@pytest.mark.s3
@pytest.mark.slow
def test_the_ingester_command_exits_3_on_refused_credentials_and_2_when_s3_is_down(strict_s3, nats_server, tmp_path):
    base = {k: v for k, v in os.environ.items() if not k.startswith("BUSSCRAPE_")}
    base.update({"BUSSCRAPE_NATS__URL": nats_server.url, "BUSSCRAPE_STATE_DIR": str(tmp_path),
                 "BUSSCRAPE_TELEMETRY__LOG_FORMAT": "json", "BUSSCRAPE_S3__ACCESS_KEY": "nobody",
                 "BUSSCRAPE_S3__SECRET_KEY": "wrong"})
    cmd = [sys.executable, "-m", "busscrape", "ingester", "--exit-when-idle", "1"]
    refused = subprocess.run(cmd, env={**base, "BUSSCRAPE_S3__ENDPOINT": strict_s3.endpoint},
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 3, refused.stderr
    assert "refused the credentials" in refused.stderr
    down = subprocess.run(cmd, env={**base, "BUSSCRAPE_S3__ENDPOINT": f"127.0.0.1:{refused_port()}"},
                          capture_output=True, text=True, timeout=60)
    assert down.returncode == 2, down.stderr
    assert "cannot reach S3" in down.stderr


async def test_file_writes_are_atomic_and_temporary_files_stay_hidden(tmp_path):
    release = asyncio.Event()

    first = b"a" * WRITE_BUFFER  # enough that the file is being written before the stream ends

    async def slow():
        yield first
        await release.wait()
        yield b"b" * 1000

    async with FileStorage(tmp_path) as store:
        writing = asyncio.create_task(store.put("dt=x/t/page.html", slow(), content_type="text/html"))
        async def mid_write() -> bool:  # the first buffer is in the partial file; the rest is held back
            partials = list((tmp_path / PARTIAL_DIR).iterdir()) if (tmp_path / PARTIAL_DIR).exists() else []
            return any(p.stat().st_size >= len(first) for p in partials)

        await wait_until(mid_write, timeout=30, every=0.01)
        assert not (tmp_path / "dt=x" / "t" / "page.html").exists()  # nothing under the key mid-write
        assert len(list((tmp_path / PARTIAL_DIR).iterdir())) == 1  # the write in progress, out of sight
        assert await store.keys() == []
        release.set()
        await writing
        assert (tmp_path / "dt=x" / "t" / "page.html").read_bytes() == first + b"b" * 1000
        assert list((tmp_path / PARTIAL_DIR).iterdir()) == []


async def test_file_storage_sweeps_stale_partials_and_refuses_keys_that_escape(tmp_path):
    (tmp_path / PARTIAL_DIR).mkdir()
    stale, fresh = tmp_path / PARTIAL_DIR / "old-page.html", tmp_path / PARTIAL_DIR / "new-page.html"
    stale.write_bytes(b"half")
    fresh.write_bytes(b"half")  # may belong to another live ingester on this folder
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    async with FileStorage(tmp_path) as store:
        assert not stale.exists() and fresh.exists()
        for key in ("../x", "a//b", "/abs", ".partial/x", "a/./b", ""):
            with pytest.raises(ValueError):
                await store.put_bytes(key, b"", content_type="text/plain")


async def test_an_unwritable_archive_folder_is_a_configuration_error(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ConfigurationError, match="BUSSCRAPE_ARCHIVE__DIR"):
        async with FileStorage(tmp_path / "file" / "archive"):
            pass


def test_which_storage(tmp_path):
    assert isinstance(open_storage(Settings(state_dir=tmp_path)), FileStorage)
    assert open_storage(Settings(state_dir=tmp_path)).root == (tmp_path / "archive").absolute()
    s3 = Settings(s3={"endpoint": "https://minio.internal:9000", "bucket": "b"})
    assert isinstance(open_storage(s3), S3Storage)
    assert endpoint_of(s3.s3) == ("minio.internal:9000", True)
    assert endpoint_of(Settings(s3={"endpoint": "127.0.0.1:9000"}).s3) == ("127.0.0.1:9000", False)
    chosen = open_storage(s3, f"file://{tmp_path}/here")  # --archive wins over the S3 settings
    assert isinstance(chosen, FileStorage) and chosen.root == Path(tmp_path) / "here"
