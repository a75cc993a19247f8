"""The archive layout: keys, Hive partitions, deterministic gzip, meta.json and dead-letter keys."""

import gzip
import hashlib
import os
import zlib
from datetime import UTC, datetime, timedelta, timezone

import orjson
import pytest

from busscrape.archive import layout
from busscrape.errors import PermanentError
from busscrape.model.messages import ArtifactRef, DeadLetter, MessageSource, ScrapeResult

TASK = "0123456789abcdef0123456789abcdef"


def ref(name: str, kind: str, content_type: str, data: bytes = b"x") -> ArtifactRef:
    return ArtifactRef(name=name, kind=kind, object=f"{TASK}/1/1/{name}", size=len(data),
                       sha256=hashlib.sha256(data).hexdigest(), content_type=content_type)


def result(url: str = "https://Example.org:8443/a?b=1", scraped_at: datetime | None = None, **kw) -> ScrapeResult:
    artifacts = (
        ref("page.html", "html", "text/html; charset=utf-8"),
        ref("screenshot.png", "screenshot", "image/png"),
        ref("page.har", "har", "application/json"),
        ref("page.txt", "text", "text/plain; charset=utf-8"),
        ref("shot-footer.png", "extra_screenshot", "image/png"),
    )
    fields = {"task_id": TASK, "task_seq": 7, "url": url, "original_url": url, "final_url": url, "status": 200,
              "artifacts": artifacts, "worker": "w1", "attempt": 1,
              "scraped_at": scraped_at or datetime(2025, 1, 31, 23, 59, tzinfo=UTC), **kw}
    return ScrapeResult(**fields)


async def collect(stream) -> bytes:
    return b"".join([c async for c in stream])


async def chunks(data: bytes, size: int):
    for i in range(0, len(data), size):
        yield data[i:i + size]


def test_keys_are_hive_partitions_of_the_scrape_time_in_utc():
    # 22:30 at UTC-2 on the 31st is 00:30 UTC on 1 February: the partition follows UTC.
    late = datetime(2025, 1, 31, 22, 30, tzinfo=timezone(timedelta(hours=-2)))
    plan = layout.plan(result(scraped_at=late), prefix="crawls/2025")
    folder = f"crawls/2025/dt=2025-02-01/host=example.org/{TASK}"
    assert plan.folder == folder
    assert plan.meta_key == f"{folder}/meta.json"
    assert [o.key.removeprefix(folder + "/") for o in plan.objects] == [
        "page.html.gz", "screenshot.png", "page.har.gz", "page.txt.gz", "shot-footer.png"]
    assert [o.content_encoding for o in plan.objects] == ["gzip", None, "gzip", "gzip", None]


def test_without_compression_names_are_plain_and_an_empty_prefix_adds_no_slash():
    plan = layout.plan(result(), compress=False)
    assert plan.folder == f"dt=2025-01-31/host=example.org/{TASK}"
    assert [o.name for o in plan.objects] == [
        "page.html", "screenshot.png", "page.har", "page.txt", "shot-footer.png"]
    assert all(o.content_encoding is None for o in plan.objects)


@pytest.mark.parametrize(("url", "host"), [
    ("http://[::1]:8080/", "%3A%3A1"),
    ("http://127.0.0.2:8000/x", "127.0.0.2"),
    ("http://bücher.example/", "b%C3%BCcher.example"),
    ("about:blank", layout.NO_HOST),
])
def test_host_partition_values_are_escaped_like_hive(url, host):
    assert layout.plan(result(url=url)).folder.split("/")[1] == f"host={host}"


@pytest.mark.parametrize("names", [("meta.json",), ("page.html", "page.html")])
def test_artifacts_that_would_share_a_key_are_a_permanent_error(names):
    artifacts = tuple(ref(n, "screenshot", "image/png") for n in names)
    with pytest.raises(PermanentError) as info:
        layout.plan(result().model_copy(update={"artifacts": artifacts}))
    assert info.value.reason == "artifact_name_conflict"


async def test_gzip_is_standard_and_depends_only_on_the_bytes():
    data = b"<html>" + b"".join(b"<p>row %d</p>" % i for i in range(60_000)) + os.urandom(70_000) + b"</html>"
    one = await collect(layout.gzip_stream(chunks(data, 256 * 1024)))
    other = await collect(layout.gzip_stream(chunks(data, 4096)))
    assert one == other  # however the artifact arrives
    assert gzip.decompress(one) == data
    # no mtime, no name, OS "unknown"; XFL 4 says "fastest" (the default level 1)
    assert one[:10] == b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\xff"
    assert len(one) < len(data) * 0.5
    best = await collect(layout.gzip_stream(chunks(data, 4096), 9))
    assert gzip.decompress(best) == data and best[8] == 2 and len(best) < len(one)  # XFL 2: "best"


async def test_gzip_of_nothing_is_a_valid_empty_member():
    assert gzip.decompress(await collect(layout.gzip_stream(chunks(b"", 1)))) == b""
    assert zlib.decompress(await collect(layout.gzip_stream(chunks(b"abc", 1))), wbits=31) == b"abc"


def stored(plan: layout.ArchivePlan) -> list[layout.StoredObject]:
    return [layout.StoredObject(key=o.key, name=o.name, size=1, sha256="0" * 64, content_type=o.ref.content_type,
                                 content_encoding=o.content_encoding, original_size=o.ref.size,
                                 original_sha256=o.ref.sha256) for o in reversed(plan.objects)]


