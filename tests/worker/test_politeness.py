"""Fleet-wide politeness: per-host slots and starts on NATS KV, deferrals, cooling, lease expiry.

Real nats-server; the worker tests run real worker processes with Chromium against loopback sites
whose own request log is what the assertions read."""

import asyncio
import itertools
import threading
import time

import pytest
from aiohttp import web

from busscrape.bus import names, provision, topology
from busscrape.bus.connection import Bus
from busscrape.errors import ConfigurationError
from busscrape.worker.daemon import Worker
from busscrape.worker.fleet_gate import Deferred, FleetGate, Slot, Wait, cooling_hosts, host_of, host_token
from busscrape.worker.host_rules import HostRules, Limit
from tests.support import pages
from tests.support.bus import dead_letters, enqueue, results, two_workers, wait_until
from tests.support.procs import env_for, kill9, spawn
from tests.support.relay import Relay

# -- rules and keys ----------------------------------------------------------------------------


def test_host_tokens_are_valid_keys_and_reversible():
    for host in ("example.com", "127.0.0.2", "::1", "a_b.example", "xn--bcher-kva.example", "trailing.", "a..b"):
        token = host_token(host)
        assert all(c.isalnum() or c in "-_=." for c in token), token
        assert ".." not in token and not token.startswith(".") and not token.endswith(".")
        assert host_of(token) == host.lower().rstrip(".")
    assert host_token("a_b") != host_token("a.b")


def test_rules_first_matching_glob_wins_and_keeps_the_defaults_it_leaves_out(tmp_path):
    path = tmp_path / "politeness.toml"
    path.write_text('[[host]]\nglob = "*.slow.test"\nconcurrency = 1\ndelay = "2s"\n'
                    '[[host]]\nglob = "*.test"\njitter = "500ms"\n')
    rules = HostRules.load(Limit(4, 0.1, 0.0), path)
    assert rules.limit("A.slow.test") == Limit(1, 2.0, 0.0)
    assert rules.limit("b.test") == Limit(4, 0.1, 0.5)
    assert rules.limit("other.example") == Limit(4, 0.1, 0.0)


def test_a_raised_delay_applies_on_top_and_never_lowers():
    rules = HostRules(Limit(2, 1.0))
    rules.raise_delay("robots.test", 0.5)  # less than the rule: the rule stays
    assert rules.limit("robots.test").delay == 1.0
    rules.raise_delay("robots.test", 3.0)
    rules.raise_delay("robots.test", 2.0)
    assert rules.limit("ROBOTS.test").delay == 3.0
    assert rules.limit("other.test").delay == 1.0


@pytest.mark.parametrize("text, needle", [
    ('[[host]]\nconcurrency = 1\n', "'glob'"),
    ('[[host]]\nglob = "*"\nconcurrency = 0\n', "'concurrency'"),
    ('[[host]]\nglob = "*"\ndelay = "soon"\n', "'delay'"),
    ('[[host]]\nglob = "*"\nspeed = 3\n', "speed"),
    ('[[hosts]]\nglob = "*"\n', "hosts"),
    ('[[host]\n', "cannot read"),
])
def test_a_bad_politeness_file_names_the_file_and_the_field(tmp_path, text, needle):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(ConfigurationError) as err:
        HostRules.load(Limit(1, 0), path)
    assert str(path) in str(err.value) and needle in str(err.value)


# -- the gate against nats-server --------------------------------------------------------------


@pytest.fixture
async def pbus(bus, settings):
    await provision.apply(bus.js, topology.load(settings.with_overrides(streams={"host_lease_ttl": "3s"})))
    return bus


def gate(bus, limit: Limit, name: str) -> FleetGate:
    return FleetGate(bus.js, HostRules(limit), holder=name, busy_retry=0.5)


