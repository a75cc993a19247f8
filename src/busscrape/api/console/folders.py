"""A page's archive folder, as the console reads it: ``meta.json``, the extracted record, and its
files to download.

The folder is the one a search hit names (``archive_key``, the same key ``busscrape search``
prints) and must have the archive layout's shape (``…/dt=…/host=…/<task_id>``); a file is
served only when that folder's ``meta.json`` lists it, from the key ``meta.json`` gives, with the
type it was stored with and ``Content-Disposition: attachment`` (``guard.ARTIFACT_HEADERS``):
an archived HTML page is a download, never a page of the console's origin.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
from aiohttp import web

from busscrape.api.console.guard import ARTIFACT_HEADERS, Refused
from busscrape.archive.layout import META_NAME
from busscrape.archive.storage import Storage, open_storage
from busscrape.extract.records import EXTRACTED_NAME
from busscrape.settings import Settings

MAX_KEY = 2048
_TASK_ID = re.compile(r"^[0-9a-f]{32}$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
DOWNLOADS = {"html": "HTML", "har": "HAR", "warc": "WARC", "text": "text", "screenshot": "screenshot",
             "extra_screenshot": "screenshot", "extracted": "record (JSON)"}


def folder_key(key: str) -> str:
    """``key`` when it names a page folder of the archive layout, else ``Refused`` (400)."""
    parts = key.split("/")
    shaped = (len(key) <= MAX_KEY and len(parts) >= 3 and _TASK_ID.match(parts[-1]) is not None
              and parts[-2].startswith("host=") and parts[-3].startswith("dt=")
              and not any(p in ("", ".", "..") or p.startswith(".") for p in parts))
    if not shaped:
        raise Refused(400, "not an archive folder: a page's folder is …/dt=DATE/host=HOST/TASK_ID, as a search "
                           "result names it")
    return key


class Folders:
    """Reads page folders from the configured archive (opened on first use)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._storage: Storage | None = None
        self._lock = asyncio.Lock()

    async def _open(self) -> Storage:
        async with self._lock:
            if self._storage is None:
                storage = open_storage(self.settings)
                await storage.__aenter__()
                self._storage = storage
            return self._storage

    async def close(self) -> None:
        if self._storage is not None:
            await self._storage.__aexit__(None, None, None)
            self._storage = None

    async def _get(self, key: str) -> bytes | None:
        storage = await self._open()
        try:
            return await storage.get(key)
        except ValueError:  # the backend's own refusal of a key
            raise Refused(400, f"not an archive key: {key[:200]!r}") from None

    async def meta(self, folder: str) -> dict[str, Any]:
        """The folder's ``meta.json`` (``Refused`` 404 when the folder is not, or not yet, complete)."""
        raw = await self._get(f"{folder_key(folder)}/{META_NAME}")
        if raw is None:
            raise Refused(404, "no archived page in this folder (its meta.json is missing: purged, or not "
                               "archived yet)")
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise Refused(502, "this folder's meta.json is not JSON") from None
        if not isinstance(doc, dict):
            raise Refused(502, "this folder's meta.json is not an object")
        return doc

    @staticmethod
    def objects(meta: dict[str, Any]) -> list[dict[str, Any]]:
        return [o for o in meta.get("objects") or () if isinstance(o, dict) and isinstance(o.get("name"), str)]

    async def record(self, meta: dict[str, Any]) -> Any:
        """The page's extracted record (``extracted.json``'s ``record``), or None."""
        listed = {o["name"]: o for o in self.objects(meta)}
        if EXTRACTED_NAME not in listed:
            return None
        raw = await self._get(str(listed[EXTRACTED_NAME]["key"]))
        if raw is None:
            return None
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        return doc.get("record", doc) if isinstance(doc, dict) else doc

    async def download(self, folder: str, name: str) -> web.Response:
        """One file of the folder, as a download with its own type."""
        if not _FILE_NAME.match(name):
            raise Refused(400, "not a file name of an archive folder")
        meta = await self.meta(folder)
        listed = {o["name"]: o for o in self.objects(meta)}
        if name not in listed:
            raise Refused(404, f"{name} is not one of this page's files")
        obj = listed[name]
        data = await self._get(str(obj["key"]))
        if data is None:
            raise Refused(404, f"{name} is listed in meta.json but missing from the archive")
        headers = {**ARTIFACT_HEADERS, "Content-Disposition": f'attachment; filename="{name}"'}
        if obj.get("content_encoding") == "gzip":
            # Served as the gzip file it is stored as: nothing decompresses it into a page here.
            return web.Response(body=data, content_type="application/gzip", headers=headers)
        content_type = str(obj.get("content_type") or "application/octet-stream").split(";")[0].strip()
        if content_type.startswith("text/") or "html" in content_type or "xml" in content_type:
            content_type = "application/octet-stream"  # text a browser would render: a download only
        return web.Response(body=data, content_type=content_type, headers=headers)
