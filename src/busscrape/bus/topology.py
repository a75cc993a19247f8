"""Reads the declarative definitions in ``streams/`` and renders them with the settings.

One TOML file per stream, consumer, key-value bucket or object store. Field names are
JetStream's own (as in ``nats stream info --json``), durations and sizes may be human
(``7d``, ``1MiB``), and a value written ``"{streams.<field>}"`` is taken from the settings, so
the knobs an operator turns live in one place (``BUSSCRAPE_STREAMS__*``).

Key-value buckets and object stores are JetStream streams underneath (``KV_<bucket>``,
``OBJ_<bucket>``); they are described here by their bucket fields and compared as streams.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass
from enum import Enum
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from nats.js import api

from busscrape.bus import names
from busscrape.errors import ConfigurationError
from busscrape.settings import Settings
from busscrape.units import parse_duration, parse_size

Kind = Literal["stream", "consumer", "kv", "object_store"]

# Apply order: buckets before the streams that source them, streams before their consumers.
_ORDER: dict[str, int] = {"kv": 0, "object_store": 1, "stream": 2, "consumer": 3}

_DURATIONS = {"max_age", "duplicate_window", "ack_wait", "ttl", "inactive_threshold", "idle_heartbeat"}
_SIZES = {"max_bytes", "max_msg_size", "max_value_size"}
_PLACEHOLDER = re.compile(r"^\{([a-z_]+)\.([a-z_]+)\}$")

# Bucket fields -> the fields of the stream underneath.
_KV_TO_STREAM = {"ttl": "max_age", "history": "max_msgs_per_subject", "max_value_size": "max_msg_size",
                 "max_bytes": "max_bytes", "storage": "storage", "replicas": "num_replicas",
                 "description": "description"}
_OBJ_TO_STREAM = {"ttl": "max_age", "max_bytes": "max_bytes", "storage": "storage",
                  "replicas": "num_replicas", "description": "description"}

_STREAM_FIELDS = {f.name for f in dataclasses.fields(api.StreamConfig)}
_CONSUMER_FIELDS = {f.name for f in dataclasses.fields(api.ConsumerConfig)}

# Names every busscrape service relies on; a definitions folder must declare them.
REQUIRED = {
    ("kv", names.SEEN_BUCKET), ("kv", names.ATTEMPTS_BUCKET), ("kv", names.STATUS_BUCKET),
    ("object_store", names.ARTIFACTS_BUCKET),
    ("stream", names.TASKS_STREAM), ("stream", names.RESULTS_STREAM),
    ("stream", names.DEADLETTER_STREAM), ("stream", names.ADVISORIES_STREAM),
    ("consumer", names.WORKERS_CONSUMER), ("consumer", names.INGESTERS_CONSUMER),
    ("consumer", names.REAPER_CONSUMER), ("consumer", names.ARCHIVIST_CONSUMER),
}


@dataclass(frozen=True)
class Definition:
    """One rendered definition: what ``streams apply`` makes the server hold."""

    kind: Kind
    name: str
    """Stream name, consumer durable name, or bucket name."""
    file: Path
    fields: dict[str, Any]
    """Rendered values in JetStream's field names (seconds, bytes, plain strings)."""
    stream: str
    """The stream it is (or underlies it), or for a consumer the stream it reads."""

    @property
    def label(self) -> str:
        if self.kind == "consumer":
            return f"consumer {self.stream}/{self.name}"
        return {"stream": "stream", "kv": "kv bucket", "object_store": "object store"}[self.kind] + f" {self.name}"

    def stream_fields(self) -> dict[str, Any]:
        """The managed fields as stream fields (for kv and object stores, translated)."""
        if self.kind == "stream":
            return {k: v for k, v in self.fields.items() if k != "name"}
        mapping = _KV_TO_STREAM if self.kind == "kv" else _OBJ_TO_STREAM
        return {mapping[k]: v for k, v in self.fields.items() if k in mapping}

    def stream_config(self) -> api.StreamConfig:
        fields = dict(self.stream_fields())
        if "sources" in fields:
            fields["sources"] = [_source(s) for s in fields["sources"]]
        for key, enum in (("retention", api.RetentionPolicy), ("storage", api.StorageType),
                          ("discard", api.DiscardPolicy)):
            if key in fields:
                fields[key] = enum(fields[key])
        return api.StreamConfig(name=self.stream, **fields)

    def consumer_config(self) -> api.ConsumerConfig:
        fields = {k: v for k, v in self.fields.items() if k != "stream"}
        for key, enum in (("ack_policy", api.AckPolicy), ("deliver_policy", api.DeliverPolicy),
                          ("replay_policy", api.ReplayPolicy)):
            if key in fields:
                fields[key] = enum(fields[key])
        return api.ConsumerConfig(**fields)

    def kv_config(self) -> api.KeyValueConfig:
        fields = dict(self.fields)
        fields.pop("bucket", None)
        if "storage" in fields:
            fields["storage"] = api.StorageType(fields["storage"])
        return api.KeyValueConfig(bucket=self.name, **fields)

    def object_store_config(self) -> api.ObjectStoreConfig:
        fields = dict(self.fields)
        fields.pop("bucket", None)
        if "storage" in fields:
            fields["storage"] = api.StorageType(fields["storage"])
        return api.ObjectStoreConfig(bucket=self.name, **fields)


