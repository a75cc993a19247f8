"""The settings object, read from ``BUSSCRAPE_*`` variables, and handed to child processes the same way.

Values come from (highest first) CLI flags, ``BUSSCRAPE_*`` environment variables (sections
nested with ``__``: ``BUSSCRAPE_NATS__URL``, ``BUSSCRAPE_WORKER__CONCURRENCY``), a ``.env`` file,
then the defaults.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from busscrape.settings.sections import (
    ApiSettings,
    ArchiveSettings,
    BrowserSettings,
    DispatchSettings,
    ExtractSettings,
    IngesterSettings,
    NatsSettings,
    NetworkPolicySettings,
    ProxySettings,
    S3Settings,
    SearchSettings,
    StreamSettings,
    TelemetrySettings,
    WorkerSettings,
)


class Settings(BaseSettings):
    """Everything configurable, from ``BUSSCRAPE_*`` variables (nested with ``__``)."""

    model_config = SettingsConfigDict(
        env_prefix="BUSSCRAPE_",
        env_nested_delimiter="__",
        env_file=".env",
        env_parse_none_str="none",  # BUSSCRAPE_TELEMETRY__HTTP_PORT=none turns it off
        extra="ignore",
        validate_default=True,
    )

    state_dir: Path = Path(".busscrape")
    """Local state of the embedded default: nats-server store, archive, logs."""
    nats: NatsSettings = NatsSettings()
    streams: StreamSettings = StreamSettings()
    dispatch: DispatchSettings = DispatchSettings()
    browser: BrowserSettings = BrowserSettings()
    # Made per Settings, not once at import: their default names carry the process id.
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    extract: ExtractSettings = ExtractSettings()
    network: NetworkPolicySettings = NetworkPolicySettings()
    proxy: ProxySettings = ProxySettings()
    s3: S3Settings = S3Settings()
    archive: ArchiveSettings = ArchiveSettings()
    ingester: IngesterSettings = Field(default_factory=IngesterSettings)
    search: SearchSettings = SearchSettings()
    api: ApiSettings = ApiSettings()
    telemetry: TelemetrySettings = TelemetrySettings()

    @field_validator("state_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    def archive_dir(self) -> Path:
        """The local archive folder (used when no S3 endpoint is set)."""
        return self.archive.dir or self.state_dir / "archive"

    def search_path(self) -> Path:
        """The SQLite search index file."""
        return self.search.sqlite_path or self.state_dir / "search.sqlite3"

    def with_overrides(self, **sections: dict[str, object]) -> Settings:
        """A copy with some fields replaced, re-validated (how CLI flags win over env).

        Only what was set is carried over, so the copy still knows which values are defaults
        (``model_fields_set``: a default telemetry port gives way, a chosen one does not).
        """
        data = self.model_dump(exclude_unset=True)
        for section, values in sections.items():
            clean = {k: v for k, v in values.items() if v is not None}
            if isinstance(getattr(self, section, None), BaseModel):
                data.setdefault(section, {}).update(clean)
            elif clean:
                raise KeyError(section)
        # model_dump keeps SecretStr objects in python mode, so secrets survive the copy.
        return Settings.model_validate(data)


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a child process exactly ``settings`` (secrets included).

    Each section travels as one JSON variable (``BUSSCRAPE_WORKER='{"concurrency": 2, …}'``);
    the rest of the parent's environment is kept, its other ``BUSSCRAPE_*`` variables dropped.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUSSCRAPE_")}
    for name in Settings.model_fields:
        value = getattr(settings, name)
        if isinstance(value, BaseModel):
            data = value.model_dump(mode="json", context={"reveal_secrets": True})
            for field_name, field_value in value:
                if isinstance(field_value, SecretStr):
                    data[field_name] = field_value.get_secret_value()
            env[f"BUSSCRAPE_{name.upper()}"] = json.dumps(data)
        else:
            env[f"BUSSCRAPE_{name.upper()}"] = str(value)
    return env
