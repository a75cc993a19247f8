"""The console's HTML: Jinja2 templates (``templates/``) with autoescaping on, and the filters they use.

Everything a page shows that came from the web (titles, URLs, snippets, extracted values, error
texts) is attacker-controlled: Jinja escapes every ``{{ … }}``; the only markup a filter adds is
built here around escaped text (``snippet``'s ``<mark>``). A URL becomes a link only when it is
``http(s)`` (``web_href``): ``javascript:``, ``data:`` and the rest are shown as text.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache
from typing import Any

import orjson
from aiohttp import web
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup, escape

from busscrape.api.console.guard import PAGE_HEADERS
from busscrape.search.index import MARK_END, MARK_START

CONTEXT: web.RequestKey[dict[str, Any]] = web.RequestKey("console", dict)
"""What every page's template needs of the request: its CSRF token, and whether to offer a logout."""
NAV = (("/", "Overview"), ("/console/crawls", "Crawls"), ("/console/pages", "Pages"),
       ("/console/deadletters", "Dead letters"))


def web_href(url: object) -> str | None:
    """``url`` when a browser may follow it as a link (http or https), else None (shown as text)."""
    if not isinstance(url, str):
        return None
    scheme = url.split(":", 1)[0].strip().lower() if ":" in url else ""
    return url if scheme in ("http", "https") and not any(c in url for c in "\r\n\t") else None


def snippet(text: str) -> Markup:
    """A search snippet with its matches (between ``⟦ ⟧``) as ``<mark>``, everything else escaped."""
    out = escape(text)
    return Markup(str(out).replace(MARK_START, "<mark>").replace(MARK_END, "</mark>"))


def size(n: int | float | None) -> str:
    if n is None:
        return ""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{n} B"


def when(moment: datetime | str | None) -> str:
    """A time as ``2026-12-03 19:20:01Z`` (UTC, to the second)."""
    if moment is None:
        return ""
    if isinstance(moment, str):
        try:
            return when(datetime.fromisoformat(moment))
        except ValueError:
            return moment
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%SZ")


def value(v: object) -> str:
    """A record's value as text: scalars as they are, lists and objects as JSON."""
    if isinstance(v, (dict, list, tuple)):
        return orjson.dumps(v, default=str).decode()
    return "" if v is None else str(v)


def number(n: int | float | None) -> str:
    if n is None:
        return "—"
    return f"{n:,.1f}" if isinstance(n, float) else f"{n:,}"


@cache
def environment() -> Environment:
    env = Environment(loader=PackageLoader("busscrape.api.console", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, enable_async=False)
    env.filters.update(web_href=web_href, snippet=snippet, size=size, when=when, number=number, value=value)
    env.globals["nav"] = NAV
    return env


def page(template: str, status: int = 200, **context: Any) -> web.Response:
    """A console page with its security headers (``guard.PAGE_HEADERS``)."""
    context.setdefault("csrf", "")
    context.setdefault("logout", False)
    context.setdefault("live", False)
    body = environment().get_template(template).render(**context)
    return web.Response(text=body, status=status, content_type="text/html", charset="utf-8",
                        headers=PAGE_HEADERS)
