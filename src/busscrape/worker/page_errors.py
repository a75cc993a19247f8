"""What a page's failure means for its task: Playwright's and Chromium's error texts, classified.

Every way a navigation or a page can fail becomes an error class of ``busscrape.errors``, which
says what happens to the task: timeouts and network errors are retried, downloads, redirect loops
and blocked addresses are dead-lettered at once, a crashed tab or browser is retried on a fresh
one. The texts are Chromium's ``net::ERR_*`` codes and Playwright's own messages.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from email.utils import parsedate_to_datetime

from playwright.async_api import Error as PlaywrightError

from busscrape.errors import (
    BrowserCrashed,
    BusscrapeError,
    PageNetworkError,
    PermanentError,
    PolicyBlocked,
    StorageUnavailable,
)

# Error text -> (error class, reason). First match wins.
NAVIGATION_ERRORS: list[tuple[str, type[BusscrapeError], str]] = [
    ("Download is starting", PermanentError, "download"),
    ("ERR_TOO_MANY_REDIRECTS", PermanentError, "redirect_loop"),
    ("ERR_INVALID_REDIRECT", PermanentError, "invalid_redirect"),
    ("ERR_UNSAFE_REDIRECT", PolicyBlocked, "blocked_redirect"),
    ("ERR_UNKNOWN_URL_SCHEME", PolicyBlocked, "blocked_scheme"),
    # Full Chromium in new headless mode (not the headless shell) turns a 401 document into this.
    ("ERR_INVALID_AUTH_CREDENTIALS", PermanentError, "http_401"),
    ("ERR_NAME_NOT_RESOLVED", PageNetworkError, "dns_error"),
    ("ERR_SOCKS_CONNECTION_HOST_UNREACHABLE", PageNetworkError, "dns_error"),
    ("crash", BrowserCrashed, "page_crashed"),
    ("Target page, context or browser has been closed", BrowserCrashed, "browser_crashed"),
    ("Target closed", BrowserCrashed, "browser_crashed"),
    ("net::", PageNetworkError, "network_error"),
]
REFUSED_BY_PROXY = ("ERR_SOCKS_CONNECTION_FAILED", "ERR_PROXY")
"""What Chromium says when the egress proxy refused a connection (the proxy knows why)."""

NETWORK_CHANGED = "ERR_NETWORK_CHANGED"
"""Chromium drops every request in flight when the machine's network changes (an address or an
interface comes or goes: a VPN, DHCP, a container started on the same host). The worker's
network, not the page: an outage, which spends no attempt."""


def _network_changed(what_was_cut: str, said: str) -> StorageUnavailable:
    return StorageUnavailable(f"{what_was_cut} cut off: this machine's network changed ({said})", what="network")


def first_line(exc: PlaywrightError, limit: int = 500) -> str:
    """The first line of a Playwright error (the rest is a call log), cut to ``limit``."""
    return (exc.message or str(exc)).splitlines()[0][:limit]


def navigation_error(url: str, exc: PlaywrightError, refusal: str | None) -> BusscrapeError:
    """The error a failed navigation to ``url`` stands for. ``refusal``: the egress proxy's reason,
    when it refused one of this navigation's connections."""
    message = first_line(exc)
    if NETWORK_CHANGED in message:
        return _network_changed(f"navigation to {url}", message)
    if any(code in message for code in REFUSED_BY_PROXY):
        if refusal:
            return PolicyBlocked(f"navigation to {url} refused: {refusal}", reason="blocked_address")
        return PageNetworkError(f"navigation to {url} failed: {message}")
    for needle, kind, reason in NAVIGATION_ERRORS:
        if needle in message:
            return kind(f"navigation to {url} failed: {message}", reason=reason)
    return PageNetworkError(f"navigation to {url} failed: {message}")


def cut_off_by_network_change(url: str, failed: Iterable[tuple[str, str]]) -> StorageUnavailable | None:
    """The outage a render met when Chromium dropped one of the page's requests because this
    machine's network changed (``failed``: each failed request's URL and failure text): its
    capture would lack that resource through no fault of the page's, so it is not archived."""
    for request_url, failure in failed:
        if NETWORK_CHANGED in failure:
            return _network_changed(f"{url}: its request for {request_url} was", failure)
    return None


def page_error(url: str, exc: PlaywrightError) -> BusscrapeError:
    """After navigation: the page crashed, closed itself, or the browser went away."""
    message = first_line(exc)
    for needle, kind, reason in NAVIGATION_ERRORS:
        if needle in message and kind is BrowserCrashed:
            return BrowserCrashed(f"{url}: {message}", reason=reason)
    return PageNetworkError(f"{url}: {message}", reason="page_error")


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
    except (TypeError, ValueError):
        return None
