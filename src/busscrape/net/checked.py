"""HTTP fetches the worker makes itself (robots.txt, sitemaps) under the network policy, with
the egress proxy's rule: the name is resolved once, by the policy, and the connection goes to
an address it checked (``PolicyResolver``). Asking the policy and then letting the HTTP client
resolve the name again would leave a DNS-rebinding window: a name that answers a public address
to the check and a private one to the connect.

``fetch`` also asks ``check_url`` on every redirect hop (scheme, credentials, the name) and
follows at most ``MAX_REDIRECTS`` of them itself.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from busscrape.errors import PolicyBlocked
from busscrape.net.policy import NetworkPolicy

MAX_REDIRECTS = 5
REDIRECTS = (301, 302, 303, 307, 308)


class AddressRefused(OSError):
    """Every address the name resolved to is refused by the policy (raised inside aiohttp's
    connector, which wraps it in ``ClientConnectorError``: see ``refusal``)."""


class PolicyResolver(AbstractResolver):
    """aiohttp's name resolution through the policy: only addresses it allows are returned."""

    def __init__(self, policy: NetworkPolicy) -> None:
        self.policy = policy

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                      ) -> list[ResolveResult]:
        allowed, reason = await self.policy.admitted(host, port)
        if not allowed:
            raise AddressRefused(reason or f"{host}: no address")
        return [ResolveResult(hostname=host, host=str(ip), port=port,
                              family=socket.AF_INET6 if ip.version == 6 else socket.AF_INET,
                              proto=0, flags=socket.AI_NUMERICHOST) for ip in allowed]

    async def close(self) -> None:
        return None


def session(policy: NetworkPolicy, **kwargs: Any) -> aiohttp.ClientSession:
    """A client session whose every connection is to an address the policy checked."""
    connector = aiohttp.TCPConnector(resolver=PolicyResolver(policy), use_dns_cache=False)
    return aiohttp.ClientSession(connector=connector, trust_env=False, **kwargs)


def refusal(exc: BaseException) -> str | None:
    """The policy's reason when ``exc`` is a connection it refused, else None."""
    cause = getattr(exc, "os_error", None) or exc.__cause__
    return str(cause) if isinstance(cause, AddressRefused) else None


async def read_up_to(stream: aiohttp.StreamReader, max_bytes: int) -> bytes:
    """The body's first ``max_bytes``, or all of it if shorter. ``StreamReader.read(n)`` returns
    what is buffered now (one network chunk, often 16 KiB), not ``n`` bytes: a robots.txt read
    that way loses the rules at its end, a sitemap its later URLs."""
    parts: list[bytes] = []
    left = max_bytes
    while left > 0 and (chunk := await stream.read(left)):
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


@dataclass(frozen=True)
class Fetched:
    url: str
    """Where the last hop landed."""
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes


async def fetch(http: aiohttp.ClientSession, policy: NetworkPolicy, url: str, max_bytes: int) -> Fetched:
    """GET ``url`` (its first ``max_bytes``) through ``http`` (a ``session``), redirects followed
    here with every hop checked. ``PolicyBlocked`` when a hop is refused; aiohttp's errors,
    ``TimeoutError`` and ``OSError`` as they come."""
    for _ in range(MAX_REDIRECTS + 1):
        await policy.check_url(url)
        try:
            async with http.get(url, allow_redirects=False) as response:
                if response.status in REDIRECTS and "location" in response.headers:
                    url = urljoin(url, response.headers["location"])
                    continue
                body = await read_up_to(response.content, max_bytes)
                return Fetched(url, response.status, response.reason or "", dict(response.headers), body)
        except aiohttp.ClientConnectorError as exc:
            if (why := refusal(exc)) is not None:
                raise PolicyBlocked(f"{url}: {why}", reason="blocked_address") from None
            raise
    return Fetched(url, 310, "too many redirects", {}, b"")
