"""Leases on HOSTS keys against a real nats-server: a lease names its holder, a renewal whose
reply was lost leaves the lease this holder's (and its release frees the key at once), and a
holder that lost its lease stops the work it guards and never deletes the new holder's key."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest

from busscrape.bus import names, provision, topology
from busscrape.worker.leases import Lease, LeaseLost, take
from tests.support.bus import wait_until


@pytest.fixture
async def hosts(bus, settings):
    await provision.apply(bus.js, topology.load(settings.with_overrides(streams={"host_lease_ttl": "3s"})))
    return await bus.js.key_value(names.HOSTS_BUCKET)


async def test_a_lease_names_its_holder_and_this_take(hosts):
    one, two = await take(hosts, "slot.a.0", b"w1"), await take(hosts, "slot.b.0", b"w1")
    assert one is not None and two is not None
    assert one[1].startswith(b"w1 ") and two[1].startswith(b"w1 ") and one[1] != two[1]
    assert (await hosts.get("slot.a.0")).value == one[1]
    assert await take(hosts, "slot.a.0", b"w2") is None


async def test_a_renewal_applied_whose_reply_was_lost_keeps_the_lease_and_its_release_frees_the_key(hosts):
    taken = await take(hosts, "slot.lost-reply.0", b"w1")
    assert taken is not None
    lease = Lease(hosts, "slot.lost-reply.0", *taken, ttl=0.6)
    update, replies_lost = hosts.update, []

    async def applied_then_timed_out(*args, **kwargs):
        revision = await update(*args, **kwargs)  # the server applied it...
        if not replies_lost:
            replies_lost.append(revision)
            raise nats.errors.TimeoutError  # ...and its reply never came
        return revision

    hosts.update = applied_then_timed_out
    try:
        await wait_until(lambda: _renewed_after(lease, hosts, replies_lost), timeout=15, every=0.05)
    finally:
        hosts.update = update
    assert not lease.lost.is_set()
    lease.check()
    await lease.release()
    # Freed at once, not at the end of the bucket's TTL: another worker takes the slot now.
    assert await take(hosts, "slot.lost-reply.0", b"w2") is not None


async def _renewed_after(lease, hosts, replies_lost) -> bool:
    return bool(replies_lost) and lease.revision > replies_lost[0] and \
        (await hosts.get(lease.key)).revision == lease.revision


async def test_a_holder_that_lost_its_lease_stops_the_work_it_guards_and_leaves_the_new_holders_key(hosts):
    taken = await take(hosts, "login.s1", b"w1")
    assert taken is not None
    lease = Lease(hosts, "login.s1", *taken, ttl=0.6)
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def login() -> str:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "logged in"

    guarded = asyncio.create_task(lease.guard(login()))
    await started.wait()
    # Expired while this worker could not reach NATS, and taken by another worker.
    await hosts.delete("login.s1")
    thief = await take(hosts, "login.s1", b"w2")
    assert thief is not None
    with pytest.raises(LeaseLost):
        await asyncio.wait_for(guarded, 30)
    assert cancelled.is_set()
    with pytest.raises(LeaseLost):
        lease.check()  # no later work starts either
    await lease.release()
    assert (await hosts.get("login.s1")).value == thief[1]  # the new holder's key stays


async def test_an_ingesters_folder_lease_outlives_a_renewal_whose_reply_was_lost(bus, settings):
    """The same rule for archive folders (ingest.leases, on bus.leases): before, a lost reply
    made the next renewal fail on its revision, the write was abandoned (FolderLost) and the
    folder stayed taken for the TTL."""
    from busscrape.ingest.leases import FolderLeases

    await provision.apply(bus.js, topology.load(settings.with_overrides(streams={"folder_lease_ttl": "3s"})))
    leases = FolderLeases(bus.js, "ingester-1")
    kv = await bus.js.key_value(names.FOLDERS_BUCKET)
    async with leases.hold("dt=2026-12-03/host=a.example/t1") as lease:
        lease.ttl = 0.6  # renew often: the test need not wait a whole bucket TTL
        update, replies_lost = kv.update, []

        async def applied_then_timed_out(*args, **kwargs):
            revision = await update(*args, **kwargs)
            if not replies_lost:
                replies_lost.append(revision)
                raise nats.errors.TimeoutError
            return revision

        lease._kv.update = applied_then_timed_out
        try:
            await wait_until(lambda: _renewed_after(lease, kv, replies_lost), timeout=15, every=0.05)
        finally:
            lease._kv.update = update
        lease.check()  # still this ingester's: the write may commit
        assert (await kv.get(lease.key)).value.startswith(b"ingester-1 ")
    assert await take(kv, lease.key, b"ingester-2") is not None  # freed at once


async def test_a_release_that_lands_as_a_renewals_reply_arrives_stops_the_renewals(hosts):
    """The chaos run's stalled host: on Python 3.11 ``asyncio.wait_for`` (nats-py waits for every
    reply with it) swallows a cancel that comes in the loop iteration where the reply lands
    (cpython gh-86296). The release's cancel of the renewals was lost that way: they went on for
    ever, the release waited for them for ever, and the slot stayed held."""
    taken = await take(hosts, "slot.swallowed.0", b"w1")
    assert taken is not None
    lease = Lease(hosts, "slot.swallowed.0", *taken, ttl=0.6)
    loop, update, releasing = asyncio.get_running_loop(), hosts.update, []

    async def applied_and_released_as_its_reply_lands(*args, **kwargs):
        revision = await update(*args, **kwargs)  # the server applied the renewal
        if releasing:
            return revision
        reply = loop.create_future()

        def lands() -> None:  # its reply and the holder's release in one loop iteration
            reply.set_result(revision)
            releasing.append(asyncio.ensure_future(lease.release()))

        loop.call_soon(lands)
        return await asyncio.wait_for(reply, 10)  # as nats-py waits for the reply

    hosts.update = applied_and_released_as_its_reply_lands
    try:
        await wait_until(lambda: asyncio.sleep(0, bool(releasing)), timeout=15, every=0.05)
        # Liveness, not speed: before the fix the release never returned.
        done, _ = await asyncio.wait(releasing, timeout=30)
        assert done, "the release waited for ever for renewals that went on"
    finally:
        hosts.update = update
    # Released for good: no renewal brings the key back, another worker takes the slot.
    await asyncio.sleep(1.5)  # several renewal periods (0.2 s) of the lease
    assert await take(hosts, "slot.swallowed.0", b"w2") is not None
