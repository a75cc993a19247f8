"""What earlier attempts of a task stored is discarded by the delivery that settles it, even when
NATS stops answering for a moment (a node of a cluster lost, its groups electing leaders)."""

import asyncio
import os
import signal

from busscrape.artifacts import leftovers
from busscrape.artifacts.files import capture_files
from busscrape.artifacts.store import ArtifactStore, object_name
from busscrape.model.messages import ScrapeTask, task_key


async def test_the_sweep_outwaits_a_server_that_stops_answering_for_a_moment(applied, nats_server):
    url = "http://127.0.0.2/leftover"
    task = ScrapeTask(task_id=task_key(url), url=url, original_url=url)
    store = ArtifactStore(applied.js)
    files = capture_files(task)
    for file in files:  # attempt 1 stored everything, then its worker was killed
        await store.put(object_name(task.task_id, 1, 1, file), b"left by attempt 1", "text/plain", kind="text",
                        file=file)
    os.kill(nats_server.process.pid, signal.SIGSTOP)
    try:
        sweeping = asyncio.create_task(leftovers.sweep(applied.js, store, task, 1, range(1, 2)))
        await asyncio.sleep(12)  # longer than nats.request_timeout (10 s): the first ask goes unanswered
        assert not sweeping.done(), "the sweep gave up while the server was away"
    finally:
        os.kill(nats_server.process.pid, signal.SIGCONT)
    assert await asyncio.wait_for(sweeping, 60) == len(files)
    for file in files:
        assert not await store.delete(object_name(task.task_id, 1, 1, file)), f"{file} is still stored"
