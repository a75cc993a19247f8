"""The archive layout: where a result's objects go, how they are stored, and ``meta.json``.

Everything here is a pure function of the result (never of the ingest time or host), so a
redelivered result maps to the same keys and the same bytes::

    <prefix>/dt=2025-01-31/host=example.org/<task_id>/page.html.gz     gzip, Content-Type text/html
                                                      screenshot.png   as captured
                                                      page.har.gz      gzip
                                                      page.txt.gz      gzip
                                                      shot-<name>.png  extra named screenshots
                                                      extracted.json   the task's extractor's record
                                                      meta.json        written last: the folder is complete
    <prefix>/deadletter/dt=2025-01-31/<task_id>.json                   the dead letter as filed
    <prefix>/deadletter/dt=2025-01-31/poison-<stream>-<seq>.json       an undecodable message's letter

``dt`` is the scrape time in UTC, ``host`` the host of the task's URL (Hive-escaped; no host
gives ``__HIVE_DEFAULT_PARTITION__`` as Hive and Spark write it). A file system refuses names over
255 bytes and an escaped host can be longer (a 253-character name with escapes): such a value is
kept to its first ``LONG_KEEP`` characters plus ``~`` and 16 hex digits of its sha256, so every
URL the dispatcher accepts has a folder, the same one every time. HTML, HAR and text are
gzip-compressed with a fixed header (mtime 0, OS "unknown") and a fixed level, so the
compressed bytes are a function of the original bytes; ``zcat``, DuckDB, Spark and browsers
(through ``Content-Encoding: gzip``) read them as they are. Images are stored as captured.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import struct
import zlib
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from busscrape.bus.names import poison_letter_id
from busscrape.deadletters.filing import host_of
from busscrape.errors import PermanentError
from busscrape.extract import records
from busscrape.model.messages import ArtifactRef, DeadLetter, ScrapeResult

META_NAME = "meta.json"
META_SCHEMA_VERSION = 1
DEADLETTER_FOLDER = "deadletter"
COMPRESSED_KINDS = frozenset({"html", "har", "text"})
GZIP_LEVEL = 1  # the default of archive.gzip_level; the same level and bytes in give the same bytes out
NO_HOST = "__HIVE_DEFAULT_PARTITION__"

_INLINE_LIMIT = 64 * 1024  # smaller chunks compress inline; larger ones in a thread (zlib drops the GIL)
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class PlannedObject:
    """One artifact's place in the archive."""

    ref: ArtifactRef
    key: str
    name: str
    """File name in the folder (``page.html.gz``)."""
    content_encoding: str | None
    """``gzip`` when the stored bytes are compressed."""
    inline: bytes | None = None
    """The bytes themselves, for an object made from the result (``extracted.json``), not copied
    from ARTIFACTS."""


@dataclass(frozen=True)
class StoredObject:
    """What ``meta.json`` says about one stored object (size and sha256 of the stored bytes)."""

    key: str
    name: str
    size: int
    sha256: str
    content_type: str
    content_encoding: str | None
    original_size: int
    original_sha256: str


@dataclass(frozen=True)
class ArchivePlan:
    """Every key one result writes."""

    folder: str
    objects: tuple[PlannedObject, ...]
    meta_key: str


def join(*parts: str) -> str:
    """A key from parts, without empty parts or doubled slashes (so an empty prefix is fine)."""
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


def partition_date(moment: datetime) -> str:
    """``YYYY-MM-DD`` of ``moment`` in UTC (a naive time is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d")


def partition_value(value: str | None, *, name: str = "host") -> str:
    """A Hive partition value: characters other than ``[A-Za-z0-9._-]`` escaped as ``%XX``, and
    shortened (deterministically) where ``<name>=<value>`` would not fit in a file name."""
    if not value:
        return NO_HOST
    escaped = _SAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), value)
    return shortened(escaped, MAX_NAME - len(name) - 1)


MAX_NAME = 255  # bytes in one path component on every common file system
LONG_KEEP = 100


def shortened(component: str, limit: int = MAX_NAME) -> str:
    """``component`` as it is when it fits in ``limit`` bytes, else its first ``LONG_KEEP``
    characters, ``~`` and 16 hex digits of the whole one's sha256 (stable, and still readable)."""
    if len(component.encode()) <= limit:
        return component
    return f"{component[:LONG_KEEP]}~{hashlib.sha256(component.encode()).hexdigest()[:16]}"


def plan(result: ScrapeResult, *, prefix: str = "", compress: bool = True) -> ArchivePlan:
    """The keys of a result's objects and of its ``meta.json``.

    Raises ``PermanentError`` (dead-letter) when two artifacts, or an artifact and
    ``meta.json``, would land on the same key.
    """
    folder = join(prefix, f"dt={partition_date(result.scraped_at)}", f"host={partition_value(host_of(result.url))}",
                  result.task_id)
    objects = []
    names = {META_NAME}
    for ref in result.artifacts:
        gzip = compress and ref.kind in COMPRESSED_KINDS
        name = ref.name + ".gz" if gzip else ref.name
        if name in names:
            raise PermanentError(f"result {result.task_id}: two objects would be stored as {name}",
                                 reason="artifact_name_conflict")
        names.add(name)
        objects.append(PlannedObject(ref=ref, key=join(folder, name), name=name,
                                     content_encoding="gzip" if gzip else None))
    if result.extraction is not None:
        data = records.document_bytes(result)
        ref = ArtifactRef(name=records.EXTRACTED_NAME, kind="extracted", object="(inline)", size=len(data),
                          sha256=hashlib.sha256(data).hexdigest(), content_type="application/json")
        if ref.name in names:
            raise PermanentError(f"result {result.task_id}: two objects would be stored as {ref.name}",
                                 reason="artifact_name_conflict")
        objects.append(PlannedObject(ref=ref, key=join(folder, ref.name), name=ref.name, content_encoding=None,
                                     inline=data))
    return ArchivePlan(folder=folder, objects=tuple(objects), meta_key=join(folder, META_NAME))


