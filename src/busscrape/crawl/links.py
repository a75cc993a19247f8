"""Links from the rendered DOM: what the page's JavaScript made counts as much as the markup.

``LINKS_JS`` runs in the page after the task's steps, inside the capture's one read of the DOM
(``worker.capture``: no round trip of its own). An element's ``href`` property is the
attribute resolved against the document's base URL (``<base href>`` included), so the worker gets
absolute URLs without resolving anything itself. The document's content type comes along:
links of a non-HTML document (a PDF, an image, plain text) are not followed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import orjson

MAX_LINKS = 5000
"""Links kept per page (document order); a page with more is cut there (and says so)."""

LINKS_JS = """(selector, most) => {
  const out = [];
  const seen = new Set();
  let total = 0;
  for (const el of document.querySelectorAll(selector)) {
    const href = el.href && typeof el.href === 'object' ? el.href.baseVal : el.href;
    if (!href || seen.has(href)) continue;
    seen.add(href);
    total += 1;
    if (out.length < most) out.push(href);
  }
  return {links: out, total: total, content_type: document.contentType || ''};
}"""

HTML_TYPES = ("text/html", "application/xhtml+xml")


@dataclass(frozen=True)
class PageLinks:
    """What ``LINKS_JS`` read from one page."""

    links: tuple[str, ...]
    total: int
    """Distinct hrefs on the page (``links`` holds at most ``MAX_LINKS`` of them)."""
    content_type: str

    @property
    def followable(self) -> bool:
        """Only an HTML document's links are followed (a PDF's or a download's are not)."""
        return self.content_type.split(";")[0].strip().lower() in HTML_TYPES

    @classmethod
    def from_js(cls, raw: dict[str, Any]) -> PageLinks:
        return cls(tuple(str(u) for u in raw.get("links") or ()), int(raw.get("total") or 0),
                   str(raw.get("content_type") or ""))

    def fit(self, max_bytes: int) -> PageLinks:
        """The first links whose JSON takes at most ``max_bytes`` (``total`` unchanged, so the page
        record's ``links_cut`` counts what did not fit too): what a page controls must fit the
        CRAWLS value it is kept in, 5,000 hrefs of 2 KB or not."""
        room = max_bytes - len(orjson.dumps(replace(self, links=()).as_dict()))
        kept = 0
        for link in self.links:
            room -= len(orjson.dumps(link)) + 1  # the string and its comma
            if room < 0:
                return replace(self, links=self.links[:kept])
            kept += 1
        return self

    def as_dict(self) -> dict[str, Any]:
        return {"links": list(self.links), "total": self.total, "content_type": self.content_type}
