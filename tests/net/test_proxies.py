"""Upstream proxies: parsing and masking, pools, routes, rotation, benching (no browser)."""

import pytest

from busscrape.errors import ConfigurationError, InvalidTask
from busscrape.model.messages import TaskOptions, task_key
from busscrape.net.proxies import Proxies
from busscrape.net.upstream import Upstream, masked
from busscrape.settings import ProxySettings, Settings


def test_proxy_urls_parse_with_credentials_and_show_without():
    p = Upstream.parse("socks5://us%40er:p%3Ass@10.0.0.6")
    assert (p.scheme, p.host, p.port, p.username, p.password) == ("socks5", "10.0.0.6", 1080, "us@er", "p:ss")
    assert p.url == "socks5://10.0.0.6:1080" and "p:ss" not in repr(p) and "us@er" not in str(p)
    assert masked("http://u:secret@h:3128/") == "http://***@h:3128/"
    for bad, why in [("ftp://h:21", "scheme"), ("http://:3128", "no host"), ("http://h:3128/path", "no path")]:
        with pytest.raises(ConfigurationError, match=why):
            Upstream.parse(bad)


def test_credentials_are_masked_in_busscrape_config_but_reach_child_processes():
    from busscrape.settings import settings_env

    s = Settings(proxy={"pools": {"main": ["http://user:hunter2@10.0.0.5:3128"]}})
    shown = s.model_dump(mode="json")["proxy"]["pools"]
    assert shown == {"main": ["http://***@10.0.0.5:3128"]}
    assert "hunter2" in settings_env(s)["BUSSCRAPE_PROXY"]


def test_a_task_carries_no_proxy_credentials_and_old_keys_stay():
    with pytest.raises(ValueError, match="no credentials"):
        TaskOptions(proxy="http://u:p@10.0.0.5:3128")
    assert TaskOptions(proxy="main").proxy == "main"
    # A task without a proxy keeps the key it had before the option existed.
    assert task_key("https://example.com/") == task_key("https://example.com/", options=TaskOptions())
    assert task_key("https://example.com/", options=TaskOptions(proxy="main")) != task_key("https://example.com/")


def proxies(**kw) -> Proxies:
    pools = {"a": ["http://10.0.0.1:1", "http://10.0.0.2:1"], "b": ["socks5://10.0.0.3:1"]}
    return Proxies(ProxySettings(pools=pools, **kw))


def test_round_robin_routes_and_the_task_decide():
    p = proxies(routes={"*.b.test": "b", "plain.test": "direct"}, default_pool="a")
    assert [p.choose(None, "x.test").host for _ in range(4)] == ["10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.2"]
    assert p.choose(None, "www.B.test").host == "10.0.0.3"
    assert p.choose(None, "plain.test") is None
    assert p.choose("direct", "x.test") is None
    assert p.choose("b", "x.test").host == "10.0.0.3"
    assert p.choose("http://10.9.9.9:8080", "x.test").url == "http://10.9.9.9:8080"
    with pytest.raises(InvalidTask, match="no pool 'c'"):
        p.choose("c", "x.test")
    assert proxies().choose(None, "x.test") is None  # no route, no default: direct


def test_sticky_per_host_and_per_session():
    p = proxies(default_pool="a", rotation="sticky_host")
    first = {h: p.choose(None, h) for h in ("h1.test", "h2.test")}
    assert first["h1.test"] != first["h2.test"]
    assert all(p.choose(None, h) == first[h] for h in first for _ in range(3))
    s = proxies(default_pool="a", rotation="sticky_session")
    one = s.choose(None, "h.test", session="s1")
    assert all(s.choose(None, f"h{i}.test", session="s1") == one for i in range(3))
    # Another worker (a fresh Proxies) keeps the proxy the session's record names.
    other = proxies(default_pool="a", rotation="sticky_session")
    assert all(other.choose(None, "h.test", session="s1", prefer=one.url) == one for _ in range(3))


def test_a_failing_proxy_is_benched_then_tried_again():
    p = proxies(default_pool="a", bench_after=2, bench_for=0.2)
    dead = Upstream.parse("http://10.0.0.1:1")
    p.report(dead, False)
    p.report(dead, True)  # a success in between: the count starts again
    p.report(dead, False)
    assert dead.url not in p.benched()
    p.report(dead, False)
    assert p.benched() == [dead.url]
    assert {p.choose(None, "x.test").host for _ in range(4)} == {"10.0.0.2"}


def test_bad_pools_and_routes_name_the_setting():
    with pytest.raises(ConfigurationError, match="ROUTES"):
        Proxies(ProxySettings(pools={"a": ["http://h:1"]}, routes={"*": "nope"}))
    with pytest.raises(ConfigurationError, match="DEFAULT_POOL"):
        Proxies(ProxySettings(default_pool="nope"))
    with pytest.raises(ConfigurationError, match=r"POOLS\[a\]"):
        Proxies(ProxySettings(pools={"a": ["gopher://h:1"]}))


def test_a_pool_from_a_file(tmp_path):
    f = tmp_path / "pool.txt"
    f.write_text("# office\nhttp://u:p@10.0.0.7:3128\n\nsocks5://10.0.0.8:1080  # backup\n")
    p = Proxies(ProxySettings(pool_files={"f": f}, default_pool="f"))
    assert [u.url for u in p.pools["f"]] == ["http://10.0.0.7:3128", "socks5://10.0.0.8:1080"]
