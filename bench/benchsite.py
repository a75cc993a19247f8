"""Import shim: ``bench/site.py`` shares its name with Python's ``site`` module, so the
benchmarks load it through this module instead of ``import site``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("busscrape_bench_site", Path(__file__).with_name("site.py"))
assert _spec and _spec.loader
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)

BenchSite = _module.BenchSite
ORIGINS = _module.ORIGINS
page_html = _module.page_html
