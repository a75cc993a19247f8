"""The SOCKS5 egress proxy, spoken to directly."""

import asyncio
import struct

from busscrape.net.egress import EgressProxy
from busscrape.net.policy import NetworkPolicy


async def socks_connect(proxy, host: str, port: int) -> tuple[int, asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    writer.write(b"\x05\x01\x00")
    assert await reader.readexactly(2) == b"\x05\x00"
    name = host.encode()
    writer.write(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + struct.pack("!H", port))
    reply = await reader.readexactly(10)
    return reply[1], reader, writer


async def test_allowed_connections_carry_bytes_both_ways(site):
    site.page("/hello", "hello through socks")
    async with EgressProxy(NetworkPolicy.from_settings(["127.0.0.2/32"])) as proxy:
        code, reader, writer = await socks_connect(proxy, "127.0.0.2", site.port)
        assert code == 0
        writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        body = await reader.read()
        writer.close()
    assert b"200 OK" in body and body.endswith(b"hello through socks")


async def test_refusals_are_socks_errors_and_explained(site):
    async with EgressProxy(NetworkPolicy.from_settings(["127.0.0.2/32"])) as proxy:
        code, _, writer = await socks_connect(proxy, "127.0.0.3", site.port)
        writer.close()
        assert code == 2  # connection not allowed by ruleset
        assert "loopback address 127.0.0.3 is not in the allow-list" in proxy.explain("127.0.0.3", site.port)
        code, _, writer = await socks_connect(proxy, "no-such-host.invalid", 80)
        writer.close()
        assert code == 4  # host unreachable
        assert proxy.connections == 0


async def test_a_name_is_checked_by_what_it_resolves_to(site):
    async with EgressProxy(NetworkPolicy.from_settings(["127.0.0.2/32"])) as proxy:
        code, _, writer = await socks_connect(proxy, "localhost", site.port)  # 127.0.0.1 / ::1
        writer.close()
    assert code == 2
