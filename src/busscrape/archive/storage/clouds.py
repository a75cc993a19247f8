"""Google Cloud Storage (``gs://bucket/prefix``) and Azure Blob (``az://container/prefix``).

Credentials and endpoints come from each cloud's standard environment, read by Rust
``object_store`` itself: for GCS ``GOOGLE_APPLICATION_CREDENTIALS`` (a service-account or
authorized-user file), ``GOOGLE_SERVICE_ACCOUNT`` …, else the metadata server (GKE workload
identity); for Azure ``AZURE_STORAGE_ACCOUNT_NAME`` with ``AZURE_STORAGE_ACCOUNT_KEY`` or a SAS or a
service principal (``AZURE_CLIENT_ID`` / ``_SECRET`` / ``AZURE_TENANT_ID``), a federated token file
(AKS workload identity) or managed identity. Added here, the variables the clouds' own SDKs honour
that ``object_store`` does not: ``STORAGE_EMULATOR_HOST`` (a GCS emulator, no credentials) and
``AZURE_STORAGE_CONNECTION_STRING`` (its ``AccountName``, ``AccountKey`` and ``BlobEndpoint``, as
Azurite prints it). Buckets and containers are not created: a missing one stops the process at
start with its name.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from busscrape.archive.storage.objects import RETRY, ObjectStorage, client_options

if TYPE_CHECKING:
    from obstore.store import AzureConfig, GCSConfig, GCSCredential, ObjectStore


class GCSStorage(ObjectStorage):
    """A Google Cloud Storage bucket."""

    credentials_hint = "check GOOGLE_APPLICATION_CREDENTIALS (or the workload's service account) and the bucket's IAM"
    endpoint_hint = "--archive / BUSSCRAPE_ARCHIVE__URL (or STORAGE_EMULATOR_HOST)"

    def __init__(self, bucket: str, prefix: str = "", *, part_size: int, max_uploads: int = 8) -> None:
        self.bucket, self.prefix = bucket, prefix.strip("/")
        super().__init__(f"gs://{bucket}/{self.prefix}".rstrip("/"), part_size=part_size, max_uploads=max_uploads)

    async def build(self) -> ObjectStore:
        from obstore.store import GCSStore

        config: GCSConfig = {}
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if not emulator:
            return GCSStore(self.bucket, prefix=self.prefix or None, client_options=client_options(allow_http=False),
                            retry_config=RETRY)
        # An emulator takes no credentials: a placeholder token, as Google's own SDKs send it one.
        config["base_url"] = emulator if "://" in emulator else f"http://{emulator}"
        return GCSStore(self.bucket, prefix=self.prefix or None, config=config,
                        client_options=client_options(allow_http=config["base_url"].startswith("http://")),
                        retry_config=RETRY, credential_provider=_emulator_token)


def _emulator_token() -> GCSCredential:
    return {"token": "emulator", "expires_at": None}


class AzureStorage(ObjectStorage):
    """An Azure Blob Storage container."""

    credentials_hint = "check AZURE_STORAGE_ACCOUNT_NAME and its key, SAS or identity, and the container's roles"
    endpoint_hint = "--archive / BUSSCRAPE_ARCHIVE__URL (or AZURE_STORAGE_CONNECTION_STRING)"

    def __init__(self, container: str, prefix: str = "", *, part_size: int, max_uploads: int = 8) -> None:
        self.container, self.prefix = container, prefix.strip("/")
        super().__init__(f"az://{container}/{self.prefix}".rstrip("/"), part_size=part_size,
                         max_uploads=max_uploads)

    async def build(self) -> ObjectStore:
        from obstore.store import AzureStore

        config = connection_string(os.environ.get("AZURE_STORAGE_CONNECTION_STRING", ""))
        insecure = config.get("endpoint", "https://").startswith("http://") or bool(config.get("use_emulator"))
        return AzureStore(self.container, prefix=self.prefix or None, config=config,
                          client_options=client_options(allow_http=insecure), retry_config=RETRY)


def connection_string(text: str) -> AzureConfig:
    """What obstore needs from an Azure Storage connection string (``Key=value;…``)."""
    fields = dict(part.split("=", 1) for part in text.split(";") if "=" in part)
    config: AzureConfig = {}
    if fields.get("UseDevelopmentStorage", "").lower() == "true":
        config["use_emulator"] = True
    if "AccountName" in fields:
        config["account_name"] = fields["AccountName"]
    if "AccountKey" in fields:
        config["account_key"] = fields["AccountKey"]
    if "SharedAccessSignature" in fields:
        config["sas_key"] = fields["SharedAccessSignature"]
    if "BlobEndpoint" in fields:
        config["endpoint"] = fields["BlobEndpoint"].rstrip("/")
    return config
