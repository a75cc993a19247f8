"""S3 and S3-compatible storage (AWS, MinIO …), its credentials resolved by botocore.

Two forms. The fixed-key form, ``BUSSCRAPE_S3__ENDPOINT`` with ``BUSSCRAPE_S3__ACCESS_KEY`` and
``_SECRET_KEY`` (MinIO in compose), signs with those keys. Otherwise the credentials are AWS's
own chain, resolved by botocore exactly as the AWS CLI does: ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` with ``~/.aws/config`` and
``credentials``, ``AWS_ROLE_ARN`` + ``AWS_WEB_IDENTITY_TOKEN_FILE`` (EKS IRSA) through STS, the
container and instance metadata endpoints. Rust ``object_store``'s own chain has none of profiles
and reaches STS only at its fixed public endpoint; botocore honours ``AWS_ENDPOINT_URL_STS`` and
refreshes temporary credentials before they expire. The endpoint is ``BUSSCRAPE_S3__ENDPOINT``, else
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (or the profile's ``endpoint_url``), else AWS's.

Entering checks the bucket and creates it when missing (through botocore: ``object_store`` has no
bucket calls). The keys never appear in a message or a log.
"""

from __future__ import annotations

import asyncio
import os
import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from busscrape.archive.storage.objects import RETRY, ObjectStorage, client_options, describe
from busscrape.errors import ConfigurationError
from busscrape.net import tls
from busscrape.settings import S3Settings

if TYPE_CHECKING:
    import botocore.credentials
    from obstore.store import ObjectStore, S3Config, S3Credential

# How long obstore keeps temporary credentials before it asks again; botocore itself refreshes
# them well before they expire, so each ask returns ones valid for longer than this.
CREDENTIALS_TTL = timedelta(minutes=5)


def endpoint_of(cfg: S3Settings) -> tuple[str, bool]:
    """``host:port`` and whether to use TLS, from ``host:port`` or a URL."""
    endpoint = cfg.endpoint or ""
    if "://" in endpoint:
        parts = urlsplit(endpoint)
        return parts.netloc, parts.scheme == "https" or cfg.secure
    return endpoint.rstrip("/"), cfg.secure


class BotocoreCredentials:
    """obstore's credential provider over botocore's credentials (refreshed by botocore)."""

    def __init__(self, credentials: botocore.credentials.Credentials) -> None:
        self.credentials = credentials

    def __call__(self) -> S3Credential:
        from botocore.credentials import RefreshableCredentials

        frozen = self.credentials.get_frozen_credentials()
        temporary = isinstance(self.credentials, RefreshableCredentials)
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key, "token": frozen.token,
                "expires_at": datetime.now(UTC) + CREDENTIALS_TTL if temporary else None}


