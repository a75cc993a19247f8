"""The ARTIFACTS object store: page bytes between worker and ingester (the claim check).

Objects use NATS's own object-store layout (``$O.ARTIFACTS.C.<nuid>`` chunks, a rolled-up
``$O.ARTIFACTS.M.<name>`` meta message), so ``nats object get ARTIFACTS …`` reads them too.
This module writes it directly rather than through nats-py's ``ObjectStore`` because that one
publishes chunk after chunk, each waiting for its ack, and reads whole objects into memory:
here chunks are pipelined and reads are streamed, chunk by chunk, with the digest checked
at the end.

Object names are ``<task_id>/<task_seq>/<attempt>/<file>``: a retry never overwrites the bytes
another attempt's result may point to.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import nats.errors
import nats.js.errors
import orjson
from nats.js import JetStreamContext

from .errors import ArtifactUnusable, StorageUnavailable
from .messages import ArtifactRef
from .subjects import ARTIFACTS_BUCKET, ARTIFACTS_STREAM

CHUNK_SIZE = 256 * 1024
_WINDOW = 16  # chunks in flight per object
_ROLLUP = {"Nats-Rollup": "sub"}


def object_name(task_id: str, task_seq: int, attempt: int, file: str) -> str:
    return f"{task_id}/{task_seq}/{attempt}/{file}"


def _meta_subject(name: str) -> str:
    return f"$O.{ARTIFACTS_BUCKET}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"


def _chunk_subject(nuid: str) -> str:
    return f"$O.{ARTIFACTS_BUCKET}.C.{nuid}"


class ArtifactStore:
    """Put, stream and delete artifacts in the ARTIFACTS bucket."""

    def __init__(self, js: JetStreamContext) -> None:
        self._js = js
        self._nc = js._nc  # for NUIDs, as nats-py's object store does

    async def put(self, name: str, data: bytes, content_type: str, *, kind: str, file: str) -> ArtifactRef:
        """Store ``data`` under ``name`` and return its claim check.

        Raises ``StorageUnavailable`` when NATS does not take it (the task is retried).
        """
        nuid = self._nc._nuid.next().decode()
        chunk_subject = _chunk_subject(nuid)
        digest = hashlib.sha256(data).digest()
        view = memoryview(data)
        try:
            pending: set[asyncio.Future] = set()
            chunks = 0
            for offset in range(0, len(data), CHUNK_SIZE):
                if len(pending) >= _WINDOW:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for fut in done:
                        fut.result()
                pending.add(await self._js.publish_async(chunk_subject, bytes(view[offset:offset + CHUNK_SIZE])))
                chunks += 1
            for fut in asyncio.as_completed(pending):
                await fut
            info = {
                "name": name,
                "bucket": ARTIFACTS_BUCKET,
                "nuid": nuid,
                "size": len(data),
                "chunks": chunks,
                "mtime": datetime.now(UTC).isoformat(),
                "digest": "SHA-256=" + base64.urlsafe_b64encode(digest).decode(),
                "headers": {"Content-Type": [content_type]},
                "options": {"max_chunk_size": CHUNK_SIZE},
            }
            await self._js.publish(_meta_subject(name), orjson.dumps(info), headers=dict(_ROLLUP))
        except (TimeoutError, nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            await self._purge_quietly(chunk_subject)
            raise StorageUnavailable(f"cannot store artifact {name} in {ARTIFACTS_BUCKET}: {exc!r}") from None
        return ArtifactRef(name=file, kind=kind, object=name, size=len(data), sha256=digest.hex(),  # type: ignore[arg-type]
                           content_type=content_type)

    async def _info(self, name: str) -> dict | None:
        try:
            msg = await self._js.get_last_msg(ARTIFACTS_STREAM, _meta_subject(name))
        except nats.js.errors.NotFoundError:
            return None
        info = orjson.loads(msg.data)
        return None if info.get("deleted") else info

    async def exists(self, ref: ArtifactRef) -> bool:
        return await self._info(ref.object) is not None

    async def stream(self, ref: ArtifactRef) -> AsyncIterator[bytes]:
        """Yield the object's bytes chunk by chunk; the sha256 and size are checked at the end.

        Raises ``ArtifactUnusable`` when the object is gone or does not match its claim check
        (dead-letter), ``StorageUnavailable`` when NATS does not answer (retry).
        """
        try:
            info = await self._info(ref.object)
        except (TimeoutError, nats.errors.Error, nats.js.errors.Error, OSError) as exc:
            raise StorageUnavailable(f"cannot read artifact {ref.object}: {exc!r}") from None
        if info is None:
            raise ArtifactUnusable(f"artifact {ref.object} is not in {ARTIFACTS_BUCKET} (expired or deleted)",
                                   reason="artifact_missing")
        digest = hashlib.sha256()
        size = 0
        if info.get("size", 0) > 0:
            sub = await self._js.subscribe(_chunk_subject(info["nuid"]), ordered_consumer=True)
            try:
                while size < info["size"]:
                    try:
                        msg = await sub.next_msg(timeout=30)
                    except nats.errors.TimeoutError:
                        raise StorageUnavailable(f"artifact {ref.object}: chunks stopped arriving") from None
                    digest.update(msg.data)
                    size += len(msg.data)
                    yield msg.data
            finally:
                await sub.unsubscribe()
        if size != ref.size or digest.hexdigest() != ref.sha256:
            raise ArtifactUnusable(
                f"artifact {ref.object} fails its checksum: {size} bytes sha256 {digest.hexdigest()[:16]}…, "
                f"expected {ref.size} bytes sha256 {ref.sha256[:16]}…",
                reason="artifact_checksum_mismatch",
            )

    async def read(self, ref: ArtifactRef) -> bytes:
        """The whole object (for small artifacts and tests)."""
        return b"".join([chunk async for chunk in self.stream(ref)])

    async def delete(self, name: str) -> None:
        """Delete an object (idempotent: a missing one is fine)."""
        info = await self._info(name)
        if info is None:
            return
        tombstone = {**info, "deleted": True, "size": 0, "chunks": 0, "digest": "", "mtime": ""}
        await self._js.publish(_meta_subject(name), orjson.dumps(tombstone), headers=dict(_ROLLUP))
        await self._purge_quietly(_chunk_subject(info["nuid"]))

    async def _purge_quietly(self, subject: str) -> None:
        try:
            await self._js.purge_stream(ARTIFACTS_STREAM, subject=subject)
        except (TimeoutError, nats.errors.Error, nats.js.errors.Error, OSError):
            pass  # the bucket's TTL collects what is left
