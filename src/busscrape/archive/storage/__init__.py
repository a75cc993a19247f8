"""Where the archive is written: the ``Storage`` interface (``base``) and its backends, a local
folder (``local``) and S3 (``s3``, imported only when an endpoint is configured). ``open_storage``
picks one from the settings; the interface imports no backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from busscrape.archive.storage.base import Storage

if TYPE_CHECKING:
    from busscrape.settings import Settings

__all__ = ["Storage", "open_storage"]


def open_storage(settings: Settings, archive_dir: Path | str | None = None) -> Storage:
    """The configured storage (not yet entered): ``archive_dir`` if given, else S3 when an
    endpoint is set, else the local archive folder."""
    uploads = settings.ingester.upload_concurrency
    if archive_dir is None and settings.s3.endpoint:
        from busscrape.archive.storage.s3 import S3Storage

        return S3Storage(settings.s3, max_uploads=uploads)
    folder = str(archive_dir) if archive_dir is not None else str(settings.archive_dir())
    if folder.startswith("file://"):
        folder = folder.removeprefix("file://")
    from busscrape.archive.storage.local import FileStorage

    return FileStorage(Path(folder).expanduser(), max_uploads=uploads)
