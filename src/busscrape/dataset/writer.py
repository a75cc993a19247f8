"""``-o FILE``: the dataset of a run, one row per page (``pages.ROW_FIELDS``), in the format the
file's suffix names.

- ``.jsonl`` (and ``-``, standard output): one JSON object a line, appended and flushed as each
  page lands, so a crashed or interrupted run keeps what it had; ``extracted`` nested.
- ``.csv``: the same rows, ``extracted`` as JSON text; a header when the file is new.
- ``.parquet``: written at the end from ``FILE.jsonl.partial`` (the JSONL above, beside it) through
  pyarrow, ``extracted`` a struct; the partial file is removed once a complete run's Parquet is
  written and kept when it was interrupted, so the same command again goes on appending to it.

Every format appends: a resumed run yields the pages it had not yet yielded, so its rows add to
the earlier run's (Scrapy's ``-o`` appends too).
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path
from typing import IO, Any

import orjson

from busscrape.dataset.pages import ROW_FIELDS, Page
from busscrape.errors import ConfigurationError

FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}
PARTIAL = ".jsonl.partial"


def dataset_format(target: str) -> str:
    """``jsonl``, ``csv`` or ``parquet`` from ``target``'s suffix (``-`` is JSONL on stdout);
    ``ConfigurationError`` naming the file otherwise, or when Parquet has no pyarrow."""
    if target == "-":
        return "jsonl"
    fmt = FORMATS.get(Path(target).suffix.lower())
    if fmt is None:
        raise ConfigurationError(f"--output {target}: write a .jsonl, .csv or .parquet file (or - for JSONL on "
                                 "standard output)")
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ConfigurationError(f"--output {target}: Parquet needs pyarrow (pip install 'busscrape[export]'); "
                                     "or write .jsonl or .csv") from None
    return fmt


class DatasetWriter:
    """Writes pages to ``target`` as they come (``with DatasetWriter(target) as w: w.write(page)``)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.format = dataset_format(target)
        self.rows = 0
        self._file: IO[bytes] | None = None
        self._csv: Any = None

    def __enter__(self) -> DatasetWriter:
        try:
            if self.target == "-":
                self._file = sys.stdout.buffer
            elif self.format == "parquet":
                self.partial.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.partial, "ab")
            else:
                path = Path(self.target)
                path.parent.mkdir(parents=True, exist_ok=True)
                fresh = not path.exists() or path.stat().st_size == 0
                self._file = open(path, "ab")
                if self.format == "csv" and fresh:
                    self._write_csv(ROW_FIELDS)
        except OSError as exc:
            raise ConfigurationError(f"--output {self.target}: {exc.strerror or exc}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(complete=False)

    @property
    def partial(self) -> Path:
        return Path(self.target + PARTIAL)

    def write(self, page: Page) -> None:
        row = page.row()
        assert self._file is not None
        if self.format == "csv":
            extracted = row["extracted"]
            row["extracted"] = orjson.dumps(extracted).decode() if extracted is not None else None
            self._write_csv(["" if row[name] is None else row[name] for name in ROW_FIELDS])
        else:
            self._file.write(orjson.dumps(row) + b"\n")
        self._file.flush()
        self.rows += 1

    def _write_csv(self, values: Any) -> None:
        text = io.StringIO()
        csv.writer(text).writerow(values)
        assert self._file is not None
        self._file.write(text.getvalue().encode())

    def close(self, *, complete: bool) -> None:
        """Flush and close; Parquet is written now from the partial JSONL (removed when ``complete``)."""
        if self._file is None:
            return
        if self._file is not sys.stdout.buffer:
            self._file.close()
        self._file = None
        if self.format == "parquet":
            write_parquet(self.partial, Path(self.target))
            if complete:
                self.partial.unlink(missing_ok=True)


def write_parquet(source: Path, target: Path) -> None:
    """The rows of the JSONL ``source`` as the Parquet file ``target`` (replaced atomically)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [orjson.loads(line) for line in source.read_bytes().splitlines() if line.strip()]
    schema = pa.schema([("url", pa.string()), ("final_url", pa.string()), ("status", pa.int64()),
                        ("title", pa.string()), ("task_id", pa.string()), ("archived_at", pa.string()),
                        ("folder", pa.string()), ("extracted", _struct_of(rows)), ("dead_reason", pa.string())])
    table = pa.Table.from_pylist(rows, schema=schema)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".tmp")
    pq.write_table(table, part)
    part.replace(target)


def _struct_of(rows: list[dict[str, Any]]) -> Any:
    """The type of the ``extracted`` column: pyarrow's own inference over every record (a record
    with a field another lacks gets null there); a struct with no field is not writable, so
    with no record at all the column is a null column."""
    import pyarrow as pa

    records = [row["extracted"] for row in rows if row.get("extracted")]
    return pa.array(records).type if records else pa.null()
