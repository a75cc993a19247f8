"""Workers that die, get stopped, or lose their browser — real processes, real signals."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import subprocess

import pytest

from busscrape.bus import names, provision, topology
from busscrape.ops.lifeline import running
from tests.support import pages
from tests.support.bus import count, dead_letters, enqueue, results, wait_until
from tests.support.procs import env_for, kill9, leftover_chromium, spawn
from tests.support.relay import Relay, result_publish, task_ack
from tests.worker.test_daemon import (
    LEFTOVER_OPTIONS,
    after_a_death_after_storing,
    after_a_death_before_the_ack,
    run_worker,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def stamps(site):
    return pages.install(site)


async def fast_redelivery_streams(bus, settings, deferrals: int):
    """Streams with a 3s ack_wait, so a dead worker's task comes back quickly; two deliveries
    that reach the page, and ``deferrals`` more that do not."""
    s = settings.with_overrides(streams={"worker_ack_wait": "3s", "worker_max_deliver": 2,
                                          "worker_max_deferrals": deferrals})
    await provision.apply(bus.js, topology.load(s))
    return s


@pytest.fixture
async def fast_redelivery(bus, wsettings):
    """No room for deliveries that do not reach the page: the second delivery is the last."""
    return await fast_redelivery_streams(bus, wsettings, deferrals=0)


@pytest.fixture
async def fast_redelivery_with_room(bus, wsettings):
    """Room for two deliveries that never reach the page (a worker whose request Chromium dropped
    when this machine's network changed: an outage, which naks the task without spending an
    attempt) for the tests that are not about reaping."""
    return await fast_redelivery_streams(bus, wsettings, deferrals=2)


def start_worker(settings, tmp_path, name: str) -> subprocess.Popen[bytes]:
    env = env_for(settings, BUSSCRAPE_WORKER__NAME=name, BUSSCRAPE_WORKER__CONCURRENCY="1")
    return spawn(["worker"], env, tmp_path / f"{name}.log")


async def wait_for_hit(stamps, path: str, n: int, timeout: float = 60) -> None:
    async def hit():
        return len(stamps.get(path, [])) >= n

    await wait_until(hit, timeout)


async def test_sigkill_mid_render_redelivers_to_another_worker_and_ends_with_one_result(
        bus, fast_redelivery_with_room, site, stamps, tmp_path):
    await enqueue(bus.js, site.url("/slow?s=4"))
    victim = start_worker(fast_redelivery_with_room, tmp_path, "victim")
    try:
        await wait_for_hit(stamps, "/slow", 1)
        kill9(victim)
    finally:
        kill9(victim)
    assert await results(bus.js) == []
    survivor = await run_worker(bus, fast_redelivery_with_room, exit_when_idle=10)
    [result] = await results(bus.js)
    assert result.attempt == 2 and result.worker == fast_redelivery_with_room.worker.name
    assert survivor.counters["completed"] == 1
    assert await count(bus.js, names.TASKS_STREAM) == 0
    assert len(stamps["/slow"]) == 2


def outages(log) -> int:
    """Deliveries this worker's log says met an outage (Chromium's ERR_NETWORK_CHANGED beside a
    container test, say): each naked the task, no attempt spent, one more delivery on the count."""
    return log.read_text().count('"task.outage"') if log.exists() else 0


async def kill_a_worker_on_each_delivery(settings, tmp_path, stamps, round_: int) -> bool:
    """Start a worker for each of the task's two deliveries and SIGKILL it once its request reached
    the site; False (that worker killed too) if one met an outage on the way instead."""
    before = len(stamps.get("/slow", []))
    for delivery in (1, 2):
        log = tmp_path / f"victim{round_}-{delivery}.log"
        victim = start_worker(settings, tmp_path, log.stem)
        try:
            await wait_until(functools.partial(hit_or_outage, stamps, before + delivery, log), 60)
        finally:
            kill9(victim)
        if outages(log):
            return False
    return True


async def hit_or_outage(stamps, n: int, log) -> bool:
    return len(stamps.get("/slow", [])) >= n or outages(log) > 0


async def test_a_worker_killed_on_the_last_delivery_is_reaped_into_deadletter(
        bus, fast_redelivery, site, stamps, tmp_path):
    # Both deliveries (max_deliver 2: no room here for deliveries that do not reach the page) must
    # reach the page and die with their worker. A container test on this host can change its
    # network under a delivery: Chromium drops the request (ERR_NETWORK_CHANGED), the worker naks it
    # as an outage, as it should, and that spends one of the two. Such a round is dropped (its task
    # purged before its next delivery) and run again with a task of its own.
    dropped: set[str] = set()
    for round_ in range(3):
        task = await enqueue(bus.js, site.url(f"/slow?s=60&round={round_}"))
        if await kill_a_worker_on_each_delivery(fast_redelivery, tmp_path, stamps, round_):
            break
        await bus.js.purge_stream(names.TASKS_STREAM)
        dropped.add(task.task_id)  # (its last delivery may have been reaped already)
    else:
        pytest.fail("each of three rounds met an outage (tmp_path's victim*.log say which)")
    reaper_host = await run_worker(bus, fast_redelivery, exit_when_idle=8)
    [letter] = [d for d in await dead_letters(bus.js) if d.task_id not in dropped]
    assert letter.stage == "reaper" and letter.task_id == task.task_id and letter.task == task
    assert letter.reason == "max_deliveries"
    assert "2 deliveries, 2 of them reached the page; 2 ended without an outcome (the worker died" in letter.error
    assert await count(bus.js, names.TASKS_STREAM) == 0
    assert await results(bus.js) == []
    assert reaper_host.counters.get("completed", 0) == 0


async def test_a_poison_task_whose_deliveries_all_died_is_reaped_as_poison(bus, fast_redelivery, tmp_path):
    # Each delivery taken and never answered (its worker died before it could even file the
    # letter): the reaper, not the worker, files it, with the decode reason, not max_deliveries.
    ack = await bus.js.publish(names.task_subject("poison"), b"\x00not json", stream=names.TASKS_STREAM)
    sub = await bus.js.pull_subscribe_bind(names.WORKERS_CONSUMER, names.TASKS_STREAM)
    for delivery in (1, 2):  # max_deliver is 2; the second comes back after ack_wait (3 s)
        [msg] = await sub.fetch(1, timeout=30)
        assert msg.metadata.num_delivered == delivery
    await sub.unsubscribe()
    await run_worker(bus, fast_redelivery, exit_when_idle=8)
    [letter] = await dead_letters(bus.js)
    assert (letter.stage, letter.reason, letter.task_id) == ("reaper", "not_json", None)
    assert (letter.source.stream, letter.source.seq) == (names.TASKS_STREAM, ack.seq)
    assert letter.payload.startswith("\x00not json")
    assert await count(bus.js, names.TASKS_STREAM) == 0


async def kill9_at(settings, tmp_path, nats_server, point) -> None:
    """Run a worker process whose NATS traffic goes through a relay; SIGKILL it at the first
    publish ``point`` picks, before that publish reaches the server."""
    async with Relay(nats_server.port) as relay:
        relay.hold = point
        env = env_for(settings, BUSSCRAPE_NATS__URL=relay.url, BUSSCRAPE_WORKER__CONCURRENCY="1")
        victim = spawn(["worker"], env, tmp_path / "victim.log")
        try:
            await asyncio.wait_for(relay.held.wait(), 90)
        finally:
            kill9(victim)
        assert victim.returncode == -signal.SIGKILL


async def test_sigkill_between_the_results_puback_and_the_tasks_ack_leaves_one_result(
        wbus, short_ack, site, stamps, tmp_path, nats_server):
    await enqueue(wbus.js, site.url("/static"))
    await kill9_at(short_ack, tmp_path, nats_server, task_ack)
    await after_a_death_before_the_ack(wbus, short_ack)


async def test_sigkill_after_storing_the_artifacts_before_the_result_leaves_them_to_the_retry(
        wbus, short_ack, site, stamps, tmp_path, nats_server):
    task = await enqueue(wbus.js, site.url("/static"), **LEFTOVER_OPTIONS)
    await kill9_at(short_ack, tmp_path, nats_server, result_publish)
    await after_a_death_after_storing(wbus, short_ack, task)


async def test_sigterm_lets_the_task_in_flight_finish(bus, fast_redelivery_with_room, site, stamps, tmp_path):
    await enqueue(bus.js, site.url("/slow?s=2"))
    worker = start_worker(fast_redelivery_with_room, tmp_path, "graceful")
    await wait_for_hit(stamps, "/slow", 1)
    worker.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(worker.wait, 60) == 0
    [result] = await results(bus.js)
    assert result.attempt == 1
    assert await count(bus.js, names.TASKS_STREAM) == 0
    assert leftover_chromium(tmp_path / "graceful.log") == []
    log = (tmp_path / "graceful.log").read_text()
    assert '"worker.stopped"' in log and '"completed": 1' in log


@pytest.fixture
async def slow_redelivery(bus, wsettings):
    """Streams with a 10-minute ack_wait: a task back within the test came back by a nak, not by
    the ack_wait running out (however long the worker took to shut down)."""
    s = wsettings.with_overrides(streams={"worker_ack_wait": "10m", "worker_max_deliver": 3})
    await provision.apply(bus.js, topology.load(s))
    return s


async def handed_back(js) -> int:
    """The delivery count of the task, fetched at once (it must be available now)."""
    sub = await js.pull_subscribe_bind(names.WORKERS_CONSUMER, names.TASKS_STREAM)
    [msg] = await sub.fetch(1, timeout=10)
    await msg.nak()
    return msg.metadata.num_delivered


async def test_sigterm_past_the_grace_period_hands_the_task_back_at_once(bus, slow_redelivery, site, stamps,
                                                                         tmp_path):
    await enqueue(bus.js, site.url("/slow?s=60"))
    env = env_for(slow_redelivery, BUSSCRAPE_WORKER__GRACE_PERIOD="1s")
    worker = spawn(["worker"], env, tmp_path / "impatient.log")
    await wait_for_hit(stamps, "/slow", 1)
    worker.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(worker.wait, 30) == 0
    assert leftover_chromium(tmp_path / "impatient.log") == []
    # nak'ed: the 10-minute ack_wait cannot have run out
    assert await handed_back(bus.js) == 2 + outages(tmp_path / "impatient.log")


async def test_a_second_signal_stops_at_once_and_hands_the_task_back(bus, slow_redelivery, site, stamps, tmp_path):
    await enqueue(bus.js, site.url("/slow?s=60"))
    worker = start_worker(slow_redelivery, tmp_path, "twice")  # grace period 30s: only the second signal ends it
    await wait_for_hit(stamps, "/slow", 1)
    worker.send_signal(signal.SIGTERM)
    await wait_until(lambda: logged(tmp_path / "twice.log", '"worker.stopping"'), timeout=30)
    worker.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(worker.wait, 20) == 0
    assert leftover_chromium(tmp_path / "twice.log") == []
    assert '"worker.stopping_now"' in (tmp_path / "twice.log").read_text()
    assert await handed_back(bus.js) == 2 + outages(tmp_path / "twice.log")  # handed back at once: delivered again


async def logged(log, event: str) -> bool:
    return log.exists() and event in log.read_text()


async def test_a_crashed_browser_is_relaunched_and_the_task_retried(bus, wsettings, site, stamps):
    await provision.apply(bus.js, topology.load(wsettings))
    await enqueue(bus.js, site.url("/slow?s=2"))
    from busscrape.worker.daemon import Worker

    async with Worker(bus, wsettings) as worker:
        runner = asyncio.create_task(worker.run())
        await wait_for_hit(stamps, "/slow", 1)
        for pid in worker.pool.pids()[:1]:  # the browser process itself
            os.kill(pid, signal.SIGKILL)
        await asyncio.wait_for(runner, 60)
    [result] = await results(bus.js)
    assert result.attempt == 2 and worker.pool.restarts == 1
    assert worker.counters["retried"] == 1


async def test_the_browser_is_recycled_after_n_tasks(bus, wsettings, site, stamps):
    """A new Chromium process every two tasks, the old one gone before the new one starts."""
    from busscrape.worker.daemon import Worker

    await provision.apply(bus.js, topology.load(wsettings))
    for i in range(5):
        await enqueue(bus.js, site.url(f"/static?i={i}"))
    async with Worker(bus, wsettings.with_overrides(worker={"recycle_after_tasks": 2, "concurrency": 1})) as worker:
        pool, launch = worker.pool, worker.pool._launch
        browsers = [pool.pids()[0]]  # the browser process itself comes first
        old_alive = []

        async def recorded_launch():
            old_alive.append(running(browsers[-1]))  # a zombie has exited: only its reaping is left
            await launch()
            browsers.append(pool.pids()[0])

        pool._launch = recorded_launch
        await worker.run()
    assert len(await results(bus.js)) == 5
    assert len(set(browsers)) == 3 and old_alive == [False, False]  # after tasks 2 and 4
