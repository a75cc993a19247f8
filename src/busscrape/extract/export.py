"""``busscrape export``: every archived record of one extractor, as JSONL, CSV or Parquet.

Reads the archive (local folder or S3), not the index: the records are the ``extracted.json``
files of complete folders (those with their ``meta.json``), oldest scrape first. Each row is the
record's fields plus ``_task_id``, ``_url``, ``_scraped_at`` and ``_version`` (the extractor
version that made it). JSONL rows are the records exactly as archived; CSV cells hold nested values
(a list of reviews) as JSON; Parquet columns are typed from the extractor's definition (``decimal``
as a decimal column whose scale fits every value, ``date`` as a date, ``int`` as int64 …), and the
file is written by pyarrow (``pip install 'busscrape[export]'``).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import AsyncIterator
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

import orjson

from busscrape.archive import layout
from busscrape.archive.storage import Storage
from busscrape.errors import ConfigurationError
from busscrape.extract.definition import Extractor
from busscrape.extract.records import EXTRACTED_NAME

META_COLUMNS = ("_task_id", "_url", "_scraped_at", "_version")
FORMATS = ("jsonl", "csv", "parquet")
_DAY = re.compile(r"(?:^|/)dt=(\d{4}-\d{2}-\d{2})/")


async def records(storage: Storage, extractor: str, *, since: datetime | None = None,
                  prefix: str = "") -> list[dict[str, Any]]:
    """Rows for every archived record of ``extractor`` scraped at or after ``since``, oldest first."""
    rows = [row async for row in _rows(storage, extractor, since, prefix)]
    rows.sort(key=lambda r: (r["_scraped_at"], r["_task_id"]))
    return rows


async def _rows(storage: Storage, extractor: str, since: datetime | None, prefix: str) -> AsyncIterator[dict[str, Any]]:
    keys = set(await storage.keys(prefix))
    for key in sorted(keys):
        folder, _, name = key.rpartition("/")
        if name != EXTRACTED_NAME or f"/{layout.STAGING}/" in f"/{key}" or f"{folder}/{layout.META_NAME}" not in keys:
            continue
        day = _DAY.search(key)
        if since is not None and day is not None and day.group(1) < since.date().isoformat():
            continue  # the whole day's partition is older
        doc = orjson.loads(await storage.get(key) or b"null")
        if not isinstance(doc, dict) or doc.get("extractor") != extractor:
            continue
        scraped = datetime.fromisoformat(doc["scraped_at"])
        if since is not None and scraped < since:
            continue
        yield {**doc["record"], "_task_id": doc["task_id"], "_url": doc["url"], "_scraped_at": doc["scraped_at"],
               "_version": doc["version"]}


def columns(rows: list[dict[str, Any]], definition: Extractor | None) -> list[str]:
    """The definition's fields in its order (then any others the rows have), then the meta columns."""
    names = list(definition.fields) if definition is not None else []
    for row in rows:
        names += [k for k in row if k not in names and k not in META_COLUMNS]
    return [*names, *META_COLUMNS]


def write_jsonl(rows: list[dict[str, Any]], out: IO[bytes]) -> None:
    for row in rows:
        out.write(orjson.dumps(row) + b"\n")


def write_csv(rows: list[dict[str, Any]], out: IO[bytes], names: list[str]) -> None:
    text = io.TextIOWrapper(out, encoding="utf-8", newline="", write_through=True)
    writer = csv.DictWriter(text, fieldnames=names, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: orjson.dumps(v).decode() if isinstance(v, list | dict) else v for k, v in row.items()})
    text.detach()


def pyarrow() -> Any:
    """pyarrow, or the one-line fix (``ConfigurationError``: exit 2) when it is not installed."""
    try:
        import pyarrow as pa
        import pyarrow.parquet  # the writer, imported with it
    except ImportError:
        raise ConfigurationError("--format parquet needs pyarrow: pip install 'busscrape[export]'") from None
    return pa


NESTED_DECIMAL = (38, 9)
"""Precision and scale of a decimal inside an item (a top-level column's scale fits its values)."""


def write_parquet(rows: list[dict[str, Any]], path: Path, names: list[str], definition: Extractor | None) -> None:
    pa = pyarrow()
    specs = definition.fields if definition is not None else {}
    arrays, fields = [], []
    for name in names:
        values: list[Any] = [row.get(name) for row in rows]
        spec = specs.get(name)
        if spec is not None and _scalar(spec) == "decimal" and not spec.multiple:
            numbers = [Decimal(v) if v is not None else None for v in values]
            scale = max((-n.as_tuple().exponent for n in numbers if n is not None), default=0)  # type: ignore[operator]
            array = pa.array(numbers, type=pa.decimal128(38, max(scale, 0)))
        elif spec is not None:
            array = pa.array([_value(v, spec) for v in values], type=_arrow_type(pa, spec))
        elif name == "_scraped_at":
            array = pa.array([datetime.fromisoformat(v) for v in values])
        elif name in ("_task_id", "_url"):
            array = pa.array(values, type=pa.string())
        else:  # a field the definition does not know (an older version's): as pyarrow reads it
            array = pa.array(values)
        arrays.append(array)
        fields.append(pa.field(name, array.type))
    pa.parquet.write_table(pa.Table.from_arrays(arrays, schema=pa.schema(fields)), path)


def _sub_fields(spec: Any) -> dict[str, Any]:
    """A field's items' sub-fields (from its alternatives, the first to name one wins)."""
    found: dict[str, Any] = {}
    for alt in spec.sources():
        for name, sub in (alt.fields or {}).items():
            found.setdefault(name, sub)
    return found


def _scalar(spec: Any) -> str:
    return str(spec.sources()[0].type)


def _arrow_type(pa: Any, spec: Any) -> Any:
    """The column type of a field: its scalar type, a struct of its sub-fields, a list with ``multiple``."""
    sub = _sub_fields(spec)
    if sub:
        kind = pa.struct([pa.field(name, _arrow_type(pa, s)) for name, s in sub.items()])
    else:
        kind = {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(), "date": pa.date32(),
                "datetime": pa.timestamp("us", tz="UTC"), "decimal": pa.decimal128(*NESTED_DECIMAL)}.get(
            _scalar(spec), pa.string())
    return pa.list_(kind) if spec.multiple else kind


def _value(value: Any, spec: Any, item: bool = False) -> Any:
    """An archived (JSON) value as its column type wants it: dates and decimals parsed, items recursed."""
    if value is None:
        return None
    if spec.multiple and not item:
        return [_value(v, spec, item=True) for v in value] if isinstance(value, list) else None
    sub = _sub_fields(spec)
    if sub:
        return {name: _value(value.get(name), s) for name, s in sub.items()} if isinstance(value, dict) else None
    kind = _scalar(spec)
    if kind == "date":
        return date.fromisoformat(value)
    if kind == "datetime":
        return datetime.fromisoformat(value)
    if kind == "decimal":
        return Decimal(str(value))
    return value
