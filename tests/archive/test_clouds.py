"""Azure Blob (Azurite) and Google Cloud Storage (gcp-storage-emulator) behind the archive's
``Storage`` interface, reached through each cloud's standard environment; and the location URLs.

object_store speaks GCS's XML API, which gcp-storage-emulator answers too little of to hold data
(its PUT returns no ETag, its GET no Last-Modified, and it has no XML list, delete, copy or
multipart; fake-gcs-server lacks most of them too): the GCS tests show the emulator environment
reaching the server, a missing key read as none, and an outage as ``StorageUnavailable``. The
data path is the same ``ObjectStorage`` code tested on S3 and Azure.
"""

import os
import uuid
from pathlib import Path

import obstore
import pytest

from busscrape.archive.storage import open_storage
from busscrape.archive.storage.clouds import AzureStorage, GCSStorage, connection_string
from busscrape.archive.storage.local import FileStorage
from busscrape.archive.storage.s3 import S3Storage
from busscrape.errors import ArtifactUnusable, ConfigurationError, StorageRefused, StorageUnavailable
from busscrape.settings import Settings
from tests.archive.test_storage import chunks

MiB = 1024 * 1024


async def opened(server, monkeypatch, create, url: str, **s3):
    """The storage at ``url`` (its bucket or container made by ``create``), through the server's env."""
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    name = f"t{uuid.uuid4().hex[:12]}"
    create(name)
    return open_storage(Settings(archive={"url": url.format(name)}, s3=s3))


@pytest.fixture
async def azure(azurite, monkeypatch):
    store = await opened(azurite, monkeypatch, azurite.create_container, "az://{}/runs/one", part_size="5MiB")
    assert isinstance(store, AzureStorage)
    async with store:
        yield store


@pytest.fixture
async def google(gcs, monkeypatch):
    store = await opened(gcs, monkeypatch, gcs.create_bucket, "gs://{}/runs/one")
    assert isinstance(store, GCSStorage)
    async with store:
        yield store


@pytest.mark.s3
async def test_azure_put_get_list_move_delete_under_the_prefix(azure, azurite):
    data = os.urandom(MiB + 3)
    await azure.put("dt=2025-01-01/host=a/t1/page.html.gz", chunks(data), content_type="text/html",
                    content_encoding="gzip")
    await azure.put_bytes("dt=2025-01-01/host=a/t1/meta.json", b"{}\n", content_type="application/json")
    assert await azure.get("dt=2025-01-01/host=a/t1/page.html.gz") == data
    assert await azure.get("dt=2025-01-01/host=a/t1/nothing") is None
    assert await azure.keys("dt=2025-01") == ["dt=2025-01-01/host=a/t1/meta.json",
                                              "dt=2025-01-01/host=a/t1/page.html.gz"]
    stored = await obstore.get_async(azure.store, "dt=2025-01-01/host=a/t1/page.html.gz")
    assert stored.attributes == {"Content-Type": "text/html", "Content-Encoding": "gzip"}
    await azure.move("dt=2025-01-01/host=a/t1/meta.json", "dt=2025-01-01/host=a/t1/moved.json")
    await azure.delete("dt=2025-01-01/host=a/t1/page.html.gz")
    await azure.delete("dt=2025-01-01/host=a/t1/page.html.gz")  # idempotent
    assert await azure.keys() == ["dt=2025-01-01/host=a/t1/moved.json"]
    # The prefix of the URL is where the keys are, as Azure's own SDK sees the container.
    from azure.storage.blob import BlobServiceClient

    client = BlobServiceClient.from_connection_string(azurite.env()["AZURE_STORAGE_CONNECTION_STRING"])
    names = [blob.name for blob in client.get_container_client(azure.container).list_blobs()]
    assert names == ["runs/one/dt=2025-01-01/host=a/t1/moved.json"]


@pytest.mark.s3
async def test_azure_large_objects_go_up_in_blocks_and_a_failing_source_leaves_nothing(azure):
    data = os.urandom(12 * MiB)
    await azure.put("big/page.warc.gz", chunks(data), content_type="application/warc")
    assert await azure.get("big/page.warc.gz") == data
    broken = ArtifactUnusable("checksum", reason="artifact_checksum_mismatch")
    for size in (300 * 1024, 11 * MiB):  # one PUT, and a block upload
        with pytest.raises(ArtifactUnusable):
            await azure.put("k/page.html", chunks(os.urandom(size), fail=broken), content_type="text/html")
        assert await azure.get("k/page.html") is None