async def test_slots_are_shared_by_every_gate_and_free_again_on_release(pbus):
    one, two = gate(pbus, Limit(2, 0), "w1"), gate(pbus, Limit(2, 0), "w2")
    a, b = await one.enter("h.test"), await two.enter("h.test")
    assert isinstance(a, Slot) and isinstance(b, Slot)
    third = await two.enter("h.test")
    assert isinstance(third, Wait) and third.why == "busy"
    assert isinstance(await one.enter("other.test"), Slot)  # another host is not affected
    await a.release()
    again = await two.enter("h.test")
    assert isinstance(again, Slot)
    for s in (b, again):
        await s.release()


@pytest.mark.timing
async def test_starts_are_spaced_by_the_delay_across_gates(pbus):
    one, two = gate(pbus, Limit(5, 2.0), "w1"), gate(pbus, Limit(5, 2.0), "w2")
    first, second = await one.enter("d.test"), await two.enter("d.test")
    assert isinstance(first, Slot) and isinstance(second, Slot)  # nothing started yet: both may go
    assert await first.start() == 0.0
    # Taken right before the navigation: the first one took it, and holds it one more delay
    # until its request is sent (the delay counts from the request as the site sees it).
    left = await second.start()
    assert 3.0 < left <= 4.0
    with pytest.raises(Deferred):
        await second.start_or_defer()
    await first.sent(time.time() + 0.5)  # the browser sent the first request half a second later
    left = await second.start()
    assert 2.0 < left <= 2.5, left
    await second.release()
    later = await two.enter("d.test")  # now seen before any tab is taken
    assert isinstance(later, Wait) and later.why == "delay" and 2.0 < later.seconds <= 2.5
    await first.release()


@pytest.mark.timing
async def test_an_unreleased_slot_expires_with_the_lease_ttl(pbus):
    """A holder that stops renewing (its process died) loses the slot within the bucket's TTL."""
    one = gate(pbus, Limit(1, 0), "w1")
    held = await one.enter("k.test")
    assert isinstance(held, Slot)
    held._renewing.cancel()  # what a SIGKILL does to the renewals; the key stays
    assert isinstance(await one.enter("k.test"), Wait)
    started = time.monotonic()
    await wait_until(lambda: _enters(one, "k.test"), timeout=20)
    assert time.monotonic() - started < 20


async def test_a_slot_whose_holder_expires_during_the_take_is_busy_for_now_not_an_error(pbus):
    """nats-py's ``create`` answers a taken key by reading it again (a delete marker would be
    free); when the holder's key expires in between, the read finds nothing and ``create`` raises
    ``KeyNotFoundError``. Seen in a fresh-clone run as ``enter`` raising: it is "busy, ask again"
    (the next ask takes it)."""
    one = gate(pbus, Limit(1, 0), "w1")
    held = await one.enter("x.test")
    assert isinstance(held, Slot)
    held._renewing.cancel()  # a dead holder: its key stays until it expires
    kv = one._hosts  # the gate's own handle on the bucket
    assert kv is not None
    reread = kv._get  # what create reads the key with (nats-py 2.16)

    async def expired_before_the_reread(key: str, *args: object, **kwargs: object) -> object:
        # The expiry, on the server, exactly between create's refused write and its read.
        await pbus.js.purge_stream(names.kv_stream(names.HOSTS_BUCKET), subject=f"$KV.{names.HOSTS_BUCKET}.{key}")
        return await reread(key, *args, **kwargs)

    kv._get = expired_before_the_reread  # type: ignore[method-assign]
    try:
        assert isinstance(await one.enter("x.test"), Wait)
    finally:
        kv._get = reread  # type: ignore[method-assign]
    assert await _enters(one, "x.test")  # and then it is free


async def _enters(g: FleetGate, host: str) -> bool:
    got = await g.enter(host)
    if isinstance(got, Slot):
        await got.release()
        return True
    return False


