"""Where the archive is written: the ``Storage`` interface (``base``) and its backends, a local
folder (``local``) and object stores through obstore (``objects``): S3 (``s3``), GCS and Azure
Blob (``clouds``), each imported only when chosen. ``open_storage`` picks one from the archive's
location; the interface imports no backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from busscrape.archive.storage.base import Storage
from busscrape.errors import ConfigurationError

if TYPE_CHECKING:
    from busscrape.settings import Settings

__all__ = ["CLOUD_SCHEMES", "Storage", "location_of", "open_storage"]

CLOUD_SCHEMES = ("s3", "gs", "az")


def location_of(settings: Settings, archive: Path | str | None = None) -> str:
    """Where the archive is: ``archive`` if given, else ``BUSSCRAPE_ARCHIVE__URL``, else the
    fixed-key S3 bucket when ``BUSSCRAPE_S3__ENDPOINT`` is set, else the local archive folder."""
    chosen = str(archive) if archive is not None else settings.archive.url
    if chosen:
        return chosen
    if settings.s3.endpoint:
        return f"s3://{settings.s3.bucket}"
    return str(settings.archive_dir())


def open_storage(settings: Settings, archive: Path | str | None = None) -> Storage:
    """The storage at the archive's location (``location_of``), not yet entered."""
    where = location_of(settings, archive)
    uploads, part_size = settings.ingester.upload_concurrency, settings.s3.part_size
    parts = urlsplit(where)
    scheme = parts.scheme.lower()
    if scheme in CLOUD_SCHEMES:
        if not parts.netloc:
            raise ConfigurationError(f"archive location {where!r}: no bucket or container ({scheme}://NAME/prefix)")
        prefix = parts.path.strip("/")
        if scheme == "s3":
            from busscrape.archive.storage.s3 import S3Storage

            return S3Storage(settings.s3, bucket=parts.netloc, prefix=prefix, max_uploads=uploads)
        from busscrape.archive.storage.clouds import AzureStorage, GCSStorage

        cloud = GCSStorage if scheme == "gs" else AzureStorage
        return cloud(parts.netloc, prefix, part_size=part_size, max_uploads=uploads)
    if scheme not in ("", "file") and len(scheme) > 1:  # (a Windows drive letter is not a scheme)
        raise ConfigurationError(f"archive location {where!r}: unknown scheme {scheme!r} "
                                 "(s3://, gs://, az://, file:// or a folder)")
    from busscrape.archive.storage.local import FileStorage

    return FileStorage(Path(where.removeprefix("file://")).expanduser(), max_uploads=uploads)