@pytest.mark.s3
async def test_gcs_is_reached_through_the_emulator_env_and_an_outage_is_retryable(google, gcs):
    assert await google.get("dt=2025-01-01/host=a/t1/nothing") is None  # reached, and answered
    gcs.outage()
    try:
        with pytest.raises(StorageUnavailable, match="gs://"):
            await google.get("dt=2025-01-01/host=a/t1/nothing")
    finally:
        gcs.restore()
    assert await google.get("dt=2025-01-01/host=a/t1/nothing") is None


async def outage_costs_time_not_data(store, server) -> None:
    await store.put_bytes("before", b"1", content_type="text/plain")
    server.outage()
    try:
        for call in (store.put_bytes("during", b"2", content_type="text/plain"), store.get("before")):
            with pytest.raises(StorageUnavailable):
                await call
    finally:
        server.restore()
    assert await store.get("before") == b"1"  # nothing lost while the endpoint was down
    await store.put_bytes("after", b"3", content_type="text/plain")
    assert await store.get("after") == b"3"


@pytest.mark.s3
async def test_an_azure_outage_is_retryable_and_loses_nothing(azure, azurite):
    await outage_costs_time_not_data(azure, azurite)


@pytest.mark.s3
async def test_a_missing_container_or_an_unreachable_store_stops_at_start(azurite, monkeypatch):
    for name, value in azurite.env().items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError, match="does not exist"):
        async with AzureStorage("nosuchcontainer", part_size=5 * MiB):
            pass
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    with pytest.raises(ConfigurationError, match="cannot reach gs://b"):
        async with GCSStorage("b", part_size=5 * MiB):
            pass


def test_the_location_picks_the_backend(tmp_path):
    def opened(url, **sections):
        return open_storage(Settings(state_dir=tmp_path, **sections), url)

    s3 = opened("s3://bucket/some/prefix/")
    assert isinstance(s3, S3Storage) and (s3.bucket, s3.prefix, s3.url) == ("bucket", "some/prefix",
                                                                             "s3://bucket/some/prefix")
    assert isinstance(opened("gs://b/p"), GCSStorage) and opened("gs://b/p").url == "gs://b/p"
    assert isinstance(opened("az://c"), AzureStorage) and opened("az://c").url == "az://c"
    local = opened(f"file://{tmp_path}/here")
    assert isinstance(local, FileStorage) and local.root == Path(tmp_path) / "here"
    assert isinstance(opened(None, archive={"url": "gs://x"}), GCSStorage)
    fixed = opened(None, s3={"endpoint": "127.0.0.1:9", "bucket": "fixed"})
    assert isinstance(fixed, S3Storage) and fixed.url == "s3://fixed"
    for bad, says in (("ftp://host/x", "unknown scheme 'ftp'"), ("s3:///prefix", "no bucket")):
        with pytest.raises(ConfigurationError, match=says):
            opened(bad)


def test_the_archive_flag_sets_a_cloud_url_or_a_folder(tmp_path):
    from busscrape.cli.app import archive_section

    assert archive_section("az://c/runs") == {"url": "az://c/runs"}
    assert archive_section(f"file://{tmp_path}") == {"dir": tmp_path, "url": str(tmp_path)}
    assert archive_section(None) == {}
    chosen = Settings(archive={"url": "gs://b/old"}).with_overrides(archive=archive_section(str(tmp_path)))
    assert isinstance(open_storage(chosen), FileStorage)  # a folder given on the command line wins


def test_connection_strings_read_as_azure_sdks_do():
    config = connection_string("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5==;"
                               "BlobEndpoint=https://acct.blob.example/;")
    assert config == {"account_name": "acct", "account_key": "a2V5==", "endpoint": "https://acct.blob.example"}
    assert connection_string("UseDevelopmentStorage=true") == {"use_emulator": True}


@pytest.mark.s3
async def test_a_runs_pages_are_read_back_from_the_cloud_archive(azure):
    from busscrape.dataset.pages import PageFeed
    from busscrape.status.records import TaskStatus

    folder = "dt=2025-01-01/host=a/t1"
    await azure.put_bytes(f"{folder}/meta.json", b'{"url": "https://a.example/", "title": "A"}',
                          content_type="application/json")
    feed = PageFeed(Settings(archive={"url": azure.url}))
    try:
        page = await feed.page(TaskStatus(task_id="t1", state="archived", archive=f"{azure.url}/{folder}"))
    finally:
        if feed._storage is not None:
            await feed._storage.close()
    assert (page.url, page.title, page.folder) == ("https://a.example/", "A", f"{azure.url}/{folder}")


@pytest.mark.s3
async def test_a_key_the_store_cannot_hold_is_refused_for_good(azure):
    for call in (azure.put_bytes("dt=2025-01-01/a//b", b"1", content_type="text/plain"),
                 azure.get("dt=2025-01-01/../b")):
        with pytest.raises(StorageRefused, match=r"az://.*cannot hold the key"):
            await call
