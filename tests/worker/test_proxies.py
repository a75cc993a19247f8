"""Workers through upstream proxies: a forward proxy the tests run on 127.0.0.x logs what passed.

Real nats-server, real Chromium, loopback sites (127.0.0.2, 127.0.0.3) and proxies (127.0.0.5-7)."""

import orjson
import pytest

from busscrape.bus import provision, topology
from busscrape.model.messages import TaskOptions
from busscrape.worker.daemon import Worker
from tests.support import pages
from tests.support.bus import dead_letters, enqueue, results
from tests.support.forward_proxy import ForwardProxy

pytestmark = pytest.mark.browser

PROXY_HOSTS = ("127.0.0.5", "127.0.0.6", "127.0.0.7")


@pytest.fixture
async def pbus(bus, wsettings):
    await provision.apply(bus.js, topology.load(wsettings))
    return bus


def proxied(settings, site, **proxy):
    allow = [f"{h}/32" for h in (*site.hosts, *PROXY_HOSTS)]
    return settings.with_overrides(network={"allow": allow}, proxy=proxy,
                                   worker={"concurrency": 1, "host_concurrency": 4})


async def run(bus, settings):
    async with Worker(bus, settings) as worker:
        await worker.run()
    return worker


def targets(proxy) -> list[str]:
    return [t for t, _ in proxy.log]


async def test_round_robin_over_a_pool_with_credentials_recorded_without_them(pbus, wsettings, site):
    pages.install(site)
    with ForwardProxy("127.0.0.5", user="u", password="hunter2") as a, \
            ForwardProxy("127.0.0.6", user="u", password="hunter2") as b:
        s = proxied(wsettings, site, pools={"main": [a.url(), b.url()]}, default_pool="main")
        for i in range(4):
            await enqueue(pbus.js, site.url(f"/static?n={i}"))
        await run(pbus, s)
        got = await results(pbus.js)
        assert len(got) == 4 and await dead_letters(pbus.js) == []
        # Each page's document and its sub-resources went through one proxy; pages alternate.
        assert len(a.passed) > 0 and len(b.passed) > 0
        assert sorted(r.proxy for r in got) == [a.url(False)] * 2 + [b.url(False)] * 2
        assert all(user == "u" for _, user in a.log + b.log)  # the credentials reached the proxies
        for r in got:
            assert "hunter2" not in orjson.dumps(r.model_dump(mode="json")).decode()


async def test_a_dead_proxy_is_benched_and_the_pool_goes_on(pbus, wsettings, site):
    pages.install(site)
    with ForwardProxy("127.0.0.5", refuse=True) as dead, ForwardProxy("127.0.0.6") as live:
        s = proxied(wsettings, site, pools={"main": [dead.url(), live.url()]}, default_pool="main",
                    bench_after=1, bench_for="1h")
        for i in range(6):
            await enqueue(pbus.js, site.url(f"/static?n={i}"))
        w = await run(pbus, s)
        got = await results(pbus.js)
        assert len(got) == 6 and all(r.proxy == live.url() for r in got)
        # Only the first task ever reached it (bench_after=1): benched for the rest of the run.
        assert len({t for t in targets(dead)}) == 1 and w.proxies.benched() == [dead.url()]


async def test_hosts_map_to_pools_and_stick_to_one_proxy(pbus, wsettings, site):
    pages.install(site)
    with ForwardProxy("127.0.0.5") as a1, ForwardProxy("127.0.0.6") as a2, ForwardProxy("127.0.0.7") as b:
        s = proxied(wsettings, site, pools={"a": [a1.url(), a2.url()], "b": [b.url()]},
                    routes={site.hosts[1]: "b"}, default_pool="a", rotation="sticky_host")
        for i in range(4):
            await enqueue(pbus.js, site.url(f"/static?n={i}", host=0))
            await enqueue(pbus.js, site.url(f"/static?n={i}", host=1))
        await run(pbus, s)
        got = await results(pbus.js)
        assert len(got) == 8
        by_host = {h: {r.proxy for r in got if f"//{h}:" in r.url} for h in site.hosts}
        assert by_host[site.hosts[1]] == {b.url()}
        assert len(by_host[site.hosts[0]]) == 1 and by_host[site.hosts[0]] <= {a1.url(), a2.url()}
        assert all(t.startswith(site.hosts[1]) for t in targets(b))


async def test_a_proxied_request_to_a_blocked_address_is_still_refused(pbus, wsettings, site):
    """The task's proxy (a credential-free URL in options.proxy) is allowed; the target is not."""
    pages.install(site)
    with ForwardProxy("127.0.0.5") as up:
        s = proxied(wsettings, site).with_overrides(
            network={"allow": [f"{site.hosts[0]}/32", "127.0.0.5/32"]})
        await enqueue(pbus.js, site.url("/static", host=1), options=TaskOptions(proxy=up.url()))
        await enqueue(pbus.js, site.url("/static", host=0), options=TaskOptions(proxy=up.url()))
        await run(pbus, s)
        [letter] = await dead_letters(pbus.js)
        assert letter.reason.startswith("blocked") and site.hosts[1] in letter.url
        [ok] = await results(pbus.js)
        assert ok.proxy == up.url() and all(t.startswith(site.hosts[0]) for t in targets(up))


async def test_a_session_keeps_its_proxy_on_another_worker(pbus, wsettings, site, tmp_path):
    """``sticky_session``: the proxy a session used is kept in its record, so another worker (whose
    own round robin would start elsewhere) renders that session's pages through the same proxy."""
    from busscrape.worker.sessions import SessionStore
    from tests.worker.test_sessions import login_site, sessions_file

    login_site(site)
    pages.install(site)
    with ForwardProxy("127.0.0.5") as a, ForwardProxy("127.0.0.6") as b:
        s = proxied(wsettings, site, pools={"main": [a.url(), b.url()]}, default_pool="main",
                    rotation="sticky_session").with_overrides(
            worker={"sessions_file": str(sessions_file(tmp_path, site))})
        # The first worker: a session-less page takes the round robin's first proxy, the session the next.
        await enqueue(pbus.js, site.url("/static"))
        await enqueue(pbus.js, site.url("/private?n=first"), options=TaskOptions(session="shop-9"))
        await run(pbus, s.with_overrides(worker={"name": "w1"}))
        stored = await SessionStore(pbus.js).get("shop-9")
        assert stored is not None and stored.proxy == b.url()
        # Another worker, starting its own round robin at the first proxy, keeps the session's.
        for i in range(3):
            await enqueue(pbus.js, site.url(f"/private?n={i}"), options=TaskOptions(session="shop-9"))
        await run(pbus, s.with_overrides(worker={"name": "w2"}))
        got = [r for r in await results(pbus.js) if r.worker == "w2"]
        assert len(got) == 3 and {r.proxy for r in got} == {b.url()}
        assert {r.title for r in got} == {"secret of alice"}