def _source(spec: dict[str, Any]) -> api.StreamSource:
    transforms = [api.SubjectTransform(src=t["src"], dest=t["dest"]) for t in spec.get("subject_transforms", [])]
    return api.StreamSource(
        name=spec["name"], filter_subject=spec.get("filter_subject"), subject_transforms=transforms or None
    )


def definitions_dir(settings: Settings) -> Path:
    """The configured definitions folder, else the one shipped with the package or the repo."""
    if settings.streams.definitions_dir:
        return settings.streams.definitions_dir
    packaged = resources.files("busscrape") / "_streams"
    if packaged.is_dir():
        return Path(str(packaged))
    # Editable install / source checkout: streams/ sits at the repository root.
    return Path(__file__).resolve().parents[3] / "streams"


def load(settings: Settings, folder: Path | None = None) -> list[Definition]:
    """Every definition in the folder, rendered and in apply order."""
    folder = folder or definitions_dir(settings)
    files = sorted(folder.glob("*.toml"))
    if not files:
        raise ConfigurationError(f"no stream definitions (*.toml) in {folder}; set BUSSCRAPE_STREAMS__DEFINITIONS_DIR")
    defs = [_load_file(path, settings) for path in files]
    seen: dict[tuple[str, str], Path] = {}
    for d in defs:
        key = (d.kind, d.stream + "/" + d.name if d.kind == "consumer" else d.name)
        if key in seen:
            raise ConfigurationError(f"{d.file}: {d.label} is also defined in {seen[key]}")
        seen[key] = d.file
    missing = REQUIRED - {(d.kind, d.name) for d in defs}
    if missing:
        listed = ", ".join(f"{k} {n}" for k, n in sorted(missing))
        raise ConfigurationError(f"{folder} lacks definitions busscrape needs: {listed}")
    return sorted(defs, key=lambda d: (_ORDER[d.kind], d.file.name))


def _load_file(path: Path, settings: Settings) -> Definition:
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"{path}: cannot read stream definition: {exc}") from None
    kind = raw.pop("kind", None)
    if kind not in _ORDER:
        raise ConfigurationError(f"{path}: 'kind' must be one of {', '.join(_ORDER)}, not {kind!r}")
    fields = {key: _render(path, key, value, settings) for key, value in raw.items()}

    if kind == "stream":
        _check_keys(path, fields, _STREAM_FIELDS)
        name = _required(path, fields, "name")
        return Definition("stream", name, path, fields, stream=name)
    if kind == "consumer":
        _check_keys(path, fields, _CONSUMER_FIELDS | {"stream"})
        stream = _required(path, fields, "stream")
        name = _required(path, fields, "durable_name")
        return Definition("consumer", name, path, fields, stream=stream)
    allowed = set(_KV_TO_STREAM if kind == "kv" else _OBJ_TO_STREAM) | {"bucket"}
    _check_keys(path, fields, allowed)
    bucket = _required(path, fields, "bucket")
    prefix = "KV_" if kind == "kv" else "OBJ_"
    return Definition(kind, bucket, path, fields, stream=prefix + bucket)


def _required(path: Path, fields: dict[str, Any], key: str) -> str:
    value = fields.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{path}: '{key}' is required")
    return value


def _check_keys(path: Path, fields: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise ConfigurationError(f"{path}: unknown field(s) {', '.join(unknown)}")


def _render(path: Path, key: str, value: Any, settings: Settings) -> Any:
    """Resolve ``{section.field}`` placeholders and human units."""
    if isinstance(value, str) and (match := _PLACEHOLDER.match(value)):
        section, name = match.groups()
        holder = getattr(settings, section, None)
        if holder is None or not hasattr(holder, name):
            raise ConfigurationError(f"{path}: {key} = {value!r} names no setting")
        value = getattr(holder, name)
        if callable(value):
            value = value()
    try:
        if key in _DURATIONS:
            return parse_duration(value)
        if key in _SIZES:
            return parse_size(value)
        if key == "backoff":
            return [parse_duration(v) for v in value]
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{path}: {key}: {exc}") from None
    if isinstance(value, Enum):
        return value.value
    return value