class S3Storage(ObjectStorage):
    """A bucket (``s3://bucket/prefix``) on AWS S3 or an S3-compatible endpoint."""

    def __init__(self, cfg: S3Settings, *, bucket: str | None = None, prefix: str = "", max_uploads: int = 8) -> None:
        self.cfg = cfg
        self.bucket = bucket or cfg.bucket
        self.prefix = prefix.strip("/")
        super().__init__(f"s3://{self.bucket}/{self.prefix}".rstrip("/"), part_size=cfg.part_size,
                         max_uploads=max_uploads)
        self.fixed_keys = cfg.access_key is not None and cfg.secret_key is not None
        self.endpoint: str | None = None
        self.provider: BotocoreCredentials | None = None
        """What signs the requests (set on entering)."""
        self._boto: dict[str, object] = {}

    @property
    def credentials_hint(self) -> str:  # type: ignore[override]
        if self.fixed_keys:
            return "check BUSSCRAPE_S3__ACCESS_KEY and BUSSCRAPE_S3__SECRET_KEY, and that they may use that bucket"
        return "check the AWS credentials in the environment (AWS_PROFILE, AWS_ACCESS_KEY_ID …) and the bucket's policy"

    @property
    def where(self) -> str:
        return f"S3 at {self.endpoint or 'AWS'} (bucket {self.bucket})"

    @property
    def endpoint_hint(self) -> str:  # type: ignore[override]
        return "BUSSCRAPE_S3__ENDPOINT or AWS_ENDPOINT_URL (unset, the archive goes to a local folder)"

    async def build(self) -> ObjectStore:
        # botocore reads files and may call STS or instance metadata: not on the event loop.
        return await asyncio.to_thread(self._build)

    def _build(self) -> ObjectStore:
        import boto3
        from obstore.store import S3Store

        cfg = self.cfg
        session = boto3.Session()
        region = cfg.region if "region" in cfg.model_fields_set or not session.region_name else session.region_name
        endpoint = _endpoint(cfg, session)
        secure = endpoint is None or endpoint.startswith("https://")
        if cfg.ca_file is not None and not secure:
            # A CA that is never used would leave the archive on plain HTTP without a word.
            raise ConfigurationError(
                f"BUSSCRAPE_S3__CA_FILE is set but TLS is off for {endpoint}: set BUSSCRAPE_S3__SECURE=true "
                "(or an https:// BUSSCRAPE_S3__ENDPOINT), or unset BUSSCRAPE_S3__CA_FILE")
        if cfg.ca_file is not None:
            tls.client_context(cfg.ca_file, "BUSSCRAPE_S3__CA_FILE")  # unreadable or not PEM: say so now
        self.endpoint = endpoint
        config: S3Config = {"region": region}
        if endpoint:
            config["endpoint"] = endpoint
        options = client_options(allow_http=not secure,
                                 root_certificate=cfg.ca_file.read_text() if cfg.ca_file else None)
        self._boto = {"region_name": region, "endpoint_url": endpoint,
                      "verify": str(cfg.ca_file) if cfg.ca_file else None}
        if self.fixed_keys:
            assert cfg.access_key is not None and cfg.secret_key is not None
            keys = {"access_key_id": cfg.access_key.get_secret_value(),
                    "secret_access_key": cfg.secret_key.get_secret_value()}
            self._boto |= {"aws_access_key_id": keys["access_key_id"],
                           "aws_secret_access_key": keys["secret_access_key"]}
            provider = BotocoreCredentials(_static(keys["access_key_id"], keys["secret_access_key"]))
        else:
            credentials = session.get_credentials()
            if credentials is None:
                raise ConfigurationError(
                    f"no credentials for {self.url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
                    "or AWS_ROLE_ARN with AWS_WEB_IDENTITY_TOKEN_FILE (or run where instance metadata answers); "
                    "or the fixed-key form BUSSCRAPE_S3__ACCESS_KEY and BUSSCRAPE_S3__SECRET_KEY")
            self._boto["session"] = session
            provider = BotocoreCredentials(credentials)
        self.provider = provider
        return S3Store(self.bucket, prefix=self.prefix or None, config=config, client_options=options,
                       retry_config=RETRY, credential_provider=provider)

    async def open(self) -> None:
        try:
            await super().open()
        except ConfigurationError:
            raise
        except Exception as exc:  # botocore resolving credentials (STS, a profile, metadata)
            if not type(exc).__module__.startswith("botocore"):
                raise
            raise self.at_start(exc) from None

    def at_start(self, exc: BaseException) -> ConfigurationError:
        """Exit 2 with what to fix when TLS is the cause: the CA to trust, or TLS itself."""
        text = str(exc)
        certificate = re.search(r"InvalidCertificate\(\s*(\w+)", text)
        if certificate:
            trusted = f"now {self.cfg.ca_file}" if self.cfg.ca_file else "now the system's CAs"
            return ConfigurationError(
                f"TLS verification of {self.where} failed ({certificate.group(1)}): set BUSSCRAPE_S3__CA_FILE to the "
                f"CA that signed its certificate ({trusted}), or use the host name the certificate was issued for in "
                "BUSSCRAPE_S3__ENDPOINT")
        if self.endpoint and self.endpoint.startswith("http://") and "IncompleteMessage" in text:
            return ConfigurationError(f"cannot reach {self.where} ({describe(exc)}): if it serves HTTPS, set "
                                      "BUSSCRAPE_S3__SECURE=true (or an https:// BUSSCRAPE_S3__ENDPOINT)")
        return super().at_start(exc)

    async def create_bucket(self) -> bool:
        await asyncio.to_thread(self._create_bucket)
        return True

    def _create_bucket(self) -> None:
        import boto3
        from botocore.exceptions import ClientError

        options = dict(self._boto)
        session = options.pop("session", None) or boto3.Session()
        assert isinstance(session, boto3.Session)
        client = session.client("s3", **options)
        region = options["region_name"]
        extra = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
        try:
            client.create_bucket(Bucket=self.bucket, **extra)
        except ClientError as exc:  # another ingester won the race: fine
            if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise


def _endpoint(cfg: S3Settings, session: object) -> str | None:
    """The endpoint URL: the fixed-key form's, else AWS's standard variables or profile, else none (AWS)."""
    if cfg.endpoint:
        host, secure = endpoint_of(cfg)
        return f"{'https' if secure else 'http'}://{host}"
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if os.environ.get(name):
            return os.environ[name].rstrip("/")
    profile = getattr(session, "_session", None)
    scoped = profile.get_scoped_config() if profile is not None else {}
    url = scoped.get("endpoint_url") or (scoped.get("s3") or {}).get("endpoint_url")
    return str(url).rstrip("/") if url else None


def _static(access_key: str, secret_key: str) -> botocore.credentials.Credentials:
    from botocore.credentials import Credentials

    return Credentials(access_key, secret_key)
