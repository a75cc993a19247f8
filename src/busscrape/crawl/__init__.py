"""Crawling: follow links within a scope, a depth and a page budget; robots.txt and sitemaps.

The frontier is the bus itself: a link a worker finds on a rendered page becomes a task through
the same SEEN atomic create as ``busscrape dispatch`` (``frontier``), so two workers finding one
link make one task and a crash loses nothing. Everything else a crawl needs lives in the CRAWLS
bucket (``state``): the rules (``spec``), the page budget (compare-and-set), what each page's
links became, cached robots.txt (``robots``). Modules, in the order a link meets them:

``spec``      the crawl's rules, its id, its tasks' ids
``links``     the links of the rendered DOM (run in the page by the worker's capture)
``scope``     scope (page, prefix, host, registrable domain, any) and include/exclude
``robots``    robots.txt, fetched through the network policy, cached fleet-wide
``frontier``  normalise, filter, de-duplicate, budget, create in SEEN; one record per page
``sitemaps``  sitemap URLs as extra seeds
``progress``  when a crawl is done, and its summary
``run``       start a crawl, wait for it
"""

import sys
import types
from typing import Any


class _CallablePackage(types.ModuleType):
    """``busscrape.crawl`` is both this package and the Python API's function (``client.crawl``):
    importing a submodule makes the package an attribute of ``busscrape``, so calling it must work."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from busscrape.client import crawl

        return crawl(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
