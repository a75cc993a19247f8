"""``ops.supervisor``: the local daemons of a run, started and watched."""

from __future__ import annotations

import asyncio

from busscrape.errors import EXIT_PARTIAL
from busscrape.ops.supervisor import Daemons
from tests.conftest import make_settings


async def test_a_daemon_that_cannot_be_started_ends_the_fleet_with_the_reason(tmp_path):
    # The daemons start in a task of their own (a fork waits for the fork server's imports), so a
    # failure there cannot reach the caller as an exception: it is the fleet's fatal end instead,
    # with what went wrong, not a run waiting for a worker that never came.
    settings = make_settings(tmp_path, "nats://127.0.0.1:9")
    log = settings.state_dir / "logs" / "worker-1.log"
    log.mkdir(parents=True)  # its log file cannot be opened
    said: list[tuple[int, str]] = []
    async with Daemons(settings, workers=1, ingesters=0, on_fatal=lambda code, message: said.append((code, message))):
        for _ in range(100):
            if said:
                break
            await asyncio.sleep(0.05)
    assert said == [(EXIT_PARTIAL, f"worker-1 could not be started: [Errno 21] Is a directory: '{log}'")]
