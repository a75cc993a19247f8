"""Upstream proxies: parsing, masking, and opening a tunnel through one to an address already checked.

The egress proxy (``egress``) stays in front of Chromium and keeps checking every connection
against the network policy; when a task goes through an upstream proxy, the egress proxy connects
to the *proxy* (whose own address must pass the policy: on loopback or a private network it must
be in ``network.allow``) and asks it for a tunnel to the target's checked IP address, never its
name: the proxy cannot resolve the name to somewhere else. Schemes: ``http://`` and ``https://``
(HTTP CONNECT, the latter over TLS to the proxy) and ``socks5://`` (RFC 1928, user/password
RFC 1929); credentials in the URL (``http://user:pass@host:port``).

``masked(url)`` is how a proxy appears anywhere it is shown or stored: without its credentials.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
import ssl
import struct
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from busscrape.errors import ConfigurationError

SCHEMES = {"http": 8080, "https": 443, "socks5": 1080}


class UpstreamFailed(OSError):
    """The upstream proxy could not be reached or refused the tunnel."""


@dataclass(frozen=True)
class Upstream:
    scheme: str
    host: str
    port: int
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, url: str, where: str = "proxy") -> Upstream:
        try:
            parts = urlsplit(url.strip())
            port = parts.port
        except ValueError as exc:
            raise ConfigurationError(f"{where}: {masked(url)!r} is not a proxy URL ({exc})") from None
        scheme = parts.scheme.lower()
        if scheme not in SCHEMES:
            raise ConfigurationError(f"{where}: {masked(url)!r}: the scheme must be one of "
                                     f"{', '.join(s + '://' for s in SCHEMES)}")
        if not parts.hostname:
            raise ConfigurationError(f"{where}: {masked(url)!r} names no host")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ConfigurationError(f"{where}: {masked(url)!r}: a proxy URL has no path, query or fragment")
        return cls(scheme, parts.hostname.lower(), port or SCHEMES[scheme],
                   unquote(parts.username) if parts.username is not None else None,
                   unquote(parts.password) if parts.password is not None else None)

    @property
    def url(self) -> str:
        """The proxy without its credentials (what logs, metrics and meta.json show)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def __str__(self) -> str:
        return self.url

    async def tunnel(self, ip: str, port: int, timeout: float, *, via: str
                     ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection through this proxy, reached at ``via`` (an address of its name the policy
        checked: resolving the name again could answer another one), to ``ip:port`` (an address
        the policy let through). TLS to the proxy still verifies its name."""
        try:
            async with asyncio.timeout(timeout):
                tls = ssl.create_default_context() if self.scheme == "https" else None
                reader, writer = await asyncio.open_connection(via, self.port, ssl=tls,
                                                               server_hostname=self.host if tls else None)
                try:
                    if self.scheme == "socks5":
                        await self._socks5(reader, writer, ip, port)
                    else:
                        await self._connect(reader, writer, ip, port)
                except BaseException:
                    writer.close()
                    raise
        except TimeoutError:
            raise UpstreamFailed(f"proxy {self.url} did not answer within {timeout:.0f}s") from None
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            if isinstance(exc, UpstreamFailed):
                raise
            raise UpstreamFailed(f"proxy {self.url}: {type(exc).__name__}: {exc}") from None
        return reader, writer

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ip: str, port: int) -> None:
        target = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
        lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
        if self.username is not None:
            token = base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode()
            lines.append(f"Proxy-Authorization: Basic {token}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        first = head.split(b"\r\n", 1)[0]
        status = first.split(b" ")
        if len(status) < 2 or not status[1].startswith(b"2"):
            raise UpstreamFailed(f"proxy {self.url} refused the tunnel: {first.decode(errors='replace')[:200]}")

    async def _socks5(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ip: str, port: int) -> None:
        methods = b"\x00\x02" if self.username is not None else b"\x00"
        writer.write(bytes([5, len(methods)]) + methods)
        version, method = await reader.readexactly(2)
        if version != 5 or method not in methods:
            raise UpstreamFailed(f"proxy {self.url} accepts none of our SOCKS5 methods")
        if method == 2:
            user, password = (self.username or "").encode(), (self.password or "").encode()
            writer.write(bytes([1, len(user)]) + user + bytes([len(password)]) + password)
            _, ok = await reader.readexactly(2)
            if ok != 0:
                raise UpstreamFailed(f"proxy {self.url} refused the credentials")
        address = ipaddress.ip_address(ip)
        atyp, packed = (1, socket.inet_pton(socket.AF_INET, ip)) if address.version == 4 else \
            (4, socket.inet_pton(socket.AF_INET6, ip))
        writer.write(bytes([5, 1, 0, atyp]) + packed + struct.pack("!H", port))
        _, code, _, bound = await reader.readexactly(4)
        if code != 0:
            raise UpstreamFailed(f"proxy {self.url} refused the tunnel (SOCKS5 code {code})")
        skip = {1: 4, 4: 16}.get(bound)
        if skip is None:
            (skip,) = await reader.readexactly(1)
        await reader.readexactly(skip + 2)


def masked(url: str) -> str:
    """``url`` with any credentials replaced by ``***`` (for text that is not yet a parsed proxy)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rsplit("@", 1)[1]
    return f"{scheme}{sep}{authority}{slash}{tail}"
