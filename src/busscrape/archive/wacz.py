"""Packaging the pages' WARCs into one WACZ (``busscrape wacz``, ``busscrape run --wacz``).

A WACZ (Webrecorder's web-archive package, read by ReplayWeb.page and pywb) is a zip of the
WARCs (``archive/``), their index (``indexes/``), the page list (``pages/pages.jsonl``) and
``datapackage.json`` with every file's digest. The package is written by py-wacz (``wacz
create``) from the WARCs of the chosen page folders, then stored in the archive next to them::

    <prefix>/wacz/<name>.wacz          the package
    <prefix>/wacz/<name>.folders       the page folders it holds, one per line

Packing again under the same name adds the new folders to those the package held (a crawl that
grew, a second run): the package is rebuilt with all of them, so it always stands alone. Each
page's ``meta.json`` says where its WARC is (a folder without one is skipped and reported) and
gives its pages.jsonl line (URL, title).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import tempfile
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from busscrape.archive.layout import META_NAME, join
from busscrape.archive.storage.base import Storage
from busscrape.artifacts.files import WARC_FILE
from busscrape.errors import PermanentError

FOLDER = "wacz"
_READ = 1024 * 1024


@dataclass
class Packed:
    """What one packing did."""

    key: str
    pages: int
    size: int
    skipped: list[str] = field(default_factory=list)
    """Folders left out, each with why (no meta.json yet, no WARC in it)."""
    dangling: int = 0
    """``revisit`` records whose original is not in the package (WARCs written with
    ``worker.warc_revisits = "worker"``, packed without the page holding the body): a replay of
    those requests finds nothing. With the default (``page``) there are none."""


def package_key(name: str, prefix: str = "") -> str:
    """Where the package called ``name`` is stored."""
    if not name or "/" in name or name.startswith("."):
        raise PermanentError(f"WACZ name {name!r}: a plain file name is needed (no '/', not hidden)",
                             reason="bad_wacz_name")
    return join(prefix, FOLDER, f"{name.removesuffix('.wacz')}.wacz")


def folder_of(location: str, storage: Storage) -> str:
    """The key of a page folder from its location (``RunSummary.locations``: storage URL + key)."""
    return storage.key_of(location)


async def page_folders(storage: Storage, prefix: str = "") -> list[str]:
    """Every page folder under ``prefix`` that has a WARC (``<folder>/page.warc.gz``)."""
    return sorted(key.rsplit("/", 1)[0] for key in await storage.keys(prefix)
                  if key.endswith("/" + WARC_FILE) and "/.staging/" not in key)


async def pack(storage: Storage, folders: Iterable[str], name: str, *, prefix: str = "") -> Packed:
    """Package the WARCs of ``folders`` (and those the package of this name held) as one WACZ."""
    key = package_key(name, prefix)
    listing = key.removesuffix(".wacz") + ".folders"
    before = await storage.get(listing)
    wanted = set(folders) | (set(before.decode().split()) if before else set())
    with tempfile.TemporaryDirectory(prefix="busscrape-wacz-") as tmp:
        work = Path(tmp)
        warcs, pages, skipped, held = [], [], [], []
        for index, folder in enumerate(sorted(wanted)):
            page, why = await _fetch(storage, folder, work / f"{index:06d}-{folder.rsplit('/', 1)[-1]}.warc.gz")
            if page is None:
                skipped.append(f"{folder}: {why}")
                continue
            warcs.append(str(page.pop("path")))
            pages.append(page)
            held.append(folder)
        if not warcs:
            if not wanted:
                raise PermanentError("no page WARC to package: no page folder found (--folder KEY, --under PREFIX)",
                                     reason="no_warcs")
            said = "; ".join(skipped[:5]) + (f"; … {len(skipped) - 5} more" if len(skipped) > 5 else "")
            raise PermanentError(f"no page WARC to package: {said} (a page has its WARC when its task asks for "
                                 "the warc artifact: --artifacts …,warc)", reason="no_warcs")
        pages_file = work / "pages.jsonl"
        pages_file.write_bytes(b"".join(orjson.dumps(p) + b"\n" for p in [
            {"format": "json-pages-1.0", "id": "pages", "title": name}, *pages]))
        output = work / "out.wacz"
        dangling = await asyncio.to_thread(_dangling, warcs)
        await asyncio.to_thread(_create, output, pages_file, warcs)
        await storage.put(key, _read(output), content_type="application/wacz")
        await storage.put_bytes(listing, "\n".join(held).encode() + b"\n", content_type="text/plain")
        return Packed(key=key, pages=len(pages), size=output.stat().st_size, skipped=skipped, dangling=dangling)


async def _fetch(storage: Storage, folder: str, path: Path) -> tuple[dict[str, Any] | None, str]:
    """The folder's pages.jsonl line (and where its WARC was written), or None and why not."""
    meta = await storage.get(join(folder, META_NAME))
    if meta is None:
        return None, "no meta.json (not archived, or not yet)"
    try:
        doc = orjson.loads(meta)
        warc = next((o["key"] for o in doc["objects"] if o["name"] == WARC_FILE), None)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None, "meta.json unreadable"
    if warc is None:
        return None, "no WARC (the task did not ask for the warc artifact)"
    data = await storage.get(warc)
    if data is None:
        return None, f"{warc} is listed but missing"
    await asyncio.to_thread(path.write_bytes, data)
    return {"id": doc.get("task_id"), "url": doc.get("url"), "title": doc.get("title") or doc.get("url"),
            "path": path}, ""


def _dangling(warcs: list[str]) -> int:
    """Revisit records of ``warcs`` whose original (``WARC-Refers-To-Target-URI`` and ``-Date``)
    none of them holds."""
    from warcio.archiveiterator import ArchiveIterator

    held: set[tuple[str | None, str | None]] = set()
    wanted: list[tuple[str | None, str | None]] = []
    for path in warcs:
        with open(path, "rb") as handle:
            for record in ArchiveIterator(handle):
                headers = record.rec_headers
                if record.rec_type == "response":
                    held.add((headers.get_header("WARC-Target-URI"), headers.get_header("WARC-Date")))
                elif record.rec_type == "revisit":
                    wanted.append((headers.get_header("WARC-Refers-To-Target-URI"),
                                   headers.get_header("WARC-Refers-To-Date")))
    return sum(original not in held for original in wanted)


def _create(output: Path, pages: Path, warcs: list[str]) -> None:
    from wacz.main import main

    said = io.StringIO()
    with contextlib.redirect_stdout(said):  # py-wacz reports by printing
        code = main(["create", "-o", str(output), "-p", str(pages), *warcs])
    if code not in (0, None) or not output.exists():
        raise PermanentError(f"wacz create failed ({code}): {said.getvalue()[-500:]}", reason="wacz_failed")


async def _read(path: Path) -> AsyncIterator[bytes]:
    with path.open("rb") as handle:
        while chunk := await asyncio.to_thread(handle.read, _READ):
            yield chunk
