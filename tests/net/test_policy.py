from ipaddress import ip_address

import pytest

from busscrape.errors import ConfigurationError, PageNetworkError, PolicyBlocked
from busscrape.net.policy import AllowList, NetworkPolicy


def test_allow_list_forms():
    allow = AllowList.parse(["127.0.0.2/32", "127.0.0.3:8080", "[::1]:9000", "intranet.test", "127.0.0.4"])
    assert allow.allows("127.0.0.2", ip_address("127.0.0.2"), 1)
    assert allow.allows("127.0.0.3", ip_address("127.0.0.3"), 8080)
    assert not allow.allows("127.0.0.3", ip_address("127.0.0.3"), 8081)
    assert allow.allows("::1", ip_address("::1"), 9000)
    assert allow.allows("intranet.test", None, 443)
    assert allow.allows("127.0.0.4", ip_address("127.0.0.4"), 5)
    assert not allow.allows("127.0.0.5", ip_address("127.0.0.5"), 80)
    # an IPv4-mapped IPv6 form of an allowed address is the same address
    assert allow.allows("::ffff:7f00:2", ip_address("::ffff:127.0.0.2"), 80)


@pytest.mark.parametrize("bad", ["127.0.0.1/99", "host:port", "[::1]:x"])
def test_bad_allow_entries_are_configuration_errors(bad):
    with pytest.raises(ConfigurationError, match="BUSSCRAPE_NETWORK__ALLOW"):
        AllowList.parse([bad])


@pytest.mark.parametrize(
    ("url", "reason"),
    [("file:///etc/passwd", "blocked_scheme"), ("ftp://127.0.0.2/", "blocked_scheme"),
     ("javascript:alert(1)", "blocked_scheme"), ("http://127.0.0.9/", "blocked_address"),
     ("http://0x7f000009/", "blocked_address"), ("http://2130706441/", "blocked_address"),
     ("http://0177.0.0.9/", "blocked_address"), ("http://[::ffff:127.0.0.9]/", "blocked_address"),
     ("http://[::1]/", "blocked_address"), ("http://localhost/", "blocked_address"),
     ("http://1.2.3.4.5/", "blocked_invalid_url"), ("http:///nohost", "blocked_invalid_url"),
     # allow-listed, but the URL carries credentials (a page's redirect, a task from before the dispatcher refused them)
     ("http://u:pw@127.0.0.2/", "credentials_in_url"), ("http://@127.0.0.2/", "credentials_in_url")],
)
async def test_blocked_navigations(url, reason):
    policy = NetworkPolicy.from_settings(["127.0.0.2/32"])
    with pytest.raises(PolicyBlocked) as info:
        await policy.check_url(url)
    assert info.value.reason == reason


async def test_allow_listed_navigations_pass():
    policy = NetworkPolicy.from_settings(["127.0.0.2/32", "localhost:8080"])
    await policy.check_url("http://127.0.0.2:1234/x")
    await policy.check_url("http://localhost:8080/")
    with pytest.raises(PolicyBlocked):
        await policy.check_url("http://localhost:8081/")


async def test_unresolvable_name_is_retryable():
    policy = NetworkPolicy.from_settings([])
    with pytest.raises(PageNetworkError) as info:
        await policy.check_url("http://no-such-host.invalid/")
    assert info.value.reason == "dns_error"
