"""What a worker does with a task's extractor, on real Chromium and a real nats-server: the
outcomes docs/extraction.md promises at the worker (an extractor it does not have, a record over the bound),
each dead-lettered at once under its own reason."""

from __future__ import annotations

import pytest

from busscrape.bus import provision, topology
from busscrape.model.messages import TaskOptions
from busscrape.worker.daemon import Worker
from tests.support.bus import dead_letters, enqueue, results

pytestmark = pytest.mark.browser

PICK = 'version = 1\n[fields.text]\ncss = "p.pick"\nrequired = true\n'


@pytest.fixture
def xsettings(wsettings, tmp_path):
    folder = tmp_path / "extractors"
    folder.mkdir()
    (folder / "pick.toml").write_text(PICK)
    return wsettings.with_overrides(extract={"dir": str(folder), "max_record_bytes": "1KiB"})


async def test_an_unknown_extractor_and_a_record_too_large_are_dead_lettered_at_once(bus, xsettings, site):
    site.page("/small", "<title>small</title><p class=pick>fits</p>")
    site.page("/big", "<title>big</title><p class=pick>" + "word " * 600 + "</p>")  # 3 KB of record
    site.page("/other", "<title>other</title><p class=pick>never loaded</p>")
    await provision.apply(bus.js, topology.load(xsettings))
    small = await enqueue(bus.js, site.url("/small"), options=TaskOptions(extractor="pick", artifacts=("html",)))
    big = await enqueue(bus.js, site.url("/big"), options=TaskOptions(extractor="pick", artifacts=("html",)))
    unknown = await enqueue(bus.js, site.url("/other"), options=TaskOptions(extractor="nope", artifacts=("html",)))
    async with Worker(bus, xsettings) as worker:
        await worker.run()
    [result] = await results(bus.js)
    assert result.task_id == small.task_id and result.extraction.record == {"text": "fits"}
    letters = {d.task_id: d for d in await dead_letters(bus.js)}
    assert set(letters) == {big.task_id, unknown.task_id}
    too_large, nope = letters[big.task_id], letters[unknown.task_id]
    assert too_large.reason == "record_too_large" and "extract.max_record_bytes" in too_large.error
    # The worker lists what it has: the folder's extractor and the bundled one (#36.7).
    assert nope.reason == "unknown_extractor" and "'nope'" in nope.error
    assert "(it has: demo-product, pick)" in nope.error
    assert [a.retryable for a in too_large.attempts] == [False] and [a.retryable for a in nope.attempts] == [False]
    assert site.hits[(site.hosts[0], "/big")] == 1  # rendered once: the same page, the same record
    assert site.hits[(site.hosts[0], "/other")] == 0  # refused before any page was loaded
