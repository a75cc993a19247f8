"""An object store (S3, GCS, Azure Blob) through obstore, Rust ``object_store``'s Python binding.

One backend for the three clouds: each cloud module (``s3``, ``clouds``) builds the obstore store
with that cloud's own credentials and hands it here. Uploads stream: the first part
(``part_size``) is read before an upload slot is taken, so slots are spent on the endpoint, not
on waiting for the source (NATS). An object that fits in one part is one PUT; a larger one is a
multipart upload (S3 and GCS multipart, Azure blocks) that holds one part in memory and
becomes visible only once complete, so a key never shows part of an object. Objects compressed by
the archive carry ``Content-Encoding: gzip`` beside their ``Content-Type``.

Failures, once open: what the store says of the object itself (a name too long, too large) is
``StorageRefused``, permanent; everything else (connection refused, timeouts, 5xx, refused
credentials, a missing bucket) is ``StorageUnavailable``: the ingester naks and the result waits.
Errors raised by the chunks being written pass through unchanged and nothing is stored.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, AsyncIterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import obstore
from obstore.exceptions import BaseError as ObstoreError
from obstore.exceptions import InvalidPathError, PermissionDeniedError, UnauthenticatedError

from busscrape.archive.storage.base import Storage
from busscrape.errors import AuthenticationFailed, ConfigurationError, StorageRefused, StorageUnavailable

if TYPE_CHECKING:
    from obstore.store import ClientConfig, ObjectStore, RetryConfig

# What the stores raise when they fail (obstore's own errors; a 404 is a FileNotFoundError). A
# key object_store cannot parse as a path is a ValueError, raised before anything is sent.
FAILURES = (ObstoreError, OSError, TimeoutError, ValueError)
# What a store says of the object itself: the same request will be refused again (dead-letter).
# Other refusals (AccessDenied, NoSuchBucket …) are the operator's to fix while the results wait.
REFUSAL_CODES = frozenset({"KeyTooLongError", "InvalidObjectName", "EntityTooLarge", "MetadataTooLarge",
                           "InvalidDigest", "RequestBodyTooLarge", "InvalidBlobOrBlock", "InvalidResourceName",
                           "OutOfRangeInput", "BlobTooLarge"})
AUTH_CODES = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
                        "ExpiredToken", "AuthenticationFailed", "AuthorizationFailure", "InvalidClientTokenId"})
MISSING_CODES = frozenset({"NoSuchBucket", "ContainerNotFound"})
_CODE = re.compile(r"<Code>(\w+)</Code>|\"reason\":\s*\"(\w+)\"")

# Quick retries of a busy server (503 SlowDown) inside one call; a store that stays down fails
# the call within seconds and the ingester naks with its own, longer backoff.
RETRY: RetryConfig = {"max_retries": 3, "retry_timeout": timedelta(seconds=10),
                      "backoff": {"init_backoff": timedelta(milliseconds=200), "max_backoff": timedelta(seconds=2),
                                  "base": 2}}


def client_options(*, allow_http: bool, root_certificate: str | None = None) -> ClientConfig:
    """HTTP settings every store shares: bounded connects and silences (a stalled endpoint turns
    into a retry, not a hung slot), and room for a large part on a slow link."""
    options: ClientConfig = {"connect_timeout": "10s", "timeout": "10m", "allow_http": allow_http}
    if root_certificate:
        options["root_certificate"] = root_certificate
    return options


def code_of(exc: BaseException) -> str | None:
    """The store's error code (``NoSuchBucket``, ``EntityTooLarge`` …) in a failure's text, if any."""
    found = _CODE.search(str(exc))
    return (found.group(1) or found.group(2)) if found else None


def describe(exc: BaseException) -> str:
    """A failure in one line: the store's code and message, without obstore's debug dump."""
    text = str(exc).split("\n\nDebug source:", 1)[0]
    message = re.search(r"<Message>(.*?)</Message>", text)
    code = code_of(exc)
    if code and message:
        return f"{code}: {message.group(1)}"
    return " ".join(text.split())[:400] or type(exc).__name__


class ObjectStorage(Storage):
    """A bucket or container, under an optional prefix, through an obstore store."""

    store: ObjectStore

    def __init__(self, url: str, *, part_size: int, max_uploads: int = 8) -> None:
        super().__init__(max_uploads=max_uploads)
        self.url = url
        self.part_size = part_size

    async def open(self) -> None:
        self.store = await self.build()
        try:
            await self._probe()
        except FAILURES as exc:
            if code_of(exc) in MISSING_CODES and await self.create_bucket():
                try:
                    await self._probe()
                    return
                except FAILURES as again:
                    exc = again
            raise self.at_start(exc) from None

    async def build(self) -> ObjectStore:
        """The obstore store, credentials resolved (a cloud module's own)."""
        raise NotImplementedError

    async def create_bucket(self) -> bool:
        """Create the missing bucket where the cloud allows it here; whether it did."""
        return False

    def at_start(self, exc: BaseException) -> ConfigurationError:
        """What a failure of the first request means: refused credentials (exit 3), or what to fix."""
        if isinstance(exc, UnauthenticatedError | PermissionDeniedError) or code_of(exc) in AUTH_CODES:
            return AuthenticationFailed(
                f"{self.url} refused the credentials ({describe(exc)}); {self.credentials_hint}")
        if code_of(exc) in MISSING_CODES:
            return ConfigurationError(f"{self.url}: the bucket or container does not exist ({describe(exc)}); "
                                      "create it, or fix --archive / BUSSCRAPE_ARCHIVE__URL")
        return ConfigurationError(f"cannot reach {self.where} ({describe(exc)}); start it, or fix {self.endpoint_hint}")

    @property
    def where(self) -> str:
        """The store in words, for messages at start."""
        return self.url

    credentials_hint = "check the credentials in the environment and that they may use the bucket"
    endpoint_hint = "the archive location (--archive, BUSSCRAPE_ARCHIVE__URL)"

    async def _probe(self) -> None:
        # A read of a key that is not there: it needs the endpoint, the credentials and the bucket
        # (a missing bucket answers NoSuchBucket, not a missing key), and every store and emulator has it.
        try:
            await obstore.get_async(self.store, ".busscrape-probe")
        except FileNotFoundError as exc:
            if code_of(exc) in MISSING_CODES:
                raise

    async def _put(self, key: str, chunks: AsyncIterable[bytes], *, content_type: str,
                   content_encoding: str | None, durable: bool) -> None:
        attributes: dict[str, Any] = {"Content-Type": content_type}
        if content_encoding:
            attributes["Content-Encoding"] = content_encoding
        source = aiter(chunks)
        first, rest = await _read_part(source, self.part_size)
        try:
            async with self.upload_slot:
                if rest is None:  # all of it fits in one part: one request
                    await obstore.put_async(self.store, key, first, attributes=attributes, use_multipart=False)
                else:
                    # One part in flight per object: memory stays near one part; concurrency comes
                    # from uploading several objects at once.
                    await obstore.put_async(self.store, key, _then(first, rest), attributes=attributes,
                                            use_multipart=True, chunk_size=self.part_size, max_concurrency=1)
        except FAILURES as exc:
            raise self.failure(f"cannot store {key} in {self.url}", exc, refusable=True) from None

    def failure(self, what: str, exc: BaseException, *, refusable: bool = False) -> StorageUnavailable | StorageRefused:
        if isinstance(exc, ValueError) and str(exc).startswith("Could not parse path"):
            return StorageRefused(f"{self.url} cannot hold the key: {what}: {describe(exc)}")
        if refusable and (isinstance(exc, InvalidPathError) or code_of(exc) in REFUSAL_CODES):
            return StorageRefused(f"{self.url} refused it: {what}: {describe(exc)}")
        return StorageUnavailable(f"{what}: {describe(exc)}", what=self.url)

    async def get(self, key: str) -> bytes | None:
        try:
            result = await obstore.get_async(self.store, key)
            return bytes(await result.bytes_async())
        except FileNotFoundError as exc:
            if code_of(exc) in MISSING_CODES:  # the bucket, not the key: an outage to wait out
                raise self.failure(f"cannot read {key} from {self.url}", exc) from None
            return None
        except FAILURES as exc:
            raise self.failure(f"cannot read {key} from {self.url}", exc) from None

    async def delete(self, key: str) -> None:
        try:
            await obstore.delete_async(self.store, key)
        except FileNotFoundError:
            pass  # Azure and GCS say so of a missing key; S3 does not
        except FAILURES as exc:
            raise self.failure(f"cannot delete {key} from {self.url}", exc) from None

    async def move(self, source: str, key: str) -> None:
        # A server-side copy keeps Content-Type and Content-Encoding; object stores have no rename.
        try:
            await obstore.copy_async(self.store, source, key)
            await obstore.delete_async(self.store, source)
        except FAILURES as exc:
            raise self.failure(f"cannot move {source} to {key} in {self.url}", exc) from None

    async def keys(self, prefix: str = "") -> list[str]:
        # object_store lists by whole path segments: list the prefix's folder, then match the rest.
        folder = prefix.rpartition("/")[0] or None
        try:
            found = [meta["path"] async for batch in obstore.list(self.store, prefix=folder) for meta in batch]
        except FAILURES as exc:
            raise self.failure(f"cannot list {self.url}/{prefix}", exc) from None
        return sorted(k for k in found if k.startswith(prefix))


async def _read_part(source: AsyncIterator[bytes], size: int) -> tuple[bytes, AsyncIterator[bytes] | None]:
    """The first ``size`` bytes (or all, when fewer) and what is left (``None``: nothing)."""
    buffer = bytearray()
    while len(buffer) < size:
        try:
            buffer += await anext(source)
        except StopAsyncIteration:
            return bytes(buffer), None
    return bytes(buffer), source


async def _then(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for chunk in rest:
        yield chunk
