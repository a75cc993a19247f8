"""Which discovered links a crawl follows: its scope, then ``--include`` / ``--exclude``.

``ScopeRules.verdict(url)`` is None for a link to follow, else the reason it is not
(``out_of_scope``, ``excluded``, ``not_included``). Scopes, relative to any seed:

- ``page``: none (the seeds only);
- ``prefix``: same scheme and host, and the path starts with the seed's path up to its last ``/``;
- ``host``: same host (any scheme and port: ``http://a`` and ``https://a`` are one site);
- ``domain``: same registrable domain (``a.example.co.uk`` and ``b.example.co.uk``, never
  ``x.co.uk`` and ``y.co.uk``), by tldextract with the suffix list it bundles: no network fetch, ever;
- ``any``: every http(s) link (the depth and the budget bound it).

``include`` / ``exclude`` are regular expressions searched in the whole URL, in Python ``re``
syntax, run by the ``regex`` engine (its ``VERSION0``, ``re``'s behaviour) for its time bound:
they run on the worker's event loop against URLs a page chose, so a backtracking pattern
(``(x+x+)+y``) on a hostile URL must not stall every slot. A search that takes longer than
``MATCH_TIMEOUT`` counts as a match of an ``exclude`` and a miss of an ``include`` (the link is
not followed, and the page record says ``excluded`` / ``not_included``); after
``MAX_STALLS`` such searches the pattern is not run again in this process (every link then
goes the same way), so a page of 5,000 links costs at most ``MAX_STALLS`` timeouts a pattern.

A seed that redirects (``http://example.com`` → ``https://www.example.com/``) makes where it
landed a seed of the scope too, as Browsertrix does: without it a host or prefix crawl of a
site that moved would end at its first page.
"""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import urlsplit

import regex
import structlog
import tldextract

from busscrape.crawl.spec import CrawlSpec

log = structlog.get_logger("busscrape.crawl")

MATCH_TIMEOUT = 0.05  # seconds one include/exclude search of one URL may take
MAX_STALLS = 3  # searches of one pattern that ran out of time before it is given up in this process


class UrlPattern:
    """One include or exclude pattern, searched with a time bound."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._compiled = regex.compile(pattern)
        self.stalls = 0

    def search(self, url: str) -> bool | None:
        """Whether the pattern is found in ``url``; None when the search ran out of time (or
        the pattern did too often already)."""
        if self.stalls >= MAX_STALLS:
            return None
        try:
            return self._compiled.search(url, timeout=MATCH_TIMEOUT) is not None
        except TimeoutError:
            self.stalls += 1
            log.warning("crawl.pattern_stalled", pattern=self.pattern[:200], url=url[:200], stalls=self.stalls,
                        given_up=self.stalls >= MAX_STALLS)
            return None


@lru_cache(maxsize=1)
def _extractor() -> tldextract.TLDExtract:
    # suffix_list_urls=() and no cache dir: the snapshot in the package, never a download.
    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None, include_psl_private_domains=False)


def registrable_domain(host: str) -> str:
    """``a.b.example.co.uk`` → ``example.co.uk``; a host with no known public suffix (an IP
    address, ``localhost``, ``shop.test``) is its own domain."""
    host = host.lower().rstrip(".")
    parts = _extractor()(host)
    return parts.top_domain_under_public_suffix or host


class ScopeRules:
    """The scope and the include/exclude patterns of one crawl."""

    def __init__(self, spec: CrawlSpec, redirected: tuple[str, ...] = ()) -> None:
        self.scope = spec.scope
        self.include = [UrlPattern(p) for p in spec.include]
        self.exclude = [UrlPattern(p) for p in spec.exclude]
        self.redirected = redirected
        """Where seeds redirected to: seeds of the scope as much as the crawl's own."""
        seeds = [urlsplit(s) for s in (*spec.seeds, *redirected)]
        self._hosts = {(s.hostname or "").lower() for s in seeds}
        self._domains = {registrable_domain(h) for h in self._hosts}
        self._prefixes = [(s.scheme, s.netloc.lower(), s.path[: s.path.rfind("/") + 1] or "/") for s in seeds]

    def in_scope(self, url: str) -> bool:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            return False
        host = (parts.hostname or "").lower()
        match self.scope:
            case "page":
                return False
            case "prefix":
                return any(parts.scheme == scheme and parts.netloc.lower() == netloc and
                           (parts.path or "/").startswith(path) for scheme, netloc, path in self._prefixes)
            case "host":
                return host in self._hosts
            case "domain":
                return host in self._hosts or registrable_domain(host) in self._domains
            case _:
                return True

    def verdict(self, url: str) -> str | None:
        """None: follow ``url``; else why not."""
        if not self.in_scope(url):
            return "out_of_scope"
        if any(p.search(url) is not False for p in self.exclude):  # None: ran out of time
            return "excluded"
        if self.include and not any(p.search(url) is True for p in self.include):
            return "not_included"
        return None
