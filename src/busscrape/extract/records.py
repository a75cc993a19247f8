"""An extraction's outcome as the record a result carries, and as ``extracted.json`` in the archive.

The one place that decides what a missing required field does: the task fails permanently as
``extraction_failed``, the message naming every missing field (``price: nothing matched``), and
no record, partial or not, is archived (docs/extraction.md says why).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from busscrape.errors import ExtractionFailed, LimitExceeded
from busscrape.model import bounds
from busscrape.model.messages import Extraction, ScrapeResult

if TYPE_CHECKING:
    from busscrape.extract.definition import Extractor
    from busscrape.extract.engine import Outcome

EXTRACTED_NAME = "extracted.json"
MAX_WARNING = 300  # characters of one warning: a page controls what they quote


def extraction(extractor: Extractor, outcome: Outcome, *, max_bytes: int) -> Extraction:
    """The result's ``extraction``, or ``ExtractionFailed`` naming the missing required fields, or
    ``LimitExceeded`` (``record_too_large``) for a record over ``max_bytes`` as JSON."""
    if outcome.missing:
        raise ExtractionFailed(f"extractor {extractor.name!r} v{extractor.version}: required field missing: "
                               + "; ".join(outcome.missing[:10]))
    size = len(orjson.dumps(outcome.record))
    if size > max_bytes:
        raise LimitExceeded(f"extractor {extractor.name!r}: the record is {size} bytes as JSON, over "
                            f"extract.max_record_bytes {max_bytes}", reason="record_too_large")
    return Extraction(extractor=extractor.name, version=extractor.version, record=outcome.record,
                      warnings=tuple(bounds.cut(w, MAX_WARNING) for w in outcome.warnings), ms=outcome.ms)


def document(result: ScrapeResult) -> dict[str, Any]:
    """What ``extracted.json`` holds: the record, what made it, and of which page."""
    assert result.extraction is not None
    e = result.extraction
    return {"extractor": e.extractor, "version": e.version, "task_id": result.task_id, "url": result.url,
            "final_url": result.final_url, "scraped_at": result.scraped_at.isoformat(), "record": e.record}


def document_bytes(result: ScrapeResult) -> bytes:
    """``extracted.json``'s bytes: a function of the result alone (a redelivery writes the same)."""
    return orjson.dumps(document(result), option=orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE)


def summary(result: ScrapeResult) -> dict[str, Any] | None:
    """The extraction's line in ``meta.json``: which extractor, which fields have a value."""
    e = result.extraction
    if e is None:
        return None
    empty = sorted(k for k, v in e.record.items() if v is None or v == [] or v == "")
    return {"extractor": e.extractor, "version": e.version, "file": EXTRACTED_NAME, "fields": len(e.record),
            "empty": empty, "warnings": list(e.warnings), "ms": e.ms}


def text_of(record: Any) -> str:
    """Every string and number of a record, one per line: what full-text search indexes."""
    out: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif value is not None and not isinstance(value, bool):
            out.append(str(value))

    walk(record)
    return "\n".join(out)
