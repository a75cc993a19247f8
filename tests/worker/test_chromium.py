"""The Chromium a worker launches: its switches, its environment, and what it asks the resolver.

Each test reads the real browser's processes (``/proc``) or its own net log; nothing is inferred
from the arguments busscrape meant to pass.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
from pathlib import Path

import pytest

from busscrape.net.egress import EgressProxy
from busscrape.net.policy import AllowList
from busscrape.settings import BrowserSettings
from busscrape.worker.browser.chromium import ENVIRONMENT, PROXIED_ARGS
from busscrape.worker.browser.pool import BrowserPool
from tests.support.names import NamedPolicy

pytestmark = pytest.mark.browser


def pool(settings: BrowserSettings | None = None, proxy_url: str | None = None) -> BrowserPool:
    return BrowserPool(settings or BrowserSettings(), proxy_url=proxy_url, recycle_after_tasks=1000,
                       recycle_rss=2**40)


def argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def browser_pid(p: BrowserPool) -> int:
    """The browser process itself (not a renderer, GPU or utility child). A child it has forked
    and not yet exec'd still has its command line, marker included: the browser is the marked
    process whose parent is not marked (a fresh clone once found two)."""
    marked = {pid for pid in p.pids() if any(x.startswith("--busscrape-pool=") for x in argv(pid))}
    [main] = [pid for pid in marked if parent(pid) not in marked]
    return main


def browser_argv(p: BrowserPool) -> list[str]:
    """The command line of the browser process itself."""
    return argv(browser_pid(p))


async def test_playwrights_own_feature_switches_are_not_replaced():
    async with pool(proxy_url="socks5://127.0.0.1:9") as p:
        args = browser_argv(p)
    # Chromium keeps the last --host-resolver-rules: ours, unquoted.
    assert [a for a in args if a.startswith("--host-resolver-rules=")][-1] == PROXIED_ARGS[0]
    # Chromium keeps only the last --disable-features: there must be one, and it is Playwright's.
    disabled = [a for a in args if a.startswith("--disable-features=")]
    assert len(disabled) == 1, disabled
    playwrights = {"HttpsUpgrades", "PaintHolding", "ThirdPartyStoragePartitioning"}
    assert playwrights <= set(disabled[0].split("=", 1)[1].split(","))
    assert len([a for a in args if a.startswith("--enable-features=")]) == 1


def test_a_feature_list_in_extra_args_is_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"--disable-features=Foo.*replace the list Playwright passes"):
        BrowserSettings(extra_args=["--disable-features=Foo"])


async def test_chromium_starts_with_only_the_environment_it_needs(monkeypatch):
    monkeypatch.setenv("BUSSCRAPE_S3__SECRET_KEY", "s3cret-4242")
    monkeypatch.setenv("BUSSCRAPE_NATS__PASSWORD", "natspw-4242")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-4242")
    async with pool() as p:
        pids = p.pids()
        environments = {pid: Path(f"/proc/{pid}/environ").read_bytes() for pid in pids}
        main = browser_pid(p)
    assert len(environments) >= 3  # the browser, a zygote, a renderer or utility at least
    for pid, env in environments.items():
        assert b"4242" not in env, pid
    names = {entry.split(b"=", 1)[0].decode() for entry in environments[main].split(b"\0") if entry}
    assert names <= set(ENVIRONMENT), names - set(ENVIRONMENT)
    assert "PATH" in names


# A page naming hosts that only the egress proxy may resolve: a sub-resource, a prefetch hint, a
# preconnect, a link. Chromium is told to resolve nothing itself.
NAMES_PAGE = """<title>names</title>
<link rel="dns-prefetch" href="//prefetch-4242.test"><link rel="preconnect" href="http://preconnect-4242.test">
<a href="http://anchor-4242.test/">a</a><img src="http://img-4242.test/x.png">"""


async def test_chromium_leaves_every_name_to_the_egress_proxy(site, tmp_path):
    site.page("/names", NAMES_PAGE)
    site.page("/hello", "<title>hello by name</title>")
    netlog = tmp_path / "net.json"
    # shop-4242.test is a name only the proxy knows (for 127.0.0.2); the others resolve nowhere.
    policy = NamedPolicy(AllowList.parse([f"{h}/32" for h in site.hosts]), names={"shop-4242.test": site.hosts[0]})
    async with EgressProxy(policy) as proxy:
        async with pool(BrowserSettings(extra_args=[f"--log-net-log={netlog}"]), proxy_url=proxy.url) as p, \
                p.tab() as tab:
            await tab.page.goto(site.url("/names"), wait_until="load")
            # A name still works: the proxy resolves it.
            await tab.page.goto(f"http://shop-4242.test:{site.port}/hello")
            assert await tab.page.title() == "hello by name"
    log = json.JSONDecoder().raw_decode(netlog.read_text())[0]
    kinds = {number: name for name, number in log["constants"]["logEventTypes"].items()}
    asked = [e["params"]["host"] for e in log["events"]
             if kinds.get(e["type"]) == "HOST_RESOLVER_MANAGER_REQUEST" and "host" in e.get("params", {})]
    named = {h for h in asked if not _ip_literal(h.split("://", 1)[-1].rsplit(":", 1)[0])}
    # Only the rule's own placeholder, which fails at once; no name a page chose. (Playwright adds
    # a rule of its own for SOCKS proxies, but with quotes inside the value, which Chromium
    # ignores: without ours the page's names above reach the resolver.)
    assert named <= {"http://~notfound", f"http://~notfound:{site.port}"}, named
    assert asked  # the log did record the browser's resolver requests


def _ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _driver_starts(monkeypatch) -> list[int]:
    """Count the starts of Playwright's driver that ``playwright_chromium`` asks for."""
    import playwright.sync_api

    starts: list[int] = []

    def sync_playwright():  # the driver is not started: only whether it would have been matters
        starts.append(1)
        raise RuntimeError("not started in this test")

    monkeypatch.setattr(playwright.sync_api, "sync_playwright", sync_playwright)
    return starts


