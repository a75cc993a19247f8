"""IP literals in URLs, read the way browsers read them, and which addresses are public.

Browsers follow the WHATWG URL standard, which accepts IPv4 hosts in forms Python's
``ipaddress`` does not: ``0x7f000001``, ``2130706433``, ``0177.0.0.1``, ``127.1``. A guard that
parses hosts differently from the browser is a guard with holes, so the dispatcher (to
normalise) and the network policy (to refuse) both use ``parse_ip_host`` below.
"""

from __future__ import annotations

import ipaddress
import re
from ipaddress import IPv4Address, IPv6Address

IPAddress = IPv4Address | IPv6Address

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_DIGITS = {8: frozenset("01234567"), 10: frozenset("0123456789"), 16: frozenset("0123456789abcdefABCDEF")}


_AUTHORITY = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://([^/?#]*)")

CREDENTIALS_INSTEAD = ("send them as a request header instead: options.headers "
                       '{"Authorization": "Basic <base64 of user:password>"}')
"""How a task carries credentials, for every refusal of a URL that holds them."""


def has_credentials(url: str) -> bool:
    """Whether ``url`` holds user-info (``http://user:pw@host/``, even an empty ``http://@host/``).

    Such a URL is refused everywhere a task is built or navigates: it would be stored (task id,
    SEEN, STATUS, ``meta.json``, the search index) and shown (logs, the API) with the password
    in it, and Chromium files the credentials in the context's auth cache.
    """
    match = _AUTHORITY.match(url.strip())
    return match is not None and "@" in match.group(1)


class InvalidHost(ValueError):
    """A host that looks like an IPv4 literal but is not a valid one (the browser refuses it too)."""


def _ipv4_number(part: str) -> int | None:
    """One dotted part per WHATWG: hex with 0x, octal with a leading 0, else decimal."""
    if not part:
        return None
    radix = 10
    if part[:2] in ("0x", "0X"):
        part, radix = part[2:], 16
    elif len(part) > 1 and part[0] == "0":
        part, radix = part[1:], 8
    if part == "":
        return 0
    if any(c not in _DIGITS[radix] for c in part):
        return None
    return int(part, radix)


def _ends_in_number(parts: list[str]) -> bool:
    last = parts[-1]
    if last and all(c in "0123456789" for c in last):
        return True
    return _ipv4_number(last) is not None and last[:2] in ("0x", "0X")


def parse_ipv4(host: str) -> IPv4Address | None:
    """The IPv4 address a browser reads in ``host``, None for a domain name.

    Raises ``InvalidHost`` for hosts that end in a number but are not a valid address
    (``1.2.3.4.5``, ``256.0.0.1``): browsers reject those URLs.
    """
    parts = host.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    if not _ends_in_number(parts):
        return None
    if len(parts) > 4:
        raise InvalidHost(f"{host!r} has more than four IPv4 parts")
    numbers = []
    for part in parts:
        n = _ipv4_number(part)
        if n is None:
            raise InvalidHost(f"{host!r}: {part!r} is not an IPv4 number")
        numbers.append(n)
    if any(n > 255 for n in numbers[:-1]) or numbers[-1] >= 256 ** (5 - len(numbers)):
        raise InvalidHost(f"{host!r} is out of the IPv4 range")
    value = numbers[-1]
    for i, n in enumerate(numbers[:-1]):
        value += n * 256 ** (3 - i)
    return IPv4Address(value)


def parse_ip_host(host: str) -> IPAddress | None:
    """The IP address ``host`` denotes (IPv4 in any browser form, IPv6 with or without
    brackets), or None when it is a domain name."""
    h = host.strip().lower()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if ":" in h:
        try:
            return IPv6Address(h.split("%", 1)[0])
        except ValueError as exc:
            raise InvalidHost(f"{host!r} is not a valid IPv6 address") from exc
    return parse_ipv4(h)


def effective(ip: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one carries (mapped, NAT64, 6to4, Teredo), else itself."""
    if isinstance(ip, IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip in _NAT64:
            return IPv4Address(int(ip) & 0xFFFFFFFF)
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip.teredo is not None:
            return ip.teredo[1]
    return ip


def classify(ip: IPAddress) -> str | None:
    """Why ``ip`` is not a public address (``loopback``, ``private`` …), or None if it is."""
    ip = effective(ip)
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link_local"
    if isinstance(ip, IPv6Address) and ip.is_site_local:
        # fec0::/10: deprecated (RFC 3879) but still routed inside some networks, and Python
        # counts it as global.
        return "site_local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_reserved:
        return "reserved"
    if ip.is_private:
        return "private"
    if not ip.is_global:
        return "non_global"
    return None