@pytest.mark.timing
async def test_a_renewed_slot_outlives_the_ttl(pbus):
    one = gate(pbus, Limit(1, 0), "w1")
    one.ttl = 3.0
    held = await one.enter("r.test")
    assert isinstance(held, Slot)
    first = held.revision
    kv = await pbus.js.key_value(names.HOSTS_BUCKET)
    taken = time.monotonic()

    async def past_the_ttl() -> bool:
        return time.monotonic() - taken > 1.5 * one.ttl

    await wait_until(past_the_ttl, timeout=20)
    kept = await kv.get(held.key)
    assert kept.value == held.value and kept.value.startswith(b"w1 ")  # renewed, still there, naming its holder
    assert kept.revision == held.revision > first
    assert isinstance(await one.enter("r.test"), Wait)
    await held.release()


@pytest.mark.timing
async def test_cooling_reaches_every_gate_and_status(pbus):
    one, two = gate(pbus, Limit(2, 0), "w1"), gate(pbus, Limit(2, 0), "w2")
    watch = asyncio.create_task(two.watch_cooling())
    try:
        await one.cool("hot.test", 30, status=429, worker="w1")
        await wait_until(lambda: _cooling_seen(two, "hot.test"), timeout=10, every=0.05)
        wait = await two.enter("hot.test")
        assert isinstance(wait, Wait) and wait.why == "cooling" and 20 < wait.seconds <= 30
        assert isinstance(await two.enter("cold.test"), Slot)
        listed = await cooling_hosts(pbus.js)
        assert [(c.host, c.status, c.worker) for c in listed] == [("hot.test", 429, "w1")]
    finally:
        watch.cancel()


async def _cooling_seen(g, host):
    return g._cooling_left(host) > 0


async def test_a_gate_forgets_coolings_that_ran_out_though_their_expiry_sends_no_event(pbus):
    """COOLING's max_age removes a key without a delete event: a gate that kept every cooling it
    saw would grow with every host that ever answered 429, for the life of the worker."""
    one, two = gate(pbus, Limit(2, 0), "w1"), gate(pbus, Limit(2, 0), "w2")
    watch = asyncio.create_task(two.watch_cooling())
    try:
        for n in range(5):
            await one.cool(f"brief{n}.test", 0.3, status=429, worker="w1")
        await wait_until(lambda: _all_seen(two, 5), timeout=10, every=0.05)
        ran_out = time.time() + 0.4

        async def over() -> bool:
            return time.time() > ran_out

        await wait_until(over, timeout=5, every=0.05)
        await one.cool("long.test", 30, status=503, worker="w1")
        await wait_until(lambda: _cooling_seen(two, "long.test"), timeout=10, every=0.05)
        assert set(two.cooling) == {"long.test"}
        assert set(one.cooling) == {"long.test"}
    finally:
        watch.cancel()


async def _all_seen(g, n):
    return len(g.cooling) >= n


# -- real workers, real Chromium ---------------------------------------------------------------


