"""Host names that resolve to loopback addresses without touching ``/etc/hosts``.

The egress proxy resolves every name a page asks for (``NetworkPolicy.resolve``); a policy with a
table in front of it lets a test use names such as a 253-character host or ``shop-4242.test``
against a site on 127.0.0.2, while everything else resolves as usual.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from busscrape.net.addresses import IPAddress
from busscrape.net.policy import NetworkPolicy


@dataclass
class NamedPolicy(NetworkPolicy):
    names: dict[str, str] = field(default_factory=dict)
    """Host name (lower case) -> the loopback address it stands for."""

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        if host.lower().rstrip(".") in self.names:
            return [ipaddress.ip_address(self.names[host.lower().rstrip(".")])]
        return await super().resolve(host, port)