def test_without_any_playwright_download_its_driver_is_not_started_to_look(monkeypatch, tmp_path):
    from busscrape.worker.browser.chromium import playwright_chromium

    starts = _driver_starts(monkeypatch)
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", str(tmp_path))
    assert playwright_chromium() is None
    assert starts == []
    (tmp_path / "chromium-1234").mkdir()  # a download: only the driver knows whether it is its revision
    assert playwright_chromium() is None
    assert starts == [1]


async def test_a_pool_launches_through_a_driver_started_ahead_and_stops_it(site):
    """``busscrape worker`` starts Playwright's driver before its settings are read and hands it
    to the pool: the pool's browser runs on that driver, and leaving the pool stops it."""
    import asyncio

    from busscrape.worker.browser.driver import start_driver, stop_driver

    site.page("/one", "<title>one</title>")
    driver = start_driver()
    async with BrowserPool(BrowserSettings(), proxy_url=None, recycle_after_tasks=1000, recycle_rss=2**40,
                           idle_tabs=1, driver=driver) as pool:
        playwright = driver.result()
        assert pool._pw is playwright and pool.up
        async with pool.tab() as tab:
            await tab.page.goto(site.url("/one"))
            assert await tab.page.title() == "one"
    # Stopped with the pool: its connection is closed, and stopping it again is harmless.
    with pytest.raises(Exception, match=r"closed|stopped|disconnected"):
        await asyncio.wait_for(playwright.chromium.launch(), timeout=30)
    await stop_driver(driver)


def _drivers() -> dict[int, dict[str, str]]:
    """This process's Playwright drivers (node … run-driver) and their environments."""
    found = {}
    for children in Path("/proc/self/task").glob("*/children"):
        for pid in map(int, children.read_text().split()):
            with contextlib.suppress(OSError):
                if "run-driver" in argv(pid):
                    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    found[pid] = dict(e.decode().split("=", 1) for e in env if b"=" in e)
    return found


async def test_every_driver_keeps_its_compiled_code_in_nodes_compile_cache(monkeypatch, tmp_path):
    """Node compiles Playwright's driver again at each boot unless NODE_COMPILE_CACHE names a
    folder (worker/browser/driver.py): a pool's own driver and one started ahead both get one —
    Node's default under the temporary folder, or the environment's — and Node fills it."""
    import tempfile

    from busscrape.worker.browser.driver import start_driver, stop_driver

    monkeypatch.delenv("NODE_COMPILE_CACHE", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    default = tmp_path / "node-compile-cache"
    async with pool():
        [env] = _drivers().values()
        assert env.get("NODE_COMPILE_CACHE") == str(default)
    assert [p for p in default.rglob("*") if p.is_file()], "the driver left nothing in its compile cache"

    own = tmp_path / "the-operators-own"
    monkeypatch.setenv("NODE_COMPILE_CACHE", str(own))
    driver = start_driver()
    await driver
    [env] = _drivers().values()
    assert env["NODE_COMPILE_CACHE"] == str(own)
    await stop_driver(driver)
    assert [p for p in own.rglob("*") if p.is_file()]
