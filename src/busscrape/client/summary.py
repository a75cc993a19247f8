"""What a run or a crawl from Python returns: the ``run --json`` / ``crawl --json`` object."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from busscrape.ops.runner import RunSummary


class Summary:
    """The summary of a run: one attribute per key of ``busscrape run --json`` (``archived``,
    ``dead``, ``dead_by_reason``, ``unfinished``, ``interrupted``, ``archive`` …; a crawl's also has
    ``crawl``), and ``as_dict()``."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self._doc = doc
        for key, value in doc.items():
            setattr(self, key, value)

    @classmethod
    def of(cls, summary: RunSummary) -> Summary:
        from busscrape.cli.run import summary_dict

        doc = summary_dict(summary)
        if summary.crawl is not None:
            doc["crawl"] = summary.crawl.as_dict()
        return cls(doc)

    def as_dict(self) -> dict[str, Any]:
        """The same object ``--json`` prints."""
        import copy

        return copy.deepcopy(self._doc)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={self._doc[k]!r}" for k in ("tasks", "archived", "dead", "unfinished", "interrupted"))
        return f"Summary({shown})"