def test_meta_json_is_one_deterministic_line_without_ingest_time():
    r = result(labels={"job": "j1"}, timings={"total": 12.5}, title="Hi", redirect_chain=("https://a/",))
    plan = layout.plan(r)
    meta = layout.meta_document(r, stored(plan))
    assert meta == layout.meta_document(r, stored(plan))
    assert meta.endswith(b"\n") and meta.count(b"\n") == 1
    doc = orjson.loads(meta)
    assert {"task_id", "url", "original_url", "final_url", "status", "redirect_chain", "response_headers", "title",
            "timings", "labels", "worker", "attempt", "scraped_at", "objects", "schema_version"} <= set(doc)
    assert not {"archived_at", "ingested_at", "ingester", "dt", "host"} & set(doc)
    assert doc["labels"] == {"job": "j1"} and doc["status"] == 200
    assert datetime.fromisoformat(doc["scraped_at"]) == r.scraped_at
    assert [o["name"] for o in doc["objects"]] == sorted(o.name for o in plan.objects)
    assert set(doc["objects"][0]) == {"key", "name", "size", "sha256", "content_type", "content_encoding",
                                      "original_size", "original_sha256"}


def test_describes_recognises_only_the_same_result():
    r = result()
    plan = layout.plan(r)
    meta = layout.meta_document(r, stored(plan))
    assert layout.describes(meta, r, plan)
    retry = r.model_copy(update={"attempt": 2})
    assert not layout.describes(meta, retry, layout.plan(retry))
    other_bytes = r.model_copy(update={"artifacts": (ref("page.html", "html", "text/html", b"new"),)})
    assert not layout.describes(meta, other_bytes, layout.plan(other_bytes))
    raw = layout.plan(r, compress=False)
    assert not layout.describes(meta, r, raw)
    assert not layout.describes(b"{not json", r, plan)
    assert layout.listed_keys(meta) == {o.key for o in plan.objects}
    assert layout.listed_keys(b"[]") == set()


def test_dead_letter_keys():
    at = datetime(2025, 3, 1, 0, 5, tzinfo=UTC)
    task = DeadLetter(task_id=TASK, stage="worker", reason="http_404", error="404", dead_at=at)
    assert layout.deadletter_key(task, prefix="p", stream="DEADLETTER", seq=9) == \
        f"p/deadletter/dt=2025-03-01/{TASK}.json"
    poison = DeadLetter(stage="ingester", reason="not_json", error="x", dead_at=at,
                        source=MessageSource(stream="RESULTS", subject="busscrape.results.x", seq=42))
    assert layout.deadletter_key(poison, stream="DEADLETTER", seq=9) == \
        "deadletter/dt=2025-03-01/poison-RESULTS-42.json"
    unknown = DeadLetter(stage="ingester", reason="not_json", error="x", dead_at=at)
    assert layout.deadletter_key(unknown, stream="DEADLETTER", seq=9) == \
        "deadletter/dt=2025-03-01/poison-DEADLETTER-9.json"


def test_an_extraction_plans_extracted_json_from_the_result_and_its_summary_in_meta():
    from busscrape.model.messages import Extraction

    record = {"name": "Kettle", "price": "12.50", "reviews": [], "colour": None}
    r = result(extraction=Extraction(extractor="demo-product", version=2, record=record, warnings=("w",), ms=1.5))
    plan = layout.plan(r)
    [extracted] = [o for o in plan.objects if o.name == "extracted.json"]
    assert extracted.key == f"{plan.folder}/extracted.json" and extracted.content_encoding is None
    assert extracted.inline == layout.plan(r).objects[-1].inline  # a redelivery writes the same bytes
    doc = orjson.loads(extracted.inline)
    assert doc == {"extractor": "demo-product", "version": 2, "task_id": TASK, "url": r.url, "final_url": r.url,
                   "scraped_at": r.scraped_at.isoformat(), "record": record}
    meta = layout.meta_document(r, stored(plan))
    assert orjson.loads(meta)["extraction"] == {"extractor": "demo-product", "version": 2, "file": "extracted.json",
                                                "fields": 4, "empty": ["colour", "reviews"], "warnings": ["w"],
                                                "ms": 1.5}
    assert layout.describes(meta, r, plan)
    changed = r.model_copy(update={"extraction": r.extraction.model_copy(update={"record": {"name": "Other"}})})
    assert not layout.describes(meta, changed, layout.plan(changed))  # another record is another result
    assert "extraction" not in orjson.loads(layout.meta_document(result(), stored(layout.plan(result()))))


def test_a_record_is_bounded_and_a_missing_required_field_fails_naming_it():
    from busscrape.errors import ExtractionFailed, LimitExceeded
    from busscrape.extract.definition import Extractor
    from busscrape.extract.engine import Outcome
    from busscrape.extract.records import extraction

    e = Extractor.model_validate({"name": "x", "version": 1, "fields": {"a": {"css": "p"}}})
    assert extraction(e, Outcome(record={"a": "b"}, ms=2), max_bytes=100).record == {"a": "b"}
    with pytest.raises(LimitExceeded) as big:
        extraction(e, Outcome(record={"a": "b" * 200}), max_bytes=100)
    assert big.value.reason == "record_too_large"
    with pytest.raises(ExtractionFailed, match="required field missing: price: nothing matched") as failed:
        extraction(e, Outcome(record={}, missing=["price: nothing matched"]), max_bytes=100)
    assert failed.value.reason == "extraction_failed"
