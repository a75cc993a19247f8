"""S3-compatible storage (MinIO first) through miniopy-async.

Uploads stream: the chunks are read part by part (``part_size``, 16 MiB by default), so an
upload holds at most one part in memory whatever the object weighs. The first part is read
before an upload slot is taken, so that slots are spent on the endpoint, not on waiting for
the source. An object that fits in one part is one PUT; a larger one is a multipart upload,
aborted if anything fails before it is complete, so a key never shows part of an object. Objects
compressed by the archive carry ``Content-Encoding: gzip`` beside the original ``Content-Type``.

Entering checks the endpoint and creates the bucket when missing: an endpoint that does not
answer is a ``ConfigurationError`` (exit 2), and so is one whose TLS certificate does not verify
against ``BUSSCRAPE_S3__CA_FILE`` (or the system's CAs); refused credentials are
``AuthenticationFailed`` (exit 3). After that every failure is ``StorageUnavailable``: the
ingester naks and retries. The keys come from the settings only and never appear in a message.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterable, AsyncIterator
from typing import BinaryIO, cast
from urllib.parse import urlsplit

import aiohttp
from aiohttp_retry import ExponentialRetry, RetryClient
from miniopy_async.api import Minio
from miniopy_async.commonconfig import CopySource
from miniopy_async.error import MinioException, S3Error
from miniopy_async.helpers import DictType

from busscrape.archive.storage.base import Storage
from busscrape.errors import (
    AuthenticationFailed,
    BusscrapeError,
    ConfigurationError,
    StorageRefused,
    StorageUnavailable,
)
from busscrape.net import tls
from busscrape.settings import S3Settings

# What an unreachable or failing endpoint raises (connection refused/reset, timeouts, 5xx …).
_FAILURES = (MinioException, aiohttp.ClientError, OSError, TimeoutError, ValueError)
_AUTH_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
               "AuthorizationHeaderMalformed"}
_EXISTS_CODES = {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}
# What S3 says of the object itself: the same request will be refused again (dead-letter). Other
# refusals (AccessDenied, NoSuchBucket …) are the operator's to fix while the results wait.
_REFUSAL_CODES = {"KeyTooLongError", "InvalidObjectName", "InvalidArgument", "EntityTooLarge",
                  "MetadataTooLarge", "InvalidDigest", "InvalidRequest"}
# A stalled endpoint must turn into a retry, not hang a slot: bound connects and silences.
_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=10, sock_connect=10, sock_read=120)


def endpoint_of(cfg: S3Settings) -> tuple[str, bool]:
    """``host:port`` and whether to use TLS, from ``host:port`` or a URL."""
    endpoint = cfg.endpoint or ""
    if "://" in endpoint:
        parts = urlsplit(endpoint)
        return parts.netloc, parts.scheme == "https" or cfg.secure
    return endpoint.rstrip("/"), cfg.secure


class S3Storage(Storage):
    """A bucket on an S3-compatible endpoint."""

    def __init__(self, cfg: S3Settings, *, max_uploads: int = 8) -> None:
        super().__init__(max_uploads=max_uploads)
        self.cfg = cfg
        self.endpoint, self.secure = endpoint_of(cfg)
        self.bucket = cfg.bucket
        self.part_size = cfg.part_size
        self.url = f"s3://{self.bucket}"
        self._client: Minio | None = None

    @property
    def client(self) -> Minio:
        if self._client is None:
            raise RuntimeError("enter the S3Storage (async with) before using it")
        return self._client

    async def open(self) -> None:
        cfg = self.cfg
        if cfg.ca_file is not None and not self.secure:
            # A CA that is never used would leave the archive on plain HTTP without a word.
            raise ConfigurationError(
                f"BUSSCRAPE_S3__CA_FILE is set but TLS is off for {self.endpoint}: set BUSSCRAPE_S3__SECURE=true "
                "(or an https:// BUSSCRAPE_S3__ENDPOINT), or unset BUSSCRAPE_S3__CA_FILE"
            )
        context = tls.client_context(cfg.ca_file, "BUSSCRAPE_S3__CA_FILE")
        # Room for every upload plus the small reads and deletes beside them.
        connector = aiohttp.TCPConnector(limit=self.max_uploads + 4, ssl=context if self.secure else False)
        session = RetryClient(
            # auto_decompress off: get() returns the stored bytes, gzip or not (what meta.json hashes).
            aiohttp.ClientSession(connector=connector, timeout=_TIMEOUT, auto_decompress=False),
            # Quick retries of a busy server (503 SlowDown); an endpoint that is down fails at once
            # and the message is nak'ed with the ingester's own, longer backoff.
            retry_options=ExponentialRetry(attempts=3, start_timeout=0.2, statuses={500, 502, 503, 504}),
        )
        self._client = Minio(
            self.endpoint,
            access_key=cfg.access_key.get_secret_value() if cfg.access_key else None,
            secret_key=cfg.secret_key.get_secret_value() if cfg.secret_key else None,
            secure=self.secure,
            region=cfg.region,
            session=session,
        )
        try:
            await self._ensure_bucket()
        except BaseException:
            await self.close()
            raise

    async def _ensure_bucket(self) -> None:
        where = f"S3 at {'https' if self.secure else 'http'}://{self.endpoint}"
        try:
            if await self.client.bucket_exists(self.bucket):
                return
            try:
                await self.client.make_bucket(self.bucket)
            except S3Error as exc:
                if exc.code not in _EXISTS_CODES:  # another ingester won the race: fine
                    raise
        except S3Error as exc:
            if exc.code in _AUTH_CODES:
                raise AuthenticationFailed(
                    f"{where} refused the credentials for bucket {self.bucket} ({exc.code}); check "
                    "BUSSCRAPE_S3__ACCESS_KEY and BUSSCRAPE_S3__SECRET_KEY, and that they may use that bucket"
                ) from None
            raise ConfigurationError(f"{where}: cannot use bucket {self.bucket} ({exc.code}: {exc.message})") from None
        # Before ValueError: a certificate that does not verify is one too (ssl.CertificateError).
        except (aiohttp.ClientSSLError, ssl.SSLError) as exc:
            raise _tls_failure(self.cfg, where, exc) from None
        except ValueError as exc:  # miniopy-async checks names before it sends anything
            raise ConfigurationError(f"BUSSCRAPE_S3__BUCKET {self.bucket!r}: {exc}") from None
        except _FAILURES as exc:
            hint = ("; if it serves HTTPS, set BUSSCRAPE_S3__SECURE=true"
                    if not self.secure and isinstance(exc, aiohttp.ServerDisconnectedError) else "")
            raise ConfigurationError(
                f"cannot reach {where} ({exc!r}{hint}); start it, or fix BUSSCRAPE_S3__ENDPOINT (unset, the archive "
                "goes to a local folder)"
            ) from None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close_session()
            self._client = None

    async def _put(self, key: str, chunks: AsyncIterable[bytes], *, content_type: str,
                   content_encoding: str | None, durable: bool) -> None:
        headers: DictType | None = {"Content-Encoding": content_encoding} if content_encoding else None
        reader = _Reader(chunks)
        # Read the first part before taking an upload slot: the source's latency (NATS) is then
        # not paid while holding a slot, so the slots keep the endpoint busy. An object that fits
        # in one part goes up in one request once it is all here.
        await reader.fill(self.part_size)
        try:
            async with self.upload_slot:
                await self.client.put_object(
                    # Typed BinaryIO, but miniopy-async awaits what read() returns when it is a coroutine.
                    self.bucket, key, cast(BinaryIO, reader), length=-1, part_size=self.part_size,
                    content_type=content_type, metadata=headers,
                    # One part in flight per object: memory stays at one part; concurrency comes from
                    # uploading several objects at once.
                    num_parallel_uploads=1,
                )
        except BusscrapeError:
            raise  # the source failed (artifact gone, checksum): not a storage problem
        except S3Error as exc:
            if exc.code in _REFUSAL_CODES:
                raise StorageRefused(f"{self.url} refused {key}: {_describe(exc)}") from None
            raise StorageUnavailable(f"cannot store {key} in {self.url}: {_describe(exc)}") from None
        except _FAILURES as exc:
            raise StorageUnavailable(f"cannot store {key} in {self.url}: {_describe(exc)}") from None

    async def get(self, key: str) -> bytes | None:
        try:
            response = await self.client.get_object(self.bucket, key)
            try:
                body: bytes = await response.read()
                return body
            finally:
                response.release()
        except S3Error as exc:
            if exc.code == "NoSuchKey":
                return None
            raise StorageUnavailable(f"cannot read {key} from {self.url}: {_describe(exc)}") from None
        except _FAILURES as exc:
            raise StorageUnavailable(f"cannot read {key} from {self.url}: {_describe(exc)}") from None

    async def delete(self, key: str) -> None:
        try:
            await self.client.remove_object(self.bucket, key)
        except _FAILURES as exc:
            raise StorageUnavailable(f"cannot delete {key} from {self.url}: {_describe(exc)}") from None

    async def move(self, source: str, key: str) -> None:
        # A server-side copy keeps Content-Type and Content-Encoding; S3 has no rename.
        try:
            await self.client.copy_object(self.bucket, key, CopySource(self.bucket, source))
            await self.client.remove_object(self.bucket, source)
        except _FAILURES as exc:
            raise StorageUnavailable(f"cannot move {source} to {key} in {self.url}: {_describe(exc)}") from None

    async def keys(self, prefix: str = "") -> list[str]:
        try:
            listing = self.client.list_objects(self.bucket, prefix=prefix or None, recursive=True)
            return sorted([obj.object_name async for obj in listing if obj.object_name])
        except _FAILURES as exc:
            raise StorageUnavailable(f"cannot list {self.url}/{prefix}: {_describe(exc)}") from None


def _tls_failure(cfg: S3Settings, where: str, exc: BaseException) -> ConfigurationError:
    """Exit 2 with what to fix: the CA to trust, or TLS itself (an endpoint that speaks plain HTTP)."""
    cause = getattr(exc, "certificate_error", None) or getattr(exc, "os_error", None) or exc
    if isinstance(cause, ssl.SSLCertVerificationError):
        trusted = f"now {cfg.ca_file}" if cfg.ca_file else "now the system's CAs"
        return ConfigurationError(
            f"TLS verification of {where} failed ({tls.reason(cause)}): set BUSSCRAPE_S3__CA_FILE to the CA that "
            f"signed its certificate ({trusted}), or use the host name the certificate was issued for in "
            "BUSSCRAPE_S3__ENDPOINT"
        )
    return ConfigurationError(
        f"TLS with {where} failed ({tls.reason(cause)}); check that the endpoint serves HTTPS (else set "
        "BUSSCRAPE_S3__SECURE=false) and BUSSCRAPE_S3__CA_FILE"
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, S3Error):
        return f"{exc.code}: {exc.message}"
    return str(exc) or type(exc).__name__


class _Reader:
    """The file-like ``read(size)`` miniopy-async expects, over an async iterator of chunks."""

    def __init__(self, chunks: AsyncIterable[bytes]) -> None:
        self._chunks: AsyncIterator[bytes] = aiter(chunks)
        self._buffer = bytearray()
        self._done = False

    async def fill(self, size: int) -> None:
        """Buffer at least ``size`` bytes, or everything that is left."""
        while not self._done and (size < 0 or len(self._buffer) < size):
            try:
                self._buffer += await anext(self._chunks)
            except StopAsyncIteration:
                self._done = True

    async def read(self, size: int = -1) -> bytes:
        await self.fill(size)
        count = len(self._buffer) if size < 0 else min(size, len(self._buffer))
        out = bytes(self._buffer[:count])
        del self._buffer[:count]
        return out