def meta_document(result: ScrapeResult, objects: list[StoredObject]) -> bytes:
    """``meta.json``: one line of JSON (what Spark, Trino and DuckDB read without options).

    No ingest time and no ingester name: a redelivery must write the same bytes.
    """
    doc: dict[str, Any] = {
        "schema_version": META_SCHEMA_VERSION,
        **result.model_dump(mode="json", include={
            "task_id", "task_seq", "url", "original_url", "final_url", "status", "redirect_chain",
            "response_headers", "title", "timings", "labels", "worker", "attempt", "scraped_at", "blocked_requests",
        }),
        "objects": [asdict(o) for o in sorted(objects, key=lambda o: o.name)],
    }
    if (extraction := records.summary(result)) is not None:
        doc["extraction"] = extraction
    if result.crawl is not None:
        doc["crawl"] = result.crawl.model_dump(mode="json")
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE)


def describes(meta: bytes, result: ScrapeResult, archive_plan: ArchivePlan) -> bool:
    """Whether a stored ``meta.json`` is the one this result writes (so its folder is complete).

    Compares what identifies the result and its bytes: the task delivery, the attempt, and
    each planned object with the digest of its original bytes.
    """
    try:
        doc = orjson.loads(meta)
        objects = {(o["key"], o["original_sha256"], o["original_size"], o["content_encoding"])
                   for o in doc["objects"]}
        same_task = (doc["task_id"], doc["task_seq"], doc["attempt"], doc["worker"]) == (
            result.task_id, result.task_seq, result.attempt, result.worker)
        same_time = datetime.fromisoformat(doc["scraped_at"]) == result.scraped_at
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return False  # unreadable: rewrite it
    planned = {(p.key, p.ref.sha256, p.ref.size, p.content_encoding) for p in archive_plan.objects}
    return same_task and same_time and objects == planned


STAGING = ".staging"
"""A folder's staging area (``<folder>/.staging/<file>``), where a result that replaces another one
of the same day waits until it is complete. Dot-named: the archive's readers skip it."""


def staged_key(folder: str, key: str) -> str:
    """Where ``key`` of ``folder`` is staged."""
    return f"{folder}/{STAGING}/{key.rsplit('/', 1)[-1]}"


def supersedes(meta: bytes, result: ScrapeResult) -> bool:
    """Whether a stored ``meta.json`` describes a later scrape than ``result`` (the folder keeps
    the latest scrape of its task and day: an older result arriving after it writes nothing)."""
    try:
        doc = orjson.loads(meta)
        stored = (datetime.fromisoformat(doc["scraped_at"]), doc["task_seq"], doc["attempt"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return False  # unreadable: rewrite it
    return stored > (result.scraped_at, result.task_seq, result.attempt)


def listed_keys(meta: bytes) -> set[str]:
    """The object keys a stored ``meta.json`` lists (none when it is unreadable)."""
    try:
        return {o["key"] for o in orjson.loads(meta)["objects"]}
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return set()


def deadletter_key(letter: DeadLetter, *, prefix: str = "", stream: str, seq: int) -> str:
    """Where a dead letter is archived: by its task id, else by the poison message it reports.

    ``stream``/``seq`` locate the letter itself in DEADLETTER: the name of last resort.
    """
    if letter.task_id:
        name = letter.task_id
    elif letter.source is not None and letter.source.seq is not None:
        name = poison_letter_id(letter.source.stream, letter.source.seq)
    else:
        name = poison_letter_id(stream, seq)
    return join(prefix, DEADLETTER_FOLDER, f"dt={partition_date(letter.dead_at)}", f"{partition_value(name)}.json")


# -- deterministic gzip -------------------------------------------------------------------------

def gzip_header(level: int) -> bytes:
    """RFC 1952 header: magic, deflate, no flags, mtime 0, extra flags, OS 255 ("unknown")."""
    xfl = {9: 2, 1: 4}.get(level, 0)
    return b"\x1f\x8b\x08\x00" + struct.pack("<I", 0) + bytes([xfl, 255])


async def gzip_stream(chunks: AsyncIterable[bytes], level: int = GZIP_LEVEL) -> AsyncIterator[bytes]:
    """Gzip ``chunks`` as they come, with a header that carries no time, name or OS.

    Bytes out depend only on bytes in (for one zlib build), so a redelivered result is
    stored byte for byte as before. Large chunks compress in a worker thread.
    """
    deflate = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    crc = 0
    size = 0
    yield gzip_header(level)
    async for chunk in chunks:
        crc = zlib.crc32(chunk, crc)
        size += len(chunk)
        out = deflate.compress(chunk) if len(chunk) < _INLINE_LIMIT else await asyncio.to_thread(
            deflate.compress, chunk)
        if out:
            yield out
    yield deflate.flush() + struct.pack("<II", crc & 0xFFFFFFFF, size & 0xFFFFFFFF)
