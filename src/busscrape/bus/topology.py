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
                 "description": "description", "compression": "compression"}
# Stream fields a bucket's own create API has no word for: set on the stream right after it.
STREAM_ONLY = {"compression", "duplicate_window"}
_OBJ_TO_STREAM = {"ttl": "max_age", "max_bytes": "max_bytes", "storage": "storage",
                  "replicas": "num_replicas", "description": "description", "duplicate_window": "duplicate_window"}

_STREAM_FIELDS = {f.name for f in dataclasses.fields(api.StreamConfig)}
_CONSUMER_FIELDS = {f.name for f in dataclasses.fields(api.ConsumerConfig)}

@dataclass(frozen=True)
class Definition:
    """One rendered definition: what ``streams apply`` makes the server hold, ready for the
    planner (``provision``), which compares ``managed`` with the live configuration, creates with
    ``create`` and updates the managed fields from ``config``. All three are built once, here."""

    kind: Kind
    name: str
    """Stream name, consumer durable name, or bucket name."""
    file: Path
    fields: dict[str, Any]
    """Rendered values in JetStream's field names (seconds, bytes, plain strings), as the file has them."""
    stream: str
    """The stream it is (or underlies it), or for a consumer the stream it reads."""
    managed: dict[str, Any]
    """The fields this definition manages, named as the live configuration names them (a bucket's
    translated to the stream underneath); everything else is left as the server has it."""
    config: api.StreamConfig | api.ConsumerConfig
    """The desired configuration in the live configuration's terms (enums, sources as objects)."""
    create: api.StreamConfig | api.ConsumerConfig | api.KeyValueConfig | api.ObjectStoreConfig
    """What creating it sends (a bucket through its own API, which adds the bucket's conventions)."""

    @property
    def label(self) -> str:
        if self.kind == "consumer":
            return f"consumer {self.stream}/{self.name}"
        return {"stream": "stream", "kv": "kv bucket", "object_store": "object store"}[self.kind] + f" {self.name}"


def _definition(kind: Kind, name: str, file: Path, fields: dict[str, Any], stream: str) -> Definition:
    if kind == "consumer":
        managed = {k: v for k, v in fields.items() if k != "stream"}
        config: Any = api.ConsumerConfig(**_enums(managed, _CONSUMER_ENUMS))
        return Definition(kind, name, file, fields, stream, managed, config, config)
    if kind == "stream":
        managed = {k: v for k, v in fields.items() if k != "name"}
    else:
        mapping = _KV_TO_STREAM if kind == "kv" else _OBJ_TO_STREAM
        managed = {mapping[k]: v for k, v in fields.items() if k in mapping}
    desired = _enums(managed, _STREAM_ENUMS)
    if "sources" in desired:
        desired["sources"] = [_source(s) for s in desired["sources"]]
    config = api.StreamConfig(name=stream, **desired)
    bucket = _enums({k: v for k, v in fields.items() if k != "bucket" and k not in STREAM_ONLY},
                    {"storage": api.StorageType})
    create: Any = config
    if kind == "kv":
        create = api.KeyValueConfig(bucket=name, **bucket)
    elif kind == "object_store":
        create = api.ObjectStoreConfig(bucket=name, **bucket)
    return Definition(kind, name, file, fields, stream, managed, config, create)


_STREAM_ENUMS: dict[str, type[Enum]] = {"retention": api.RetentionPolicy, "storage": api.StorageType,
                                        "discard": api.DiscardPolicy, "compression": api.StoreCompression}
_CONSUMER_ENUMS: dict[str, type[Enum]] = {"ack_policy": api.AckPolicy, "deliver_policy": api.DeliverPolicy,
                                          "replay_policy": api.ReplayPolicy}


def _enums(fields: dict[str, Any], enums: dict[str, type[Enum]]) -> dict[str, Any]:
    return {k: enums[k](v) if k in enums else v for k, v in fields.items()}


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
    missing = names.REQUIRED - {(d.kind, d.name) for d in defs}
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
        return _definition("stream", name, path, fields, stream=name)
    if kind == "consumer":
        _check_keys(path, fields, _CONSUMER_FIELDS | {"stream"})
        stream = _required(path, fields, "stream")
        name = _required(path, fields, "durable_name")
        return _definition("consumer", name, path, fields, stream=stream)
    allowed = set(_KV_TO_STREAM if kind == "kv" else _OBJ_TO_STREAM) | {"bucket"}
    _check_keys(path, fields, allowed)
    bucket = _required(path, fields, "bucket")
    stream = names.kv_stream(bucket) if kind == "kv" else names.object_stream(bucket)
    return _definition(kind, bucket, path, fields, stream=stream)


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
