from ipaddress import IPv4Address, IPv6Address

import pytest

from busscrape.net.addresses import InvalidHost, classify, parse_ip_host


@pytest.mark.parametrize(
    ("host", "ip"),
    [("127.0.0.1", "127.0.0.1"), ("0x7f000001", "127.0.0.1"), ("2130706433", "127.0.0.1"),
     ("0177.0.0.1", "127.0.0.1"), ("127.1", "127.0.0.1"), ("0x7f.1", "127.0.0.1"), ("127.0.0.1.", "127.0.0.1"),
     ("0", "0.0.0.0"), ("0x", "0.0.0.0"), ("192.168.0x1.1", "192.168.1.1")],
)
def test_ipv4_forms_browsers_accept(host, ip):
    assert parse_ip_host(host) == IPv4Address(ip)


@pytest.mark.parametrize("host", ["[::1]", "::1", "[::ffff:127.0.0.1]", "[::FFFF:7f00:1]"])
def test_ipv6_forms(host):
    assert isinstance(parse_ip_host(host), IPv6Address)


@pytest.mark.parametrize("host", ["example.com", "xn--bcher-kva.de", "1.example", "localhost", "a.b.c.d.e"])
def test_domains_are_not_addresses(host):
    assert parse_ip_host(host) is None


@pytest.mark.parametrize("host", ["1.2.3.4.5", "256.0.0.1", "09.1.1.1", "1.2.3.09", "4294967296", "[::zz]"])
def test_invalid_numeric_hosts_raise(host):
    with pytest.raises(InvalidHost):
        parse_ip_host(host)


@pytest.mark.parametrize(
    ("ip", "why"),
    [("127.0.0.2", "loopback"), ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("192.168.1.1", "private"),
     ("169.254.169.254", "link_local"), ("224.0.0.1", "multicast"), ("0.0.0.0", "unspecified"),
     ("100.64.0.1", "non_global"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
     ("64:ff9b::7f00:1", "loopback"), ("2002:7f00:1::", "loopback"), ("fe80::1", "link_local"),
     ("fc00::1", "private"), ("240.0.0.1", "reserved"), ("fec0::1", "site_local"), ("feff::1", "site_local")],
)
def test_non_public_addresses_are_classified(ip, why):
    assert classify(parse_ip_host(ip)) == why


@pytest.mark.parametrize("ip", ["93.184.216.34", "2606:4700::1111", "8.8.8.8"])
def test_public_addresses_pass(ip):
    # classification only: these addresses are parsed, never contacted
    assert classify(parse_ip_host(ip)) is None
