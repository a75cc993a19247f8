"""URL validation and normalisation: one canonical spelling per page, or a reason why not.

Two spellings of one page must give one task (``HTTP://Example.COM:80/a/../b#top`` and
``http://example.com/b``), so the dispatcher normalises before it computes a task's identity.
Parsing and canonicalisation are yarl's (aio-libs, C-accelerated): lower-case scheme and
host, IDNA, default ports dropped, dot segments resolved, percent-encoding normalised (``%7e``
-> ``~``, ``%e4`` -> ``%E4``). On top of that, the rules browsers apply and yarl does not:

- numeric IPv4 hosts are read the browser's way (``0x7f000001``, ``2130706433``, ``0177.0.0.1``
  and ``127.1`` are all ``127.0.0.1``) through ``addresses.parse_ip_host``; invalid ones
  (``1.2.3.4.5``, ``256.1.1.1``) are refused like a browser refuses them;
- ``xn--`` labels must decode under IDNA 2008/UTS 46 (yarl falls back to IDNA 2003 and lets
  invalid punycode through);
- the fragment is dropped (it never reaches the server);
- user-info (``user:password@``) is refused: see ``addresses.has_credentials``;
- optionally, tracking parameters are removed and the query is sorted. Both work on the raw
  ``name=value`` pairs, so the encoding of what remains is never changed.

Every refusal is an ``InputError`` whose ``reason`` is one of ``REASONS``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import unquote_plus

import idna
from yarl import URL

from busscrape.errors import InputError, said
from busscrape.net.addresses import CREDENTIALS_INSTEAD, InvalidHost, has_credentials, parse_ip_host
from busscrape.settings import DispatchSettings

REASONS = (
    "invalid_characters",  # control characters or whitespace inside the URL
    "unsupported_scheme",  # not http or https (or no scheme at all)
    "invalid_url",  # unparseable: bad port, bad brackets, backslash in the authority …
    "missing_host",  # http:///path, http://
    "invalid_host",  # characters no host name can hold, bad IP literal, label over 63 …
    "invalid_idna",  # a non-ASCII host or an xn-- label that IDNA 2008/UTS 46 refuses
    "too_long",  # longer than max_url_length once normalised
    "credentials_in_url",  # http://user:password@host/: stored and shown everywhere the URL is
)
"""The stable codes of a rejected URL (the JSONL reader adds its own)."""

DEFAULT_PORTS = {"http": 80, "https": 443}

# Anything from C0/C1 controls to any Unicode space: a URL list line holds exactly one URL.
_BAD_CHARACTER = re.compile(r"[\x00-\x20\x7f-\x9f\s]")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_AUTHORITY = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://([^/?#]*)")
# After IDNA a host name is ASCII; underscores are not valid in DNS host names but real sites use them.
_LABEL = re.compile(r"[a-z0-9_-]{1,63}")
_MAX_HOST = 253


@dataclass(frozen=True)
class UrlRules:
    """What ``normalise`` accepts and rewrites (built from ``DispatchSettings``)."""

    max_length: int = 2048
    strip_tracking: bool = False
    tracking_params: tuple[str, ...] = ()
    sort_query: bool = False

    @classmethod
    def from_settings(cls, settings: DispatchSettings) -> UrlRules:
        return cls(max_length=settings.max_url_length, strip_tracking=settings.strip_tracking,
                   tracking_params=tuple(settings.tracking_params), sort_query=settings.sort_query)


def _rejected(reason: str, detail: str) -> InputError:
    return InputError(detail, reason=reason)


def tracking_matcher(patterns: Iterable[str]) -> re.Pattern[str] | None:
    """One case-insensitive regex for parameter names with ``*`` wildcards (``utm_*``)."""
    parts = [re.escape(p.strip()).replace(r"\*", ".*") for p in patterns if p.strip()]
    return re.compile("|".join(parts), re.IGNORECASE) if parts else None


@lru_cache(maxsize=65536)
def _canonical_host(host: str) -> tuple[str, str | None]:
    """(canonical host, None), or (reason, detail) when no browser would accept it.

    Cached: an input names far fewer hosts than URLs, and this is a third of the work per URL.
    """
    if ":" in host:  # yarl has already lower-cased and compressed the IPv6 literal
        if "%" in host:
            return "invalid_host", "IPv6 zone identifiers are not allowed in URLs"
        return f"[{host}]", None
    try:
        ip = parse_ip_host(host)
    except InvalidHost as exc:
        return "invalid_host", str(exc)
    if ip is not None:
        return str(ip), None
    name = host[:-1] if host.endswith(".") else host
    if len(name) > _MAX_HOST:
        return "invalid_host", f"host name of {len(name)} characters; DNS allows {_MAX_HOST}"
    for label in name.split("."):
        if not _LABEL.fullmatch(label):
            what = "an empty label" if not label else f"label {label[:70]!r}"
            return "invalid_host", f"{what} cannot be part of a host name"
        if label.startswith("xn--"):
            try:
                idna.decode(label)
            except (idna.IDNAError, UnicodeError) as exc:
                return "invalid_idna", f"label {label!r}: {exc}"
    return host, None


class UrlNormaliser:
    """``normaliser(text)`` -> the canonical URL, or ``InputError`` with a reason code."""

    def __init__(self, rules: UrlRules | None = None) -> None:
        self.rules = rules or UrlRules()
        self._tracking = tracking_matcher(self.rules.tracking_params) if self.rules.strip_tracking else None
        # Percent-encoding can triple a URL's length: beyond this it cannot fit, so do not even parse it.
        self._raw_limit = self.rules.max_length * 3

    def __call__(self, text: str) -> str:
        text = text.strip()
        if not text:
            raise _rejected("invalid_url", "empty URL")
        if len(text) > self._raw_limit:
            raise _rejected("too_long", f"{len(text)} characters; the limit is {self.rules.max_length}")
        bad = _BAD_CHARACTER.search(text)
        if bad:
            kind = "whitespace" if bad.group().isspace() else "control character"
            raise _rejected("invalid_characters", f"{kind} {bad.group()!r} at position {bad.start()}")
        scheme = _SCHEME.match(text)
        if scheme is None:
            raise _rejected("unsupported_scheme", "no scheme: write http:// or https://")
        if scheme.group(1).lower() not in DEFAULT_PORTS:
            raise _rejected("unsupported_scheme", f"scheme {scheme.group(1)!r} is not http or https")
        try:
            url = URL(text)
        except (ValueError, UnicodeError) as exc:
            authority = _AUTHORITY.match(text)
            if isinstance(exc, UnicodeError) or (authority and not authority.group(1).isascii()):
                raise _rejected("invalid_idna", f"host is not valid IDNA: {exc}") from None
            raise _rejected("invalid_url", said(exc)) from None
        host = url.raw_host
        if not host:
            raise _rejected("missing_host", "no host after the scheme")
        host, problem = _canonical_host(host)
        if problem is not None:
            raise _rejected(host, problem)
        port = url.explicit_port
        if port == 0:
            raise _rejected("invalid_url", "port 0")
        port_part = "" if port is None or port == DEFAULT_PORTS[url.scheme] else f":{port}"
        if url.raw_user is not None or url.raw_password is not None or has_credentials(text):
            raise _rejected("credentials_in_url", f"a user name or password in the URL would be stored and shown "
                                                  f"wherever the URL is; {CREDENTIALS_INSTEAD}")
        query = url.raw_query_string
        if query and (self._tracking is not None or self.rules.sort_query):
            query = self._query(query)
        result = f"{url.scheme}://{host}{port_part}{url.raw_path or '/'}{'?' if query else ''}{query}"
        if len(result) > self.rules.max_length:
            raise _rejected("too_long", f"{len(result)} characters once normalised; the limit is "
                                        f"{self.rules.max_length}")
        return result

    def _query(self, query: str) -> str:
        pairs = [p for p in query.split("&") if p]
        if self._tracking is not None:
            matcher = self._tracking
            pairs = [p for p in pairs if not matcher.fullmatch(unquote_plus(p.partition("=")[0]))]
        if self.rules.sort_query:
            # By name only, and stable: repeated names keep their order (a=2&a=1 may mean a list).
            pairs.sort(key=lambda p: p.partition("=")[0])
        return "&".join(pairs)


def normalise(text: str, rules: UrlRules | None = None) -> str:
    """The canonical form of ``text`` under ``rules`` (see ``UrlNormaliser``)."""
    return UrlNormaliser(rules)(text)
