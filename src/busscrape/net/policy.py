"""Where pages may connect: public addresses only, unless an allow-list opens a door.

By default a worker refuses non-http(s) schemes and any connection to loopback, private,
link-local, multicast, reserved or otherwise non-global addresses, however the address is
written (``0x7f000001``, ``2130706433``, ``[::ffff:127.0.0.1]``) and however it is reached
(the URL, a redirect, a sub-resource, a name that resolves to it). Two places enforce it:

- ``NetworkPolicy.check_url`` before a navigation, for a clear, early, permanent error;
- ``EgressProxy`` (``busscrape.egress``) on every TCP connection the browser opens — the
  ground truth, since it sees redirects and sub-resources and connects to exactly the address
  it checked (no DNS-rebinding window).

The allow-list (``BUSSCRAPE_NETWORK__ALLOW``) takes CIDRs (``127.0.0.2/32``), bare addresses,
host names, and ``host:port`` pairs (``127.0.0.3:8080``, ``[::1]:8080``, ``intranet:443``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from busscrape.errors import ConfigurationError, PageNetworkError, PolicyBlocked
from busscrape.net.addresses import (
    CREDENTIALS_INSTEAD,
    InvalidHost,
    IPAddress,
    classify,
    effective,
    has_credentials,
    parse_ip_host,
)

ALLOWED_SCHEMES = frozenset({"http", "https"})


@dataclass(frozen=True)
class AllowList:
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    hosts: frozenset[str] = frozenset()
    """Host names or addresses allowed on any port."""
    host_ports: frozenset[tuple[str, int]] = frozenset()

    @classmethod
    def parse(cls, entries: list[str]) -> AllowList:
        networks, hosts, host_ports = [], set(), set()
        for raw in entries:
            entry = raw.strip().lower()
            if not entry:
                continue
            try:
                if "/" in entry:
                    networks.append(ipaddress.ip_network(entry, strict=False))
                    continue
                host, port = _split_host_port(entry)
            except ValueError as exc:
                raise ConfigurationError(f"BUSSCRAPE_NETWORK__ALLOW: {raw!r} is not a CIDR, host or host:port "
                                         f"({exc})") from None
            ip = _literal(host)
            name = str(ip) if ip is not None else host
            if port is None:
                if ip is not None:
                    networks.append(ipaddress.ip_network(ip))
                else:
                    hosts.add(name)
            else:
                host_ports.add((name, port))
        return cls(tuple(networks), frozenset(hosts), frozenset(host_ports))

    def allows(self, host: str, ip: IPAddress | None, port: int) -> bool:
        host = host.lower().strip("[]")
        names = {host}
        if ip is not None:
            names.add(str(ip))
            names.add(str(effective(ip)))
        if names & self.hosts or any((n, port) in self.host_ports for n in names):
            return True
        if ip is not None:
            candidates = {ip, effective(ip)}
            return any(c in net for c in candidates for net in self.networks if c.version == net.version)
        return False

    def __bool__(self) -> bool:
        return bool(self.networks or self.hosts or self.host_ports)


def _split_host_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else None
    if entry.count(":") == 1:
        host, port = entry.split(":")
        return host, int(port)
    return entry, None


def _literal(host: str) -> IPAddress | None:
    try:
        return parse_ip_host(host)
    except InvalidHost:
        return None


@dataclass
class NetworkPolicy:
    """The egress rules of one worker."""

    allow: AllowList = field(default_factory=AllowList)

    @classmethod
    def from_settings(cls, allow: list[str]) -> NetworkPolicy:
        return cls(AllowList.parse(allow))

    def refusal(self, host: str, ip: IPAddress, port: int) -> str | None:
        """Why a connection to ``ip`` (reached as ``host``) is refused, or None to allow it."""
        why = classify(ip)
        if why is None or self.allow.allows(host, ip, port):
            return None
        return f"{why} address {ip} is not in the allow-list"

    async def admitted(self, host: str, port: int) -> tuple[list[IPAddress], str | None]:
        """The addresses of ``host`` a connection may go to, and why the first refused one was
        (``OSError`` when the name does not resolve). Connect only to these: they are the ones
        checked (the egress proxy, ``net.checked``)."""
        allowed, reason = [], None
        for ip in await self.resolve(host, port):
            refusal = self.refusal(host, ip, port)
            if refusal is None:
                allowed.append(ip)
            else:
                reason = reason or refusal
        return allowed, reason

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        """The addresses ``host`` resolves to (itself when it is an IP literal)."""
        ip = parse_ip_host(host)  # InvalidHost propagates: the browser would refuse it too
        if ip is not None:
            return [ip]
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        seen: dict[str, IPAddress] = {}
        for *_, sockaddr in infos:
            addr = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            seen.setdefault(str(addr), addr)
        return list(seen.values())

    async def check_url(self, url: str) -> None:
        """Raise ``PolicyBlocked`` (permanent) when a navigation to ``url`` must not happen,
        ``PageNetworkError`` (retryable) when its host cannot be resolved now."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise PolicyBlocked(f"{url!r} is not a valid URL: {exc}", reason="blocked_invalid_url") from None
        if parts.scheme not in ALLOWED_SCHEMES:
            raise PolicyBlocked(f"scheme {parts.scheme!r} is not allowed (only http and https): {url}",
                                reason="blocked_scheme")
        if has_credentials(url):
            raise PolicyBlocked(f"a URL with a user name or password is not navigated to; {CREDENTIALS_INSTEAD}",
                                reason="credentials_in_url")
        host = parts.hostname
        if not host:
            raise PolicyBlocked(f"{url!r} has no host", reason="blocked_invalid_url")
        port = port or (443 if parts.scheme == "https" else 80)
        if self.allow.allows(host, None, port):
            return
        try:
            addresses = await self.resolve(host, port)
        except InvalidHost as exc:
            raise PolicyBlocked(str(exc), reason="blocked_invalid_url") from None
        except OSError as exc:
            raise PageNetworkError(f"cannot resolve {host}: {exc}", reason="dns_error") from None
        refusals = [self.refusal(host, ip, port) for ip in addresses]
        if addresses and all(refusals):
            raise PolicyBlocked(f"navigation to {url} refused: {refusals[0]}", reason="blocked_address")