class Log:
    """The site's own log of page requests: (host, path, start, end), wall clock."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, float, float]] = []
        self.lock = threading.Lock()

    def peak(self, host: str) -> int:
        events = sorted([(s, 1) for h, _, s, _ in self.rows if h == host]
                        + [(e, -1) for h, _, _, e in self.rows if h == host], key=lambda x: (x[0], x[1]))
        now = peak = 0
        for _, step in events:
            now += step
            peak = max(peak, now)
        return peak

    def starts(self, host: str) -> list[float]:
        return sorted(s for h, _, s, _ in self.rows if h == host)


def logged_page(site, log: Log, path: str = "/page") -> None:
    refused: set[str] = set()

    @site.route(path)
    async def page(request: web.Request) -> web.StreamResponse:
        start = time.time()
        await asyncio.sleep(float(request.query.get("s", "0.5")))
        refuse = bool(request.query.get("code")) and request.path_qs not in refused
        refused.add(request.path_qs)  # the first request of such a page is refused, the next one served
        with log.lock:
            log.rows.append((request.host.split(":")[0], request.path_qs, start, time.time()))
        if refuse:
            return web.Response(status=int(request.query["code"]), text="busy", content_type="text/html",
                                headers={"Retry-After": request.query.get("after", "5")})
        return web.Response(text="<title>p</title><p>ok</p>", content_type="text/html")


def fleet_env(settings, **extra):
    return env_for(settings, BUSSCRAPE_WORKER__CONCURRENCY="4", BUSSCRAPE_WORKER__EXIT_WHEN_IDLE="4s",
                   BUSSCRAPE_WORKER__NAVIGATION_TIMEOUT="20s", BUSSCRAPE_WORKER__HOST_BUSY_RETRY="300ms",
                   BUSSCRAPE_WORKER__REAPER="false", **extra)


async def run_fleet(tmp_path, env, n=3):
    procs = [spawn(["worker"], {**env, "BUSSCRAPE_WORKER__NAME": f"w{i}"}, tmp_path / f"w{i}.log") for i in range(n)]
    codes = await asyncio.gather(*(asyncio.to_thread(p.wait, 300) for p in procs))
    assert codes == [0] * n, [(tmp_path / f"w{i}.log").read_text()[-3000:] for i in range(n)]


@pytest.mark.timing
@pytest.mark.browser
async def test_three_workers_keep_one_hosts_limits_and_leave_another_host_alone(bus, wsettings, site,
                                                                                 tmp_path):
    """3 worker processes × concurrency 4; host A at host_concurrency=2 and host_delay 1 s (a rule),
    host B at the default 12: A never sees more than 2 pages at once nor two starts closer than the
    delay (less what the trip from a worker's navigation to the site may shift a start by), nor
    10 starts in less than 9 delays; B gets more than 2 at once."""
    log = Log()
    logged_page(site, log)
    rules = tmp_path / "politeness.toml"
    delay = 1.0
    rules.write_text(f'[[host]]\nglob = "{site.hosts[0]}"\nconcurrency = 2\ndelay = "{delay}s"\n')
    s = wsettings.with_overrides(worker={"host_concurrency": 12}, streams={"worker_max_deliver": 1})
    await provision.apply(bus.js, topology.load(s))
    for i in range(10):
        await enqueue(bus.js, site.url(f"/page?s=0.6&n={i}", host=0))
        await enqueue(bus.js, site.url(f"/page?s=1.5&n={i}", host=1))
    await run_fleet(tmp_path, fleet_env(s, BUSSCRAPE_WORKER__HOST_RULES=str(rules),
                                        BUSSCRAPE_WORKER__HOST_CONCURRENCY="12",
                                        BUSSCRAPE_STREAMS__WORKER_MAX_DELIVER="1"))
    a, b = site.hosts
    assert len(log.starts(a)) == 10 and len(log.starts(b)) == 10, log.rows
    assert log.peak(a) <= 2, log.rows
    starts = log.starts(a)
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    # The gate's starts are `delay` apart; the site sees each one a trip later, and the trips
    # differ (0.31 s seen in CI, where 3 workers' Chromiums share 2 cores with the suite). Each
    # gap may lose up to one trip; the whole run at most its first start's trip, so the span
    # checks the pace itself. Without the delay two slots start together (gaps near 0).
    trip = 0.5
    assert min(gaps) >= delay - trip, gaps
    assert starts[-1] - starts[0] >= len(gaps) * delay - trip, gaps
    assert log.peak(b) > 2, log.rows
    # Every deferral spent no attempt: with one attempt allowed, nothing was dead-lettered.
    assert len(await results(bus.js)) == 20 and await dead_letters(bus.js) == []


@pytest.mark.browser
async def test_the_site_sees_one_host_delay_between_every_two_page_requests(bus, wsettings, site,
                                                                            nats_server):
    """#36.5: ``delay`` is a floor between page requests as the site sees them, not between the
    gate's writes. Two workers, one slot, a 1 s delay; one worker's link is slow (the server's
    answers to its HOSTS writes reach it 0.4 s late, so its request goes out 0.4 s after its
    start was written). The site's log of request arrivals has every gap at least 1 s, less
    the site's own few milliseconds (a correctness bound, not a speed one); before, the slow
    worker's start counted from its write and the next page came 0.6 s after its request."""
    log = Log()
    logged_page(site, log)
    delay = 1.0
    s = wsettings.with_overrides(worker={"concurrency": 2, "host_concurrency": 1, "host_delay": f"{delay}s",
                                         "host_busy_retry": "100ms", "exit_when_idle": "3s"},
                                 streams={"worker_max_deliver": 1})
    await provision.apply(bus.js, topology.load(s))
    for i in range(8):
        await enqueue(bus.js, site.url(f"/page?s=0.05&n={i}"))
    hosts_ack = f'"stream":"{names.kv_stream(names.HOSTS_BUCKET)}"'.encode()
    async with Relay(nats_server.port) as relay:
        relay.lag = lambda payload: 0.4 if payload.startswith(b"{") and hosts_ack in payload else 0.0
        async with await Bus.connect(s.with_overrides(nats={"url": relay.url}), name="slow-worker") as slow:
            one, two = await two_workers(slow, s)
    starts = log.starts(site.hosts[0])
    assert len(starts) == 8 and len(await results(bus.js)) == 8, log.rows
    assert one.counters["completed"] > 0 and two.counters["completed"] > 0  # both took pages
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    # Less a few milliseconds: the site stamps a request when its handler runs (its loop shares the
    # GIL with the test's), and one request's way through Chromium, the egress proxy and the site
    # can take that much longer than the next one's, so no sender can space arrivals exactly (a
    # fresh-clone run at load ~13 saw 0.9955 s). The bug this guards against left 0.6 s.
    assert min(gaps) >= delay - 0.05, gaps


@pytest.mark.timing
@pytest.mark.browser
async def test_a_429_with_retry_after_cools_its_host_for_the_fleet_only(bus, wsettings, site, tmp_path):
    log = Log()
    logged_page(site, log)
    s = wsettings.with_overrides(worker={"host_concurrency": 1, "retry_base_delay": "200ms"})
    await provision.apply(bus.js, topology.load(s))
    a, b = site.hosts
    await enqueue(bus.js, site.url("/page?s=0.1&code=429&after=5", host=0))
    for i in range(4):
        await enqueue(bus.js, site.url(f"/page?s=0.1&n={i}", host=0))
    for i in range(12):
        await enqueue(bus.js, site.url(f"/page?s=0.8&n={i}", host=1))
    await run_fleet(tmp_path, fleet_env(s, BUSSCRAPE_WORKER__HOST_CONCURRENCY="1"))
    refused = next(r for r in log.rows if "code=429" in r[1])
    after = [r[2] for r in log.rows if r[0] == a and r[2] > refused[3]]
    assert after and min(after) - refused[3] >= 5.0, (refused, sorted(after))
    assert any(refused[3] < r[2] < refused[3] + 5 for r in log.rows if r[0] == b), log.rows  # B went on
    assert len(await results(bus.js)) == 17  # the refused page too, once the cooling was over


@pytest.mark.timing
@pytest.mark.browser
async def test_a_sigkilled_workers_slot_is_free_within_the_lease_ttl(bus, wsettings, site, tmp_path):
    pages.install(site)
    s = wsettings.with_overrides(streams={"host_lease_ttl": "3s"})
    await provision.apply(bus.js, topology.load(s))
    await enqueue(bus.js, site.url("/slow?s=60"))
    proc = spawn(["worker"], fleet_env(s, BUSSCRAPE_WORKER__HOST_CONCURRENCY="1"), tmp_path / "w.log")
    kv = await bus.js.key_value(names.HOSTS_BUCKET)
    key = f"slot.{host_token(site.hosts[0])}.0"

    revisions: set[int] = set()

    async def renewed() -> bool:  # held, and renewed once at least: the worker keeps it
        try:
            revisions.add((await kv.get(key)).revision)
        except Exception:
            return False
        return len(revisions) > 1

    try:
        await wait_until(renewed, timeout=60)
    finally:
        kill9(proc)
    # Within the 3 s TTL, plus what the server's expiry sweep and this busy machine add.
    await wait_until(lambda: _gone(kv, key), timeout=3.0 + 5.0, every=0.1)
    g = FleetGate(bus.js, HostRules(Limit(1, 0)), holder="t", busy_retry=0.5)
    slot = await g.enter(site.hosts[0])
    assert isinstance(slot, Slot)
    await slot.release()


async def _gone(kv, key) -> bool:
    try:
        await kv.get(key)
    except Exception:
        return True
    return False


@pytest.mark.timing
@pytest.mark.browser
async def test_waiting_for_a_busy_host_does_not_count_against_task_timeout(bus, wsettings, site):
    """Three three-second pages on one host, one at a time, an eight-second task_timeout: each
    task's clock starts when the host lets it in, so none times out waiting for the others (the
    third would wait six, nine seconds in all); and a deferral spends no attempt (one allowed).
    Five seconds of margin for a page's own overhead on a loaded machine (one, then two, were seen
    to be too little)."""
    pages.install(site)
    s = wsettings.with_overrides(worker={"concurrency": 3, "host_concurrency": 1, "task_timeout": "8s",
                                         "exit_when_idle": "3s", "host_busy_retry": "200ms"},
                                 streams={"worker_max_deliver": 1})
    await provision.apply(bus.js, topology.load(s))
    for i in range(3):
        await enqueue(bus.js, site.url(f"/slow?s=3&n={i}"))
    async with Worker(bus, s) as worker:
        counters = await worker.run()
    assert counters["completed"] == 3 and counters.get("retried", 0) == 0, dict(counters)
    assert counters["deferred"] > 0, dict(counters)
    assert len(await results(bus.js)) == 3 and await dead_letters(bus.js) == []


@pytest.mark.browser
async def test_killed_on_every_attempt_the_worker_files_the_letter_despite_the_deferral_room(
        bus, wsettings, site, tmp_path):
    """The consumer's max_deliver leaves room for deferrals, so the server's advisory (and the
    reaper) would come only after that room; the worker itself dead-letters the delivery after the
    last attempt."""
    stamps = pages.install(site)
    s = wsettings.with_overrides(streams={"worker_ack_wait": "3s", "worker_max_deliver": 2})
    await provision.apply(bus.js, topology.load(s))
    task = await enqueue(bus.js, site.url("/slow?s=60"))
    for delivery in (1, 2):
        victim = spawn(["worker"], fleet_env(s, BUSSCRAPE_WORKER__NAME=f"victim{delivery}"), tmp_path / "v.log")
        try:
            async def hit(n=delivery) -> bool:
                return len(stamps.get("/slow", [])) >= n

            await wait_until(hit, timeout=60)
        finally:
            kill9(victim)
    async with Worker(bus, s.with_overrides(worker={"exit_when_idle": "8s"})) as worker:
        await worker.run()
    [letter] = await dead_letters(bus.js)
    assert letter.stage == "worker" and letter.reason == "max_deliveries" and letter.task_id == task.task_id
    # What happened, not "each delivery's worker died" as a guess: both attempts reached the page.
    assert letter.error.startswith("2 attempts reached the page, none with its outcome recorded (max_deliver 2): "
                                   "2 deliveries, 2 of them reached the page; 2 ended without an outcome (the "
                                   "worker died or went silent mid-attempt)"), letter.error
    assert worker.counters.get("completed", 0) == 0 and len(stamps["/slow"]) == 2



@pytest.mark.browser
async def test_two_slots_on_a_host_without_a_delay_are_two_pages_at_once_never_more(bus, wsettings, site):
    """No delay to space the starts: only the slots keep the host at two pages at once across two
    workers of three tabs each, and the pages are long enough that both slots are used together."""
    log = Log()
    logged_page(site, log)
    s = wsettings.with_overrides(worker={"concurrency": 3, "host_concurrency": 2, "host_delay": 0,
                                         "host_busy_retry": "200ms", "exit_when_idle": "3s"},
                                 streams={"worker_max_deliver": 1})
    await provision.apply(bus.js, topology.load(s))
    for i in range(8):
        await enqueue(bus.js, site.url(f"/page?s=1.5&n={i}"))
    one, two = await two_workers(bus, s)
    host = site.hosts[0]
    assert len(log.starts(host)) == 8 and len(await results(bus.js)) == 8
    assert log.peak(host) == 2, log.rows
    assert one.counters["deferred"] + two.counters["deferred"] > 0  # the third tab of each waited


@pytest.mark.browser
async def test_a_503_without_retry_after_cools_its_host_for_cool_default(bus, wsettings, site):
    log = Log()
    cooling = 4.0

    @site.route("/busy")
    async def busy(request: web.Request) -> web.StreamResponse:
        start = time.time()
        first = not any(path.startswith("/busy") for _, path, _, _ in log.rows)
        with log.lock:
            log.rows.append((request.host.split(":")[0], request.path_qs, start, time.time()))
        if first:  # no Retry-After: the worker's cool_default says how long
            return web.Response(status=503, text="busy", content_type="text/html")
        return web.Response(text="<title>p</title>", content_type="text/html")

    s = wsettings.with_overrides(worker={"concurrency": 2, "host_concurrency": 2, "cool_default": f"{cooling}s",
                                         "retry_base_delay": "200ms", "retry_max_delay": "10s",
                                         "host_busy_retry": "200ms", "exit_when_idle": "3s"})
    await provision.apply(bus.js, topology.load(s))
    await enqueue(bus.js, site.url("/busy?n=refused"))
    async with Worker(bus, s) as worker:
        running = asyncio.create_task(worker.run())
        await wait_until(lambda: _cooled(bus, site.hosts[0]), timeout=60, every=0.05)
        for i in range(3):  # queued once the host is cooling: they find it so
            await enqueue(bus.js, site.url(f"/busy?n={i}"))
        await running
    refused_at = log.rows[0][3]
    later = [start for _, _, start, _ in log.rows[1:]]
    assert len(later) == 4 and min(later) - refused_at >= cooling, (refused_at, later)  # the refused one too
    assert len(await results(bus.js)) == 4 and worker.counters["deferred"] > 0


async def _cooled(bus, host: str) -> bool:
    return [(c.host, c.status) for c in await cooling_hosts(bus.js)] == [(host, 503)]


@pytest.mark.browser
async def test_without_fleet_politeness_a_worker_keeps_no_host_limit(bus, wsettings, site):
    """``worker.fleet_politeness = false``: the host limits are not enforced (no slots, no
    deferrals): three pages at once on a host whose limit is one page every two seconds."""
    log = Log()
    logged_page(site, log)
    s = wsettings.with_overrides(worker={"concurrency": 3, "host_concurrency": 1, "host_delay": "2s",
                                         "fleet_politeness": False, "exit_when_idle": "2s"})
    await provision.apply(bus.js, topology.load(s))
    for i in range(3):
        await enqueue(bus.js, site.url(f"/page?s=2&n={i}"))
    async with Worker(bus, s) as worker:
        await worker.run()
    assert log.peak(site.hosts[0]) == 3, log.rows
    assert worker.counters["completed"] == 3 and worker.counters.get("deferred", 0) == 0
